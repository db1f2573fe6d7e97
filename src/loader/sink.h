// Where a StreamingLoader delivers tensor bytes. The loader reads the file into staging buffers that the sink
// provides; the sink consumes each filled buffer (a CPU sink copies it into host memory, a GPU sink starts
// an asynchronous copy to the device) and tells the loader when the buffer may be refilled. The loader knows
// nothing of devices: pinned memory, streams and events all live behind this interface.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>

#include "gguf/gguf.h"

namespace rf::loader {

// Bytes [tensor_offset, tensor_offset + bytes) of one tensor, lying at buffer_offset in a staging buffer.
// A piece holds whole rows of its tensor (whole blocks when one row is larger than a chunk), so a sink can
// repack it without looking at neighbouring pieces.
struct Piece {
  const gguf::TensorInfo* tensor;
  uint64_t tensor_offset;
  uint64_t bytes;
  uint64_t buffer_offset;

  bool ends_tensor() const { return tensor_offset + bytes == tensor->bytes; }
};

// One filled staging buffer: pieces of tensors of one group. The pieces of a tensor reach the sink in order of
// tensor_offset, the first starting at 0.
struct Chunk {
  size_t group;                  // index of the group in the loader's list
  size_t buffer;                 // index of the staging buffer, 0 .. staging_buffers - 1
  std::span<uint8_t> staging;    // the whole staging buffer; writable so that prepare() can repack in place
  std::span<const Piece> pieces;

  std::span<uint8_t> bytes(const Piece& piece) const { return staging.subspan(piece.buffer_offset, piece.bytes); }
};

class Sink {
 public:
  virtual ~Sink() = default;

  // Memory of `bytes` for staging buffer `buffer` (0 .. staging_buffers - 1), called once per buffer when
  // reading first needs it, on the reader thread that does; calls for different buffers may run at the same
  // time. The default is page-aligned host memory; a GPU sink returns pinned memory so that copies from it
  // run as asynchronous DMA. Throwing fails the load with that message.
  virtual std::span<uint8_t> allocate_staging(size_t buffer, size_t bytes);
  // Frees a buffer allocate_staging returned, after its last wait_reusable(): when the last chunk has been
  // consumed, or when the loader is cancelled or destroyed.
  virtual void release_staging(std::span<uint8_t> buffer) noexcept;

  // Optional work on a chunk just read, on the reader thread that read it; readers run it in parallel, so
  // CPU-side repacking placed here overlaps reading and copying. The default does nothing.
  virtual void prepare(const Chunk& chunk) {}
  // Takes a filled chunk. Called on the loader's single consumer thread, one chunk at a time, in the order
  // chunks were dispatched (execution order unless a request reordered it). It may return before it is done
  // with the buffer (an asynchronous copy): the loader calls wait_reusable() before refilling it.
  virtual void consume(const Chunk& chunk) = 0;
  // Returns once the work consume() started on staging buffer `buffer` no longer reads it. Called before
  // the buffer is refilled (on the reader thread about to fill it) and before it is released. A sink that
  // finishes with the buffer inside consume() keeps the default, which returns at once.
  virtual void wait_reusable(size_t buffer) {}
  // Every tensor of group `group` has been consumed, those it shares with earlier groups included. Called on
  // the consumer thread, once per group, before the group's waiters wake up: a GPU sink records the group's
  // ready event here, and the forward pass makes its stream wait on that event.
  virtual void group_done(size_t group) {}
};

}  // namespace rf::loader
