#include "backend/gpu/streaming_upload.h"

#include <unordered_set>

#include "backend/gpu/kernels.h"
#include "backend/gpu/weight_layout.h"
#include "util/error.h"

namespace rf::gpu {
namespace {

// Tensors start at this alignment in the arena, as cudaMalloc would place them.
constexpr uint64_t kTensorAlignment = 256;

// The tensor's extent in the arena: its device layout, rounded up to the next tensor's alignment.
uint64_t arena_extent(const gguf::TensorInfo& tensor) {
  const uint64_t bytes = split_scale_offset(tensor.type()) < 0
                             ? tensor.bytes
                             : device_layout(tensor.type(), tensor.bytes / tensor.type_info->block_bytes).bytes;
  return (bytes + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
}

// Calls fn(tensor) for each tensor of `groups`, once, in order.
template <typename Fn>
void for_each_tensor(const std::vector<loader::TensorGroup>& groups, const Fn& fn) {
  std::unordered_set<const gguf::TensorInfo*> seen;
  for (const loader::TensorGroup& group : groups)
    for (const gguf::TensorInfo* tensor : group.tensors)
      if (seen.insert(tensor).second) fn(*tensor);
}

}  // namespace

uint64_t device_weight_bytes(const std::vector<loader::TensorGroup>& groups) {
  uint64_t bytes = 0;
  for_each_tensor(groups, [&](const gguf::TensorInfo& tensor) { bytes += arena_extent(tensor); });
  return bytes;
}

StreamingUpload::Staging::Staging(size_t bytes)
    : host(bytes, "a pinned staging buffer"), device(bytes, "a device staging buffer") {}

StreamingUpload::StreamingUpload(const std::vector<loader::TensorGroup>& groups) {
  for_each_tensor(groups, [&](const gguf::TensorInfo& tensor) {
    offsets_.emplace(&tensor, arena_bytes_);
    arena_bytes_ += arena_extent(tensor);
  });
  for (size_t g = 0; g < groups.size(); ++g) group_ready_.push_back(std::make_unique<Event>());
}

StreamingUpload::~StreamingUpload() {
  // Copies into the arena may still be running; it is freed next. A failure here has nowhere to go and
  // changes nothing about freeing.
  static_cast<void>(gpuStreamSynchronize(copy_stream_.get()));
}

std::span<uint8_t> StreamingUpload::allocate_staging(size_t buffer, size_t bytes) {
  auto staging_area = std::make_unique<Staging>(bytes);
  const std::span<uint8_t> host(staging_area->host.as<uint8_t>(), bytes);
  std::lock_guard lock(staging_mutex_);
  if (staging_.size() <= buffer) staging_.resize(buffer + 1);
  staging_[buffer] = std::move(staging_area);
  return host;
}

void StreamingUpload::release_staging(std::span<uint8_t> buffer) noexcept {
  std::lock_guard lock(staging_mutex_);
  for (std::unique_ptr<Staging>& area : staging_)
    if (area && area->host.data() == buffer.data()) area.reset();
}

StreamingUpload::Staging& StreamingUpload::staging(size_t buffer) const {
  std::lock_guard lock(staging_mutex_);
  return *staging_.at(buffer);
}

void StreamingUpload::consume(const loader::Chunk& chunk) {
  const gpuStream_t stream = copy_stream_.get();
  if (!arena_.data()) arena_ = DeviceBuffer(arena_bytes_, "the model's weights");
  Staging& staging_area = staging(chunk.buffer);
  for (const loader::Piece& piece : chunk.pieces) {
    const gguf::TensorInfo& tensor = *piece.tensor;
    uint8_t* base = arena_.as<uint8_t>() + offsets_.at(&tensor);
    const std::span<const uint8_t> bytes = chunk.bytes(piece);
    const int scale_offset = split_scale_offset(tensor.type());
    if (scale_offset < 0) {
      check(gpuMemcpyAsync(base + piece.tensor_offset, bytes.data(), bytes.size(), gpuMemcpyHostToDevice, stream),
            "uploading a weight");
      continue;
    }
    uint8_t* raw = staging_area.device.as<uint8_t>() + piece.buffer_offset;
    check(gpuMemcpyAsync(raw, bytes.data(), bytes.size(), gpuMemcpyHostToDevice, stream), "uploading a weight");
    // Pieces hold whole blocks, so the piece's blocks split on their own.
    const uint64_t block_bytes = tensor.type_info->block_bytes;
    const uint64_t first_block = piece.tensor_offset / block_bytes;
    const DeviceLayout layout = device_layout(tensor.type(), tensor.bytes / block_bytes);
    split_block_scales(raw, static_cast<int64_t>(piece.bytes / block_bytes), static_cast<int>(block_bytes),
                       scale_offset, base + first_block * layout.block_stride,
                       reinterpret_cast<uint16_t*>(base + layout.scales_offset) + first_block, stream);
  }
  staging_area.copied.record(stream);
}

void StreamingUpload::wait_reusable(size_t buffer) { staging(buffer).copied.synchronize(); }

void StreamingUpload::group_done(size_t group) {
  group_ready_.at(group)->record(copy_stream_.get());
  // After the last group, wait for the copies: the loader's wall time then ends with the last byte on the
  // device, and its GB/s is that of the whole way from file to device.
  if (++groups_done_ == group_ready_.size()) copy_stream_.synchronize();
}

const void* StreamingUpload::device_data(const gguf::TensorInfo& tensor) const {
  const auto found = offsets_.find(&tensor);
  if (found == offsets_.end()) fail("streaming upload: tensor '{}' is not one of its groups'", tensor.name);
  return arena_.as<uint8_t>() + found->second;
}

void StreamingUpload::wait_group(size_t group) const { group_ready_.at(group)->synchronize(); }

bool StreamingUpload::group_arrived(size_t group) const { return group_ready_.at(group)->done(); }

}  // namespace rf::gpu
