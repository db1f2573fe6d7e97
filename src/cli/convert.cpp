#include "cli/convert.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gguf/gguf.h"
#include "quant/quant.h"

namespace rf::cli {
namespace {

// Rows are handed to threads in tasks of about this many elements (1 MiB of f32): big enough that a task
// outweighs handing it out, small enough that threads finish a chunk together.
constexpr uint64_t kTaskElements = 256 * 1024;
constexpr uint64_t kTasksPerThread = 2;

// Runs task(0) .. task(count - 1) on up to `threads` threads. The first exception stops the handing out of
// tasks and is rethrown once every thread has stopped.
void parallel_for(uint64_t count, int threads, const std::function<void(uint64_t)>& task) {
  std::atomic<uint64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto work = [&] {
    for (uint64_t i = next++; i < count; i = next++) {
      try {
        task(i);
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!error) error = std::current_exception();
        next = count;
      }
    }
  };
  std::vector<std::jthread> workers;
  for (uint64_t t = 1; t < std::min<uint64_t>(static_cast<uint64_t>(threads), count); ++t) workers.emplace_back(work);
  work();
  workers.clear();  // joins
  if (error) std::rethrow_exception(error);
}

}  // namespace

void convert_rows(TensorType type, uint64_t row_length, uint64_t rows, const RowSource& source, int threads,
                  const gguf::ByteSink& sink, Progress& progress) {
  const uint64_t out_row_bytes = row_bytes(type, row_length);
  const uint64_t rows_per_task = std::max<uint64_t>(1, kTaskElements / row_length);
  const uint64_t chunk_rows = std::min(rows, rows_per_task * kTasksPerThread * static_cast<uint64_t>(threads));
  std::vector<float> values(chunk_rows * row_length);
  std::vector<uint8_t> converted(chunk_rows * out_row_bytes);
  for (uint64_t chunk_first = 0; chunk_first < rows; chunk_first += chunk_rows) {
    const uint64_t chunk_count = std::min(chunk_rows, rows - chunk_first);
    const uint64_t tasks = (chunk_count + rows_per_task - 1) / rows_per_task;
    parallel_for(tasks, threads, [&](uint64_t task) {
      const uint64_t first = task * rows_per_task;
      const uint64_t count = std::min(rows_per_task, chunk_count - first);
      float* task_values = values.data() + first * row_length;
      source(chunk_first + first, count, task_values);
      quant::quantize(type, task_values, converted.data() + first * out_row_bytes, static_cast<int64_t>(count),
                      static_cast<int64_t>(row_length));
      progress.add(count * row_length);
    });
    sink({converted.data(), chunk_count * out_row_bytes});
  }
}

void print_written(const std::string& path) {
  const auto file = gguf::File::open(path);
  std::map<uint32_t, int> tensors_by_type;
  for (const auto& tensor : file->tensors()) ++tensors_by_type[static_cast<uint32_t>(tensor.type())];
  std::vector<std::string> counts;
  for (const auto& [type, count] : tensors_by_type)
    counts.push_back(fmt::format("{} x{}", tensor_type_name(static_cast<TensorType>(type)), count));
  fmt::print("wrote {}: {} tensors ({}), {:.2f} MiB\n", path, file->tensors().size(), fmt::join(counts, ", "),
             static_cast<double>(file->file_size()) / (1 << 20));
}

int thread_count(int requested) {
  return requested > 0 ? requested : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

}  // namespace rf::cli
