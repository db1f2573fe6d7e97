// A HostSink that records what the loader does to it, for the loader's tests: every piece consumed, the order
// groups finish in, the threads each callback runs on and the staging buffers' lifecycle. It can hold
// consume() at a gate, slow it down, or fail it on a chosen tensor.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gguf/gguf.h"
#include "loader/host_sink.h"
#include "loader/tensor_groups.h"
#include "test_paths.h"
#include "util/error.h"

namespace rf::test {

// Blocks threads until opened.
class Gate {
 public:
  void close() {
    std::lock_guard lock(mutex_);
    open_ = false;
  }
  void open() {
    std::lock_guard lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }
  void pass() {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return open_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool open_ = true;
};

struct ConsumedPiece {
  size_t group;
  const gguf::TensorInfo* tensor;
  uint64_t tensor_offset;
  uint64_t bytes;
};

class RecordingSink : public loader::HostSink {
 public:
  explicit RecordingSink(const gguf::File& file) : HostSink(file) {}
  ~RecordingSink() override { EXPECT_TRUE(live_buffers_.empty()) << "staging buffers not released"; }

  Gate consume_gate;
  std::chrono::microseconds consume_delay{0};
  std::string fail_on_tensor;  // consume() throws on the chunk holding this tensor

  std::span<uint8_t> allocate_staging(size_t index, size_t bytes) override {
    const std::span<uint8_t> buffer = Sink::allocate_staging(index, bytes);
    std::lock_guard lock(mutex_);
    EXPECT_TRUE(allocated_indices_.insert(index).second) << "buffer " << index << " allocated twice";
    live_buffers_.insert(buffer.data());
    return buffer;
  }
  void release_staging(std::span<uint8_t> buffer) noexcept override {
    {
      std::lock_guard lock(mutex_);
      EXPECT_EQ(live_buffers_.erase(buffer.data()), 1u) << "released a buffer twice or one never allocated";
    }
    Sink::release_staging(buffer);
  }
  void prepare(const loader::Chunk& chunk) override {
    std::lock_guard lock(mutex_);
    prepare_threads_.insert(std::this_thread::get_id());
  }
  void consume(const loader::Chunk& chunk) override {
    consume_gate.pass();
    std::this_thread::sleep_for(consume_delay);
    for (const loader::Piece& piece : chunk.pieces)
      if (piece.tensor->name == fail_on_tensor) fail("injected failure on '{}'", fail_on_tensor);
    {
      std::lock_guard lock(mutex_);
      EXPECT_TRUE(live_buffers_.contains(chunk.staging.data()));
      consume_threads_.insert(std::this_thread::get_id());
      for (const loader::Piece& piece : chunk.pieces)
        pieces_.push_back({chunk.group, piece.tensor, piece.tensor_offset, piece.bytes});
    }
    HostSink::consume(chunk);
  }
  void wait_reusable(size_t buffer) override {
    std::lock_guard lock(mutex_);
    ++reuse_waits_;
  }
  void group_done(size_t group) override {
    std::lock_guard lock(mutex_);
    done_order_.push_back(group);
  }

  std::vector<ConsumedPiece> pieces() const {
    std::lock_guard lock(mutex_);
    return pieces_;
  }
  std::vector<size_t> done_order() const {
    std::lock_guard lock(mutex_);
    return done_order_;
  }
  size_t allocations() const {
    std::lock_guard lock(mutex_);
    return allocated_indices_.size();
  }
  // Indices are 0 .. allocations() - 1: buffers are allocated in order, as reading needs them.
  bool allocated_in_order() const {
    std::lock_guard lock(mutex_);
    return allocated_indices_.empty() || *allocated_indices_.rbegin() + 1 == allocated_indices_.size();
  }
  size_t live_buffers() const {
    std::lock_guard lock(mutex_);
    return live_buffers_.size();
  }
  size_t reuse_waits() const {
    std::lock_guard lock(mutex_);
    return reuse_waits_;
  }
  std::set<std::thread::id> consume_threads() const {
    std::lock_guard lock(mutex_);
    return consume_threads_;
  }
  std::set<std::thread::id> prepare_threads() const {
    std::lock_guard lock(mutex_);
    return prepare_threads_;
  }

 private:
  mutable std::mutex mutex_;
  std::set<const uint8_t*> live_buffers_;
  std::set<size_t> allocated_indices_;
  size_t reuse_waits_ = 0;
  std::vector<ConsumedPiece> pieces_;
  std::vector<size_t> done_order_;
  std::set<std::thread::id> consume_threads_;
  std::set<std::thread::id> prepare_threads_;
};

// Each tensor of `tensors` reached the sink exactly once (its pieces tile it without gap or overlap) and its
// copy equals the bytes in the file.
inline void expect_consumed_once_and_intact(const gguf::File& file, const RecordingSink& sink,
                                            const std::vector<const gguf::TensorInfo*>& tensors) {
  std::vector<ConsumedPiece> pieces = sink.pieces();
  std::sort(pieces.begin(), pieces.end(), [](const ConsumedPiece& a, const ConsumedPiece& b) {
    return a.tensor != b.tensor ? a.tensor < b.tensor : a.tensor_offset < b.tensor_offset;
  });
  for (const gguf::TensorInfo* tensor : tensors) {
    uint64_t covered = 0;
    for (const ConsumedPiece& piece : pieces) {
      if (piece.tensor != tensor) continue;
      EXPECT_EQ(piece.tensor_offset, covered) << tensor->name << ": gap or overlap";
      covered = piece.tensor_offset + piece.bytes;
    }
    EXPECT_EQ(covered, tensor->bytes) << tensor->name;
    const std::span<const uint8_t> expected = file.tensor_data(*tensor);
    EXPECT_EQ(std::memcmp(sink.tensor(*tensor).data(), expected.data(), expected.size()), 0) << tensor->name;
  }
}

// All tensors the groups list, each once.
inline std::vector<const gguf::TensorInfo*> tensors_of(const std::vector<loader::TensorGroup>& groups) {
  std::vector<const gguf::TensorInfo*> tensors;
  for (const loader::TensorGroup& group : groups)
    for (const gguf::TensorInfo* tensor : group.tensors)
      if (std::find(tensors.begin(), tensors.end(), tensor) == tensors.end()) tensors.push_back(tensor);
  return tensors;
}

}  // namespace rf::test
