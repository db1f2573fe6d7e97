// The GPU's residency: every weight is copied to device memory once, in its stored type and in the device
// layout of weight_layout.h; nothing is dequantized. A background streamer (loader::StreamingLoader feeding a
// StreamingUpload) uploads the weights in execution order as soon as the forward pass has checked that they
// fit; a weight asked for before it has arrived moves its layer to the front and waits for that layer only.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "backend/gpu/runtime.h"
#include "gguf/tensor_type.h"
#include "loader/streaming_loader.h"
#include "loader/tensor_groups.h"
#include "model/lazy_tensor.h"

namespace rf::gpu {

// Copies the blocks of `elements` values of `type` (as a GGUF file stores them) to new device memory in the
// device layout, and waits until they are there. For one matrix at a time (kernel tests); models stream.
DeviceBuffer upload_weight(TensorType type, uint64_t elements, std::span<const uint8_t> bytes, gpuStream_t stream);

// The device memory a model takes, by use: what a refusal names.
struct DeviceMemoryNeed {
  uint64_t weights = 0;      // in the device layout, not yet allocated
  uint64_t kv_cache = 0;
  int64_t context = 0;       // positions the KV cache holds
  uint64_t activations = 0;  // activations and scratch of the forward pass
  uint64_t total() const { return weights + kv_cache + activations; }
};
// Throws an rf::Error naming every part of `need` and the available memory when `need` exceeds `available`
// bytes.
void require_fits(const DeviceMemoryNeed& need, uint64_t available);

class DeviceResidency final : public model::Residency {
 public:
  // Holds the weights of layers first_layer.. and the output (the layers before run elsewhere: the CPU).
  DeviceResidency(loader::StreamingOptions options, int64_t first_layer);
  ~DeviceResidency() override;

  // Remembers the plan's file and the weights it holds in execution order (loader::execution_order_groups). A
  // residency serves one plan.
  void bind(const model::ExecutionPlan& plan) override;
  // Checks that the GPU kernels read the tensor's type (an rf::Error naming the tensor otherwise), then waits
  // until the tensor's layer is on the device, moving it to the front of the stream. Starts the stream
  // (checking that the weights alone fit) when no forward pass has started it.
  model::ResidentTensor materialize(const model::TensorSource& tensor) override;
  bool is_resident(const model::TensorSource& tensor) const override;
  // Bytes and tensors uploaded, the wall time and the loader's phases.
  void report(model::LoadingStats& stats) const override;

  int64_t first_layer() const { return first_layer_; }
  // Device memory the weights will take when streaming starts: all of it before, none after.
  uint64_t unallocated_bytes() const;
  // Starts uploading its weights in execution order, once; returns at once. The caller checked the fit.
  void start_streaming();

 private:
  struct Streaming;
  Streaming& started();
  void start_locked();

  const loader::StreamingOptions options_;
  const int64_t first_layer_;
  std::shared_ptr<const gguf::File> file_;
  std::vector<loader::TensorGroup> groups_;
  mutable std::mutex mutex_;  // guards the start; what streaming_ points to is safe to share
  std::unique_ptr<Streaming> streaming_;
};

}  // namespace rf::gpu
