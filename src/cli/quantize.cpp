// rocmforge quantize IN.gguf OUT.gguf TYPE: rewrites every weight matrix in TYPE (or llama.cpp's mix for it),
// copying all metadata. Tensors stream one chunk of rows at a time from the mapped input to the output.
#include <algorithm>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/convert.h"
#include "cli/file_type.h"
#include "cli/options.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "quant/quant.h"

namespace rf::cli {
namespace {

// Tensors that keep their type are copied this many bytes at a time, so the progress bar moves.
constexpr uint64_t kCopyChunkBytes = 64 << 20;

struct QuantizeOptions {
  std::string input;
  std::string output;
  std::string type;
  int threads = 0;
};

void quantize(const QuantizeOptions& options) {
  const QuantTarget& target = find_quant_target(options.type);
  const auto input = gguf::File::open(options.input);
  const ModelFacts facts = model_facts(*input);
  const int threads = thread_count(options.threads);

  gguf::Writer writer;
  for (const auto& kv : input->metadata()) writer.set_value(kv.key, kv.value);
  set_file_type(writer, target);

  uint64_t total_elements = 0;
  for (const auto& tensor : input->tensors()) total_elements += tensor.elements();
  Progress progress("quantize", total_elements);

  for (const gguf::TensorInfo& tensor : input->tensors()) {
    const std::span<const uint8_t> data = input->tensor_data(tensor);
    const TensorType source_type = tensor.type();
    const uint64_t row_length = tensor.ne[0];
    const TensorType type = is_quantizable(tensor.name, tensor.n_dims)
                                ? choose_tensor_type(target, facts, tensor.name, row_length)
                                : source_type;
    const uint64_t rows = tensor.rows();
    const uint64_t source_row_bytes = tensor.bytes / rows;
    if (type == source_type) {
      const uint64_t chunk_rows = std::max<uint64_t>(1, kCopyChunkBytes / source_row_bytes);
      writer.add_tensor(std::string(tensor.name), type, tensor.shape(), [=, &progress](const gguf::ByteSink& sink) {
        for (uint64_t row = 0; row < rows; row += chunk_rows) {
          const uint64_t count = std::min(chunk_rows, rows - row);
          sink(data.subspan(row * source_row_bytes, count * source_row_bytes));
          progress.add(count * row_length);
        }
      });
      continue;
    }
    const std::string what = fmt::format("tensor '{}'", tensor.name);
    quant::require_supported(source_type, what);
    quant::require_supported(type, what);
    writer.add_tensor(std::string(tensor.name), type, tensor.shape(), [=, &progress](const gguf::ByteSink& sink) {
      const RowSource dequantize_rows = [&](uint64_t first_row, uint64_t count, float* out) {
        quant::dequantize(source_type, data.data() + first_row * source_row_bytes, out,
                          static_cast<int64_t>(count * row_length));
      };
      convert_rows(type, row_length, rows, dequantize_rows, threads, sink, progress);
    });
  }
  writer.write(options.output);
}

}  // namespace

void add_quantize_command(CLI::App& app) {
  auto options = std::make_shared<QuantizeOptions>();
  CLI::App* command = app.add_subcommand(
      "quantize", "Requantize a GGUF model's weight matrices (norms and other 1-D tensors keep their type)");
  command->add_option("input", options->input, "GGUF model to read")->required();
  command->add_option("output", options->output, "GGUF file to write")->required();
  command
      ->add_option("type", options->type,
                   fmt::format("Target type: {} (tensors get their types as llama-quantize gives them, "
                               "except in Q3_K, Q4_K and Q5_K, which are pure)",
                               quant_target_names()))
      ->required();
  add_threads_option(*command, options->threads, "every hardware thread");
  command->callback([options] {
    quantize(*options);
    print_written(options->output);
  });
}

}  // namespace rf::cli
