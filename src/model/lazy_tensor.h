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
#include <string>
#include <string_view>
#include <vector>

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

class ExecutionPlan;

// Bytes and tensors loaded so far, and the time callers spent waiting in materialize() summed over tensors
// (loads on different threads overlap, so it can exceed the wall time). A residency that loads ahead of use
// (the GPU's streamer) also reports its wall time and where its threads spent theirs.
struct LoadingStats {
  struct Phase {
    std::string name;  // "read", "enqueueing copies", ...
    double seconds;    // summed over the threads of the phase
  };
  uint64_t bytes = 0;
  uint64_t tensors = 0;
  double seconds = 0.0;
  double wall_seconds = 0.0;         // loading start to the last byte placed (to now while loading); 0: on demand
  double first_group_seconds = 0.0;  // loading start to the first layer's inputs (embeddings) placed
  std::vector<Phase> phases;

  double gb_per_second() const { return wall_seconds > 0 ? static_cast<double>(bytes) / wall_seconds * 1e-9 : 0.0; }
};

// A backend's strategy for placing weights. materialize() is called at most once per tensor and may run on
// any thread (concurrently for different tensors); it throws an rf::Error naming the tensor when the backend
// cannot compute with it, e.g. an unsupported type.
class Residency {
 public:
  virtual ~Residency() = default;
  // Called by ExecutionPlan::build once every tensor is bound, before any materialize(): a residency that
  // loads ahead of use learns the execution order here. The plan may move afterwards; its tensors' infos
  // and file stay where they are.
  virtual void bind(const ExecutionPlan& plan) {}
  virtual ResidentTensor materialize(const TensorSource& tensor) = 0;
  // Whether materialize() would return `tensor` without waiting because a loader placed it ahead of use.
  // The default loads on first use only.
  virtual bool is_resident(const TensorSource& tensor) const { return false; }
  // Replaces the on-demand counts of `stats` with what a loader running ahead of use measured.
  virtual void report(LoadingStats& stats) const {}
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
// A default-constructed handle is empty: an optional tensor the file does not have. A slice is a handle to
// consecutive rows of a matrix (or elements of a vector) of a stored tensor that fuses several weights (attn_qkv,
// gate and up in one ffn_up): it shares the stored tensor's one materialization, and data() is still the
// stored tensor's start, which the backend offsets by first() rows or elements in its own layout.
class LazyTensor {
 public:
  LazyTensor() = default;
  LazyTensor(std::shared_ptr<const gguf::File> file, const gguf::TensorInfo& info, std::shared_ptr<Residency> residency,
             std::shared_ptr<LoadingCounters> counters);

  // Rows first .. first + count - 1 (a matrix) or elements (a vector) of this handle's stored tensor.
  LazyTensor slice(int64_t first, int64_t count) const;

  explicit operator bool() const { return slot_ != nullptr; }
  const gguf::TensorInfo& info() const { return *slot_->source.info; }  // the stored tensor's
  std::string_view name() const { return info().name; }
  TensorType type() const { return info().type(); }
  bool is_matrix() const { return info().n_dims >= 2; }
  int64_t cols() const {  // elements per row
    return !is_matrix() && sliced() ? count_ : static_cast<int64_t>(info().ne[0]);
  }
  int64_t rows() const { return is_matrix() && sliced() ? count_ : static_cast<int64_t>(info().rows()); }
  int64_t first() const { return first_; }  // of the stored tensor's rows (a matrix) or elements (a vector)
  bool sliced() const { return count_ >= 0; }
  size_t row_bytes() const { return static_cast<size_t>(rf::row_bytes(type(), static_cast<uint64_t>(cols()))); }
  uint64_t bytes() const { return static_cast<uint64_t>(rows()) * row_bytes(); }
  // Where this handle's data starts in the stored layout, from the stored tensor's start.
  uint64_t stored_offset() const {
    return static_cast<uint64_t>(first_) * (is_matrix() ? row_bytes() : rf::row_bytes(type(), 1));
  }
  // The first value of an F32 vector (or a slice of one) where data() placed it, host or device: every backend
  // keeps F32 vectors as the file stores them. Null for an empty handle.
  const float* f32_values() const {
    if (!slot_) return nullptr;
    return reinterpret_cast<const float*>(static_cast<const uint8_t*>(data()) + stored_offset());
  }

  // Materializes on first use, once even under concurrent calls; afterwards a load-acquire and a return.
  // When materialize() throws, the error reaches this caller and the next call tries again.
  const void* data() const;
  // Whether data() returns without loading: materialized, or placed ahead of use by the residency's loader.
  bool is_loaded() const;

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
  int64_t first_ = 0;
  int64_t count_ = -1;  // rows or elements of a slice; -1: the whole stored tensor
};

}  // namespace rf::model
