// Weights that become usable on first use. A LazyTensor names a tensor of a GGUF file; the first call of
// data() asks the backend's Residency to make it usable for compute (a view of the memory-mapped file on
// the CPU, a copy in device memory on a GPU) and every later call returns that same placement. When several
// threads ask at the same moment, one materializes and the others wait for it (single flight), so a
// background loader and the compute thread can race for a layer safely.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>

#include "gguf/gguf.h"

namespace rf::model {

// A tensor as the file stores it.
struct TensorSource {
  const gguf::File* file;
  const gguf::TensorInfo* info;

  std::string_view name() const { return info->name; }
  TensorType type() const { return info->type(); }
  // The stored bytes in the file mapping; taking the span reads nothing, reading it faults pages in.
  std::span<const uint8_t> bytes() const { return file->tensor_data(*info); }
};

// A tensor placed where a backend computes with it. `data` is a host or device address, whichever the
// residency chose; `storage` owns what data points into when it is a copy (empty for a view of the mapping).
struct ResidentTensor {
  const void* data = nullptr;
  std::shared_ptr<const void> storage;
};

// A backend's strategy for placing weights. materialize() is called at most once per tensor and may run on
// any thread (concurrently for different tensors); it throws an rf::Error naming the tensor when the backend
// cannot compute with it, e.g. an unsupported type.
class Residency {
 public:
  virtual ~Residency() = default;
  virtual ResidentTensor materialize(const TensorSource& tensor) = 0;
};

// Bytes and tensors materialized so far, and the time spent in materialize() summed over tensors (loads on
// different threads overlap, so it can exceed the wall time).
struct LoadingStats {
  uint64_t bytes = 0;
  uint64_t tensors = 0;
  double seconds = 0.0;
};

// The counters behind LoadingStats, shared by all tensors of a plan and safe to update from any thread.
class LoadingCounters {
 public:
  void add(uint64_t bytes, int64_t nanoseconds);
  LoadingStats snapshot() const;

 private:
  std::atomic<uint64_t> bytes_{0};
  std::atomic<uint64_t> tensors_{0};
  std::atomic<int64_t> nanoseconds_{0};
};

// A handle to one weight. Copies share the one materialization (tied embeddings use token_embd.weight twice).
// A default-constructed handle is empty: an optional tensor the file does not have.
class LazyTensor {
 public:
  LazyTensor() = default;
  LazyTensor(std::shared_ptr<const gguf::File> file, const gguf::TensorInfo& info, std::shared_ptr<Residency> residency,
             std::shared_ptr<LoadingCounters> counters);

  explicit operator bool() const { return slot_ != nullptr; }
  const gguf::TensorInfo& info() const { return *slot_->source.info; }
  std::string_view name() const { return info().name; }
  TensorType type() const { return info().type(); }
  int64_t cols() const { return static_cast<int64_t>(info().ne[0]); }  // elements per row
  int64_t rows() const { return static_cast<int64_t>(info().rows()); }
  uint64_t bytes() const { return info().bytes; }
  size_t row_bytes() const { return static_cast<size_t>(info().bytes / info().rows()); }

  // Materializes on first use, once even under concurrent calls; afterwards a load-acquire and a return.
  // When materialize() throws, the error reaches this caller and the next call tries again.
  const void* data() const;
  bool is_loaded() const { return slot_->loaded.load(std::memory_order_acquire); }

 private:
  struct Slot {
    std::shared_ptr<const gguf::File> file;  // keeps the mapping alive as long as a handle exists
    TensorSource source;
    std::shared_ptr<Residency> residency;
    std::shared_ptr<LoadingCounters> counters;
    std::mutex mutex;
    std::atomic<bool> loaded{false};
    ResidentTensor resident;
  };
  std::shared_ptr<Slot> slot_;
};

}  // namespace rf::model
