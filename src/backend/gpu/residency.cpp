#include "backend/gpu/residency.h"

#include <algorithm>
#include <string>
#include <thread>

#include "backend/gpu/kernels.h"
#include "backend/gpu/streaming_upload.h"
#include "backend/gpu/weight_layout.h"
#include "model/execution_plan.h"
#include "util/error.h"

namespace rf::gpu {
namespace {

double gib(uint64_t bytes) { return static_cast<double>(bytes) / double(uint64_t{1} << 30); }

}  // namespace

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

void require_fits(const DeviceMemoryNeed& need, uint64_t available) {
  if (need.total() <= available) return;
  fail("the model does not fit in device memory: {:.2f} GiB of weights + {:.2f} GiB of KV cache ({} positions) + "
       "{:.2f} GiB of activations = {:.2f} GiB, but {:.2f} GiB are available (a smaller --ctx shrinks the KV cache; "
       "--gpu-layers N runs only the last N layers on the GPU, the others on the CPU)",
       gib(need.weights), gib(need.kv_cache), need.context, gib(need.activations), gib(need.total()), gib(available));
}

// The upload and the loader feeding it; the loader goes first, as StreamingUpload requires.
struct DeviceResidency::Streaming {
  StreamingUpload upload;
  loader::StreamingLoader loader;

  Streaming(const std::shared_ptr<const gguf::File>& file, const std::vector<loader::TensorGroup>& groups,
            const loader::StreamingOptions& options)
      : upload(groups), loader(file, groups, upload, options) {}
};

DeviceResidency::DeviceResidency(loader::StreamingOptions options, int64_t first_layer)
    : options_(std::move(options)), first_layer_(first_layer) {}

DeviceResidency::~DeviceResidency() = default;

void DeviceResidency::bind(const model::ExecutionPlan& plan) {
  std::lock_guard lock(mutex_);
  if (file_) fail("a GPU residency serves one plan; build each plan with its own gpu::make_residency()");
  file_ = plan.file_handle();
  groups_ = loader::execution_order_groups(plan, first_layer_);
}

uint64_t DeviceResidency::unallocated_bytes() const {
  std::lock_guard lock(mutex_);
  if (!file_) fail("the GPU residency is bound to no plan");
  return streaming_ ? 0 : device_weight_bytes(groups_);
}

void DeviceResidency::start_streaming() {
  std::lock_guard lock(mutex_);
  if (!streaming_) start_locked();
}

void DeviceResidency::start_locked() {
  if (!file_) fail("the GPU residency is bound to no plan");
  streaming_ = std::make_unique<Streaming>(file_, groups_, options_);
}

DeviceResidency::Streaming& DeviceResidency::started() {
  std::lock_guard lock(mutex_);
  if (!streaming_) {
    if (!file_) fail("the GPU residency is bound to no plan");
    require_fits({.weights = device_weight_bytes(groups_)}, memory_info().free_bytes);
    start_locked();
  }
  return *streaming_;
}

model::ResidentTensor DeviceResidency::materialize(const model::TensorSource& tensor) {
  if (!has_kernels(tensor.type()))
    fail("tensor '{}' has type {}, which the GPU backend does not compute with", tensor.name(),
         tensor_type_name(tensor.type()));
  Streaming& streaming = started();
  const size_t group = streaming.loader.group_of(*tensor.info);
  streaming.loader.request(group);
  streaming.upload.wait_group(group);
  // The arena belongs to this residency, which every LazyTensor of the plan holds: no storage of its own.
  return {streaming.upload.device_data(*tensor.info), nullptr};
}

bool DeviceResidency::is_resident(const model::TensorSource& tensor) const {
  std::lock_guard lock(mutex_);
  if (!streaming_) return false;
  const size_t group = streaming_->loader.group_of(*tensor.info);
  return streaming_->loader.is_loaded(group) && streaming_->upload.group_arrived(group);
}

void DeviceResidency::report(model::LoadingStats& stats) const {
  std::lock_guard lock(mutex_);
  if (!streaming_) return;
  const loader::StreamingStats loaded = streaming_->loader.stats();
  stats.bytes = loaded.bytes;
  stats.tensors = loaded.tensors;
  stats.wall_seconds = loaded.wall_seconds;
  stats.first_group_seconds = loaded.first_group_seconds;
  stats.phases = {{"pinned staging allocation", loaded.staging_seconds},
                  {"read", loaded.read_seconds},
                  {"readers waiting for a buffer", loaded.reader_idle_seconds},
                  {"readers waiting for copies", loaded.reuse_wait_seconds},
                  {"enqueueing copies", loaded.consume_seconds},
                  {"copier waiting for reads", loaded.consumer_idle_seconds}};
}

}  // namespace rf::gpu
