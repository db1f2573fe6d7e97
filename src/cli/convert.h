// Converting a tensor row by row on all cores, shared by `quantize` and `gen-model`: a RowSource produces rows
// as f32, they are quantized in parallel and streamed in order to a writer's sink, a chunk at a time, so the
// memory used stays small whatever the tensor's size.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "gguf/tensor_type.h"
#include "gguf/writer.h"
#include "util/progress.h"

namespace rf::cli {

// Fills rows [first_row, first_row + count) as f32 at `out`, row after row. Called from several threads at
// once, for rows that never overlap.
using RowSource = std::function<void(uint64_t first_row, uint64_t count, float* out)>;

// Writes `rows` rows of `row_length` elements from `source`, converted to `type`, to `sink`; adds each row's
// elements to `progress`.
void convert_rows(TensorType type, uint64_t row_length, uint64_t rows, const RowSource& source, int threads,
                  const gguf::ByteSink& sink, Progress& progress);

// The thread count for a --threads option: 0 means every core.
int thread_count(int requested);

// Prints what a command wrote, read back from the file: "wrote PATH: 39 tensors (Q4_K x25, ...), 2.01 MiB".
void print_written(const std::string& path);

}  // namespace rf::cli
