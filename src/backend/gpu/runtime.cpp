#include "backend/gpu/runtime.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "util/error.h"

namespace rf::gpu {

void check(gpuError_t status, const char* what) {
  if (status != gpuSuccess) fail("{}: {}", what, gpuGetErrorString(status));
}

void check_launch(const char* kernel) { check(gpuGetLastError(), kernel); }

void fail_with(const char* message) { fail("{}", message); }

gpuGraphExec_t instantiate_graph(gpuGraph_t graph) {
  gpuGraphExec_t exec = nullptr;
#if defined(ROCMFORGE_GPU_HIP)
  check(hipGraphInstantiate(&exec, graph, nullptr, nullptr, 0), "hipGraphInstantiate");
#else
  check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
#endif
  return exec;
}

bool device_available() {
  int count = 0;
  const bool available = gpuGetDeviceCount(&count) == gpuSuccess && count > 0;
  static_cast<void>(gpuGetLastError());  // a missing driver leaves a sticky error behind; clear it
  return available;
}

DeviceInfo device_info() {
  gpuDeviceProp properties{};
  check(gpuGetDeviceProperties(&properties, 0), "reading the device's properties");
  return {properties.name, properties.multiProcessorCount, properties.warpSize,
          static_cast<uint64_t>(properties.totalGlobalMem), static_cast<uint64_t>(properties.l2CacheSize),
          properties.major * 10 + properties.minor};
}

MemoryInfo memory_info() {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  check(gpuMemGetInfo(&free_bytes, &total_bytes), "reading the device's free memory");
  return {free_bytes, total_bytes};
}

double measure_copy_bandwidth() {
  constexpr size_t kBytes = size_t{1} << 30;
  constexpr int kCopies = 9;
  DeviceBuffer source(kBytes, "the bandwidth probe");
  DeviceBuffer target(kBytes, "the bandwidth probe");
  const Stream stream;
  check(gpuMemsetAsync(source.data(), 1, kBytes, stream.get()), "the bandwidth probe");
  std::vector<float> milliseconds;
  for (int i = 0; i <= kCopies; ++i) {
    const Event start(true);
    const Event stop(true);
    start.record(stream.get());
    check(gpuMemcpyAsync(target.data(), source.data(), kBytes, gpuMemcpyDeviceToDevice, stream.get()),
          "the bandwidth probe");
    stop.record(stream.get());
    stop.synchronize();
    if (i > 0) milliseconds.push_back(stop.milliseconds_since(start));  // the first copy warms up
  }
  std::sort(milliseconds.begin(), milliseconds.end());
  return 2.0 * kBytes / (milliseconds[milliseconds.size() / 2] * 1e-3) * 1e-9;
}

namespace {

void* allocate(Memory memory, size_t bytes, const char* what) {
  void* data = nullptr;
  if (memory == Memory::PinnedHost) {
    check(gpuHostAlloc(&data, bytes, gpuHostAllocMapped), what);
    return data;
  }
  const gpuError_t status = gpuMalloc(&data, bytes);
  if (status != gpuSuccess) {
    static_cast<void>(gpuGetLastError());
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    static_cast<void>(gpuMemGetInfo(&free_bytes, &total_bytes));
    fail("cannot allocate {:.1f} MiB of device memory for {} ({:.1f} of {:.1f} MiB free): {}", bytes / 1048576.0,
         what, free_bytes / 1048576.0, total_bytes / 1048576.0, gpuGetErrorString(status));
  }
  return data;
}

void release(Memory memory, void* data) {
  static_cast<void>(memory == Memory::PinnedHost ? gpuFreeHost(data) : gpuFree(data));
}

}  // namespace

template <Memory kMemory>
Buffer<kMemory>::Buffer(size_t bytes, const char* what)
    : data_(bytes > 0 ? allocate(kMemory, bytes, what) : nullptr), bytes_(bytes) {}

template <Memory kMemory>
Buffer<kMemory>::~Buffer() {
  if (data_) release(kMemory, data_);
}

template class Buffer<Memory::Device>;
template class Buffer<Memory::PinnedHost>;

Stream::Stream() { check(gpuStreamCreateWithFlags(&stream_, gpuStreamNonBlocking), "creating a stream"); }

Stream::~Stream() { static_cast<void>(gpuStreamDestroy(stream_)); }

void Stream::synchronize() const { check(gpuStreamSynchronize(stream_), "waiting for the GPU"); }

Event::Event(bool timing) {
  check(gpuEventCreateWithFlags(&event_, timing ? gpuEventDefault : gpuEventDisableTiming), "creating an event");
}

Event::~Event() { static_cast<void>(gpuEventDestroy(event_)); }

void Event::record(gpuStream_t stream) const { check(gpuEventRecord(event_, stream), "recording an event"); }

void Event::synchronize() const { check(gpuEventSynchronize(event_), "waiting for an event"); }

bool Event::done() const {
  const gpuError_t status = gpuEventQuery(event_);
  if (status == gpuErrorNotReady) return false;
  check(status, "querying an event");
  return true;
}

float Event::milliseconds_since(const Event& start) const {
  float ms = 0.0f;
  check(gpuEventElapsedTime(&ms, start.event_, event_), "timing events");
  return ms;
}

Graph::~Graph() { reset(); }

void Graph::reset() {
  if (exec_) static_cast<void>(gpuGraphExecDestroy(exec_));
  if (graph_) static_cast<void>(gpuGraphDestroy(graph_));
  exec_ = nullptr;
  graph_ = nullptr;
}

void Graph::capture(gpuStream_t stream, const std::function<void()>& record) {
  reset();
  check(gpuStreamBeginCapture(stream, gpuStreamCaptureModeThreadLocal), "starting a graph capture");
  try {
    record();
  } catch (...) {
    gpuGraph_t abandoned = nullptr;
    if (gpuStreamEndCapture(stream, &abandoned) == gpuSuccess && abandoned) static_cast<void>(gpuGraphDestroy(abandoned));
    static_cast<void>(gpuGetLastError());
    throw;
  }
  check(gpuStreamEndCapture(stream, &graph_), "ending a graph capture");
  exec_ = instantiate_graph(graph_);
}

void Graph::launch(gpuStream_t stream) const { check(gpuGraphLaunch(exec_, stream), "launching a graph"); }

}  // namespace rf::gpu
