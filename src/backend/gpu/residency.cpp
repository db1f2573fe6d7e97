#include "backend/gpu/residency.h"

#include <string>

#include "backend/gpu/kernels.h"
#include "backend/gpu/weight_layout.h"
#include "util/error.h"

namespace rf::gpu {

DeviceBuffer upload_weight(TensorType type, uint64_t elements, std::span<const uint8_t> bytes, gpuStream_t stream) {
  const TensorTypeInfo& info = tensor_type_info(type);
  const uint64_t blocks = elements / info.block_elements;
  const DeviceLayout layout = device_layout(type, blocks);
  DeviceBuffer device(layout.bytes, "a weight");
  const int scale_offset = split_scale_offset(type);
  if (scale_offset < 0) {
    check(gpuMemcpyAsync(device.data(), bytes.data(), bytes.size(), gpuMemcpyHostToDevice, stream), "uploading a weight");
  } else {
    DeviceBuffer raw(bytes.size(), "a weight's upload staging");
    check(gpuMemcpyAsync(raw.data(), bytes.data(), bytes.size(), gpuMemcpyHostToDevice, stream), "uploading a weight");
    split_block_scales(raw.as<uint8_t>(), static_cast<int64_t>(blocks), static_cast<int>(info.block_bytes),
                       scale_offset, device.as<uint8_t>(), reinterpret_cast<uint16_t*>(device.as<uint8_t>() + layout.scales_offset),
                       stream);
  }
  check(gpuStreamSynchronize(stream), "uploading a weight");
  return device;
}

model::ResidentTensor DeviceResidency::materialize(const model::TensorSource& tensor) {
  if (!has_kernels(tensor.type()))
    fail("tensor '{}' has type {}, which the GPU backend does not compute with", tensor.name(),
         tensor_type_name(tensor.type()));
  std::lock_guard lock(mutex_);
  if (!stream_) stream_ = std::make_unique<Stream>();
  auto buffer = std::make_shared<DeviceBuffer>(
      upload_weight(tensor.type(), tensor.info->elements(), tensor.bytes(), stream_->get()));
  return {buffer->data(), buffer};
}

}  // namespace rf::gpu
