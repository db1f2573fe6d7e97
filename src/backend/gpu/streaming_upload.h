// The GPU side of loader::StreamingLoader: uploads a model's weights while the forward pass already runs.
// Staging buffers are pinned host memory, so copies from them are asynchronous DMA. consume() enqueues a
// chunk's copies on a copy stream of its own and records the buffer's event, on which wait_reusable() waits
// before a reader refills the buffer; group_done() records the group's ready event, which wait_group()
// waits on (so a forward pass waits for the layer it is about to run, not for the whole model). Weights land
// in the device layout of weight_layout.h: types stored as in the file are copied straight to their place;
// split types go through a device staging area, from which split_block_scales() moves the scales out of the
// blocks.
//
//   StreamingUpload upload(groups);
//   loader::StreamingLoader loader(file, groups, upload);  // returns at once; the upload runs behind
//   ...
//   loader.request(loader::layer_group(i));                // the host waits until layer i's copies are queued
//   upload.wait_group(loader::layer_group(i));             // and until they are done
//   ... kernels read upload.device_data(info) ...
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "backend/gpu/runtime.h"
#include "gguf/gguf.h"
#include "loader/sink.h"
#include "loader/tensor_groups.h"

namespace rf::gpu {

// Bytes of device memory the tensors of `groups` take in the device layout, as StreamingUpload places them (a
// tensor listed twice once).
uint64_t device_weight_bytes(const std::vector<loader::TensorGroup>& groups);

class StreamingUpload final : public loader::Sink {
 public:
  // Lays out every tensor of `groups` in one device allocation, made by the first consume() (so opening stays
  // fast and the allocation overlaps the first reads), and creates a ready event for each group. Uses the
  // current device.
  explicit StreamingUpload(const std::vector<loader::TensorGroup>& groups);
  // The loader must be destroyed (or cancelled) first: it releases the staging buffers through this sink.
  ~StreamingUpload() override;

  std::span<uint8_t> allocate_staging(size_t buffer, size_t bytes) override;
  void release_staging(std::span<uint8_t> buffer) noexcept override;
  void consume(const loader::Chunk& chunk) override;
  void wait_reusable(size_t buffer) override;
  void group_done(size_t group) override;

  // The tensor's device memory (the base of its WeightView); its bytes are there once the loader reports
  // its group loaded and wait_group() returns.
  const void* device_data(const gguf::TensorInfo& tensor) const;
  // Blocks until the copies of group `group` are done; call once the loader reports the group loaded
  // (group_done() has recorded its event by then).
  void wait_group(size_t group) const;
  // Whether the copies of a group the loader reports loaded are done; does not block.
  bool group_arrived(size_t group) const;

 private:
  // A pinned host buffer and the device area that split types pass through, with the event recorded after
  // the last copy from them.
  struct Staging {
    PinnedBuffer host;
    DeviceBuffer device;
    Event copied;
    explicit Staging(size_t bytes);
  };
  Staging& staging(size_t buffer) const;

  Stream copy_stream_;
  mutable std::mutex staging_mutex_;  // readers add buffers while others wait on their buffers' events
  std::vector<std::unique_ptr<Staging>> staging_;
  std::vector<std::unique_ptr<Event>> group_ready_;
  size_t groups_done_ = 0;  // consumer thread only
  std::unordered_map<const gguf::TensorInfo*, uint64_t> offsets_;  // in the arena; fixed at construction
  uint64_t arena_bytes_ = 0;
  // Written once by the consumer thread before the first group is reported loaded, so the forward pass,
  // which reads it after a group is loaded, never races with the write.
  DeviceBuffer arena_;
};

}  // namespace rf::gpu
