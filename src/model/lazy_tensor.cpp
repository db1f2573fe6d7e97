#include "model/lazy_tensor.h"

#include <chrono>

#include "util/error.h"

namespace rf::model {

void LoadingCounters::add(uint64_t bytes, int64_t nanoseconds) {
  bytes_.fetch_add(bytes, std::memory_order_relaxed);
  tensors_.fetch_add(1, std::memory_order_relaxed);
  nanoseconds_.fetch_add(nanoseconds, std::memory_order_relaxed);
}

LoadingStats LoadingCounters::snapshot() const {
  LoadingStats stats;
  stats.bytes = bytes_.load(std::memory_order_relaxed);
  stats.tensors = tensors_.load(std::memory_order_relaxed);
  stats.seconds = static_cast<double>(nanoseconds_.load(std::memory_order_relaxed)) * 1e-9;
  return stats;
}

LazyTensor::LazyTensor(std::shared_ptr<const gguf::File> file, const gguf::TensorInfo& info,
                       std::shared_ptr<Residency> residency, std::shared_ptr<LoadingCounters> counters)
    : slot_(std::make_shared<Slot>()) {
  slot_->source = {file.get(), &info};
  slot_->file = std::move(file);
  slot_->residency = std::move(residency);
  slot_->counters = std::move(counters);
}

LazyTensor LazyTensor::slice(int64_t first, int64_t count) const {
  const int64_t extent = is_matrix() ? rows() : cols();
  if (first < 0 || count <= 0 || first + count > extent)
    fail("tensor '{}': a slice of {} at {} is outside its {} {}", name(), count, first, extent,
         is_matrix() ? "rows" : "elements");
  LazyTensor view = *this;
  view.first_ = first_ + first;
  view.count_ = count;
  return view;
}

const void* LazyTensor::data() const {
  Slot& slot = *slot_;
  if (slot.loaded.load(std::memory_order_acquire)) return slot.resident.data;
  std::lock_guard lock(slot.mutex);
  if (!slot.loaded.load(std::memory_order_relaxed)) {
    const auto start = std::chrono::steady_clock::now();
    slot.resident = slot.residency->materialize(slot.source);
    const auto elapsed = std::chrono::steady_clock::now() - start;
    slot.counters->add(slot.source.info->bytes, std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed).count());
    slot.loaded.store(true, std::memory_order_release);
  }
  return slot.resident.data;
}

bool LazyTensor::is_loaded() const {
  return slot_->loaded.load(std::memory_order_acquire) || slot_->residency->is_resident(slot_->source);
}

}  // namespace rf::model
