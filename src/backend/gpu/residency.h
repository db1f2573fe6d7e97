// The GPU's residency: each weight is copied to device memory once, the first time it is used (or when a plan
// preloads it), in its stored type and in the device layout of weight_layout.h; nothing is dequantized.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>

#include "backend/gpu/runtime.h"
#include "gguf/tensor_type.h"
#include "model/lazy_tensor.h"

namespace rf::gpu {

// Copies the blocks of `elements` values of `type` (as a GGUF file stores them) to new device memory in the
// device layout, and waits until they are there.
DeviceBuffer upload_weight(TensorType type, uint64_t elements, std::span<const uint8_t> bytes, gpuStream_t stream);

class DeviceResidency final : public model::Residency {
 public:
  // Checks that the GPU kernels read the tensor's type (an rf::Error naming the tensor otherwise), then
  // uploads it. Uploads run one at a time on the residency's own stream.
  model::ResidentTensor materialize(const model::TensorSource& tensor) override;

 private:
  std::mutex mutex_;
  std::unique_ptr<Stream> stream_;  // created with the first upload, so that constructing needs no device
};

}  // namespace rf::gpu
