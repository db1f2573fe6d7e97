// One spelling of the GPU runtime API for CUDA and HIP. Host code of the GPU backend calls gpu* names, which
// map to cuda* or hip* here (the build defines ROCMFORGE_GPU_HIP or ROCMFORGE_GPU_CUDA), plus small owners for
// device memory, pinned memory, streams and events that free what they hold. Nothing here is device code:
// kernels include device.cuh.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#if defined(ROCMFORGE_GPU_HIP)
#include <hip/hip_runtime_api.h>
#define gpuError_t hipError_t
#define gpuSuccess hipSuccess
#define gpuGetErrorString hipGetErrorString
#define gpuGetLastError hipGetLastError
#define gpuGetDeviceCount hipGetDeviceCount
#define gpuDeviceProp hipDeviceProp_t
#define gpuGetDeviceProperties hipGetDeviceProperties
#define gpuMemGetInfo hipMemGetInfo
#define gpuDeviceSynchronize hipDeviceSynchronize
#define gpuMalloc hipMalloc
#define gpuFree hipFree
#define gpuHostAlloc hipHostMalloc
#define gpuHostAllocMapped hipHostMallocMapped
#define gpuFreeHost hipHostFree
#define gpuMemcpy hipMemcpy
#define gpuMemcpyAsync hipMemcpyAsync
#define gpuMemsetAsync hipMemsetAsync
#define gpuMemcpyHostToDevice hipMemcpyHostToDevice
#define gpuMemcpyDeviceToHost hipMemcpyDeviceToHost
#define gpuMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define gpuStream_t hipStream_t
#define gpuStreamCreateWithFlags hipStreamCreateWithFlags
#define gpuStreamNonBlocking hipStreamNonBlocking
#define gpuStreamDestroy hipStreamDestroy
#define gpuStreamSynchronize hipStreamSynchronize
#define gpuStreamWaitEvent hipStreamWaitEvent
#define gpuEvent_t hipEvent_t
#define gpuEventCreateWithFlags hipEventCreateWithFlags
#define gpuEventDefault hipEventDefault
#define gpuEventDisableTiming hipEventDisableTiming
#define gpuEventRecord hipEventRecord
#define gpuEventSynchronize hipEventSynchronize
#define gpuEventQuery hipEventQuery
#define gpuErrorNotReady hipErrorNotReady
#define gpuEventElapsedTime hipEventElapsedTime
#define gpuEventDestroy hipEventDestroy
#define gpuGraph_t hipGraph_t
#define gpuGraphExec_t hipGraphExec_t
#define gpuStreamBeginCapture hipStreamBeginCapture
#define gpuStreamCaptureModeThreadLocal hipStreamCaptureModeThreadLocal
#define gpuStreamEndCapture hipStreamEndCapture
#define gpuGraphLaunch hipGraphLaunch
#define gpuGraphDestroy hipGraphDestroy
#define gpuGraphExecDestroy hipGraphExecDestroy
#else
#include <cuda_runtime_api.h>
#define gpuError_t cudaError_t
#define gpuSuccess cudaSuccess
#define gpuGetErrorString cudaGetErrorString
#define gpuGetLastError cudaGetLastError
#define gpuGetDeviceCount cudaGetDeviceCount
#define gpuDeviceProp cudaDeviceProp
#define gpuGetDeviceProperties cudaGetDeviceProperties
#define gpuMemGetInfo cudaMemGetInfo
#define gpuDeviceSynchronize cudaDeviceSynchronize
#define gpuMalloc cudaMalloc
#define gpuFree cudaFree
#define gpuHostAlloc cudaHostAlloc
#define gpuHostAllocMapped cudaHostAllocMapped
#define gpuFreeHost cudaFreeHost
#define gpuMemcpy cudaMemcpy
#define gpuMemcpyAsync cudaMemcpyAsync
#define gpuMemsetAsync cudaMemsetAsync
#define gpuMemcpyHostToDevice cudaMemcpyHostToDevice
#define gpuMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define gpuMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define gpuStream_t cudaStream_t
#define gpuStreamCreateWithFlags cudaStreamCreateWithFlags
#define gpuStreamNonBlocking cudaStreamNonBlocking
#define gpuStreamDestroy cudaStreamDestroy
#define gpuStreamSynchronize cudaStreamSynchronize
#define gpuStreamWaitEvent cudaStreamWaitEvent
#define gpuEvent_t cudaEvent_t
#define gpuEventCreateWithFlags cudaEventCreateWithFlags
#define gpuEventDefault cudaEventDefault
#define gpuEventDisableTiming cudaEventDisableTiming
#define gpuEventRecord cudaEventRecord
#define gpuEventSynchronize cudaEventSynchronize
#define gpuEventQuery cudaEventQuery
#define gpuErrorNotReady cudaErrorNotReady
#define gpuEventElapsedTime cudaEventElapsedTime
#define gpuEventDestroy cudaEventDestroy
#define gpuGraph_t cudaGraph_t
#define gpuGraphExec_t cudaGraphExec_t
#define gpuStreamBeginCapture cudaStreamBeginCapture
#define gpuStreamCaptureModeThreadLocal cudaStreamCaptureModeThreadLocal
#define gpuStreamEndCapture cudaStreamEndCapture
#define gpuGraphLaunch cudaGraphLaunch
#define gpuGraphDestroy cudaGraphDestroy
#define gpuGraphExecDestroy cudaGraphExecDestroy
#endif

namespace rf::gpu {

// Throws an rf::Error "`what`: <runtime's message>" unless status is gpuSuccess.
void check(gpuError_t status, const char* what);
// After a kernel launch: a bad configuration is reported by the runtime's last error.
void check_launch(const char* kernel);
// Throws an rf::Error with `message`; for the kernel files, which keep fmt out of device compilation.
[[noreturn]] void fail_with(const char* message);
// The graph API differs between the runtimes in its instantiate call.
gpuGraphExec_t instantiate_graph(gpuGraph_t graph);

// Whether a usable GPU is present: false without a driver or a device, so tests and tools can skip.
bool device_available();

struct DeviceInfo {
  std::string name;
  int multiprocessors = 0;
  int warp_size = 0;
  uint64_t memory_bytes = 0;
  uint64_t l2_bytes = 0;
  int compute_capability = 0;  // major * 10 + minor (NVIDIA; AMD reports its own numbering)
};
// The current device (device 0 unless the caller selected another).
DeviceInfo device_info();

struct MemoryInfo {
  uint64_t free_bytes = 0;
  uint64_t total_bytes = 0;
};
// Device memory of the current device: what is free for new allocations now, and all of it.
MemoryInfo memory_info();

// Device-to-device copy bandwidth in GB/s (bytes read plus bytes written per second), the median of several
// copies of 1 GiB: the practical bound of a pass that streams weights.
double measure_copy_bandwidth();

enum class Memory {
  Device,      // device memory
  PinnedHost,  // page-locked host memory: copies from and to it run as asynchronous DMA, and kernels reach it
               // through the same pointer
};

// `bytes` of memory of kind kMemory, freed on destruction; allocation failure is an rf::Error naming `what`.
template <Memory kMemory>
class Buffer {
 public:
  Buffer() = default;
  Buffer(size_t bytes, const char* what);
  ~Buffer();
  Buffer(Buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  Buffer& operator=(Buffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }
  // Makes room for at least `bytes`: where this buffer is smaller, a new, uninitialized one of at least twice its
  // size, so that a size that creeps up reallocates rarely. Returns whether it reallocated.
  bool reserve(size_t bytes, const char* what) {
    if (bytes_ >= bytes) return false;
    *this = Buffer(std::max(bytes, 2 * bytes_), what);
    return true;
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};
extern template class Buffer<Memory::Device>;
extern template class Buffer<Memory::PinnedHost>;
using DeviceBuffer = Buffer<Memory::Device>;
using PinnedBuffer = Buffer<Memory::PinnedHost>;

// A non-blocking stream (it does not synchronize with the legacy default stream).
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  gpuStream_t get() const { return stream_; }
  void synchronize() const;

 private:
  gpuStream_t stream_ = nullptr;
};

class Event {
 public:
  explicit Event(bool timing = false);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  gpuEvent_t get() const { return event_; }
  void record(gpuStream_t stream) const;
  void synchronize() const;
  // Whether the work before the last record() is done (true for an event never recorded); does not block.
  bool done() const;
  // Milliseconds from `start` to this event; both must have been recorded with timing enabled.
  float milliseconds_since(const Event& start) const;

 private:
  gpuEvent_t event_ = nullptr;
};

// A captured graph, instantiated once and replayed.
class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  bool ready() const { return exec_ != nullptr; }
  // Captures everything `record` enqueues on `stream` (which it must not synchronize) into this graph; when
  // `record` throws, the capture is abandoned and the graph stays empty.
  void capture(gpuStream_t stream, const std::function<void()>& record);
  void launch(gpuStream_t stream) const;

 private:
  void reset();
  gpuGraph_t graph_ = nullptr;
  gpuGraphExec_t exec_ = nullptr;
};

}  // namespace rf::gpu
