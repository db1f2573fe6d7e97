// rocmforge gen-model: a llama model of a real model's shape with random N(0, 0.02) weights (norms 1.0) and a
// real tokenizer, for testing and benchmarking the engine at full size without downloading weights. Rows are
// generated and quantized in parallel; each row's random numbers depend only on (seed, tensor, row), so a
// file is the same whatever the thread count.
#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli/commands.h"
#include "cli/convert.h"
#include "cli/file_type.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "quant/quant.h"
#include "util/error.h"

namespace rf::cli {
namespace {

constexpr float kWeightStddev = 0.02f;
constexpr float kRmsNormEpsilon = 1e-5f;

struct ModelShape {
  std::string_view name;
  uint32_t dim;
  uint32_t n_layers;
  uint32_t n_heads;
  uint32_t n_kv_heads;
  uint32_t ffn_dim;
  uint32_t context;
  float rope_base;
  bool tied_embeddings;  // no output.weight: token_embd is also the output matrix
};

// Llama 3.2 1B reaches 128K tokens only with rope scaling, which these files do not carry: its context stays
// at Llama 3's 8192.
constexpr std::array kShapes = {
    ModelShape{"llama3-8b", 4096, 32, 32, 8, 14336, 8192, 500000.0f, false},
    ModelShape{"llama3-1b", 2048, 16, 32, 8, 8192, 8192, 500000.0f, true},
    ModelShape{"llama2-7b", 4096, 32, 32, 32, 11008, 4096, 10000.0f, false},
    ModelShape{"tiny-256", 256, 4, 4, 2, 768, 2048, 10000.0f, false},
};

std::string shape_names() {
  std::vector<std::string_view> names;
  for (const ModelShape& shape : kShapes) names.push_back(shape.name);
  return fmt::format("{}", fmt::join(names, " "));
}

const ModelShape& find_shape(std::string_view name) {
  for (const ModelShape& shape : kShapes)
    if (shape.name == name) return shape;
  fail("unknown shape '{}' (known: {})", name, shape_names());
}

struct TensorSpec {
  std::string name;
  std::vector<uint64_t> shape;  // ne0 (the input dimension) first, as llama.cpp stores it; 1 or 2 dimensions
  bool is_norm;

  uint64_t row_length() const { return shape[0]; }
  uint64_t rows() const { return shape.size() > 1 ? shape[1] : 1; }
};

// llama.cpp's tensors for the llama architecture, in the order its converter writes them.
std::vector<TensorSpec> tensor_specs(const ModelShape& shape, uint64_t n_vocab) {
  const uint64_t dim = shape.dim;
  const uint64_t kv_dim = dim / shape.n_heads * shape.n_kv_heads;
  std::vector<TensorSpec> specs = {{"token_embd.weight", {dim, n_vocab}, false}};
  for (uint32_t layer = 0; layer < shape.n_layers; ++layer) {
    const std::string blk = fmt::format("blk.{}.", layer);
    specs.push_back({blk + "attn_norm.weight", {dim}, true});
    specs.push_back({blk + "attn_q.weight", {dim, dim}, false});
    specs.push_back({blk + "attn_k.weight", {dim, kv_dim}, false});
    specs.push_back({blk + "attn_v.weight", {dim, kv_dim}, false});
    specs.push_back({blk + "attn_output.weight", {dim, dim}, false});
    specs.push_back({blk + "ffn_norm.weight", {dim}, true});
    specs.push_back({blk + "ffn_gate.weight", {dim, shape.ffn_dim}, false});
    specs.push_back({blk + "ffn_up.weight", {dim, shape.ffn_dim}, false});
    specs.push_back({blk + "ffn_down.weight", {shape.ffn_dim, dim}, false});
  }
  specs.push_back({"output_norm.weight", {dim}, true});
  if (!shape.tied_embeddings) specs.push_back({"output.weight", {dim, n_vocab}, false});
  return specs;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9;
  x = (x ^ (x >> 27)) * 0x94d049bb133111eb;
  return x ^ (x >> 31);
}

// xoshiro256+ seeded from (seed, tensor, row) through splitmix64; normal values by Box-Muller.
class RowRandom {
 public:
  RowRandom(uint64_t seed, uint64_t tensor, uint64_t row) {
    const uint64_t key = splitmix64(splitmix64(splitmix64(seed) ^ tensor) ^ row);
    for (uint64_t i = 0; i < state_.size(); ++i) state_[i] = splitmix64(key + i);
  }

  void fill_normal(float* out, uint64_t n, float stddev) {
    for (uint64_t i = 0; i < n; i += 2) {
      const float u1 = 1.0f - uniform();  // in (0, 1]: log stays finite
      const float u2 = uniform();
      const float radius = stddev * std::sqrt(-2.0f * std::log(u1));
      const float angle = 2.0f * std::numbers::pi_v<float> * u2;
      out[i] = radius * std::cos(angle);
      if (i + 1 < n) out[i + 1] = radius * std::sin(angle);
    }
  }

 private:
  // In [0, 1), from the top 24 bits.
  float uniform() { return static_cast<float>(next() >> 40) * 0x1p-24f; }

  uint64_t next() {
    const uint64_t result = state_[0] + state_[3];
    const uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = (state_[3] << 45) | (state_[3] >> 19);
    return result;
  }

  std::array<uint64_t, 4> state_;
};

struct GenModelOptions {
  std::string shape;
  std::string type;
  std::string vocab;
  std::string output;
  uint64_t seed = 0;
  int threads = 0;
  bool sparse = false;
};

void gen_model(const GenModelOptions& options) {
  const ModelShape& shape = find_shape(options.shape);
  const QuantTarget& target = find_quant_target(options.type);
  const auto vocab = gguf::File::open(options.vocab);
  const gguf::Value* tokens = vocab->find("tokenizer.ggml.tokens");
  if (!tokens || !tokens->is_array() || tokens->element_type() != gguf::ValueType::STRING)
    fail("{}: has no tokenizer.ggml.tokens string array, so it is not a vocabulary", options.vocab);
  const uint64_t n_vocab = tokens->size();
  const int threads = thread_count(options.threads);

  gguf::Writer writer;
  writer.set_string("general.architecture", "llama");
  writer.set_string("general.name", fmt::format("synthetic-{}", shape.name));
  writer.set<uint32_t>("llama.context_length", shape.context);
  writer.set<uint32_t>("llama.embedding_length", shape.dim);
  writer.set<uint32_t>("llama.block_count", shape.n_layers);
  writer.set<uint32_t>("llama.feed_forward_length", shape.ffn_dim);
  writer.set<uint32_t>("llama.attention.head_count", shape.n_heads);
  writer.set<uint32_t>("llama.attention.head_count_kv", shape.n_kv_heads);
  writer.set<float>("llama.rope.freq_base", shape.rope_base);
  writer.set<uint32_t>("llama.rope.dimension_count", shape.dim / shape.n_heads);
  writer.set<float>("llama.attention.layer_norm_rms_epsilon", kRmsNormEpsilon);
  writer.set<uint32_t>("llama.vocab_size", static_cast<uint32_t>(n_vocab));
  for (const auto& kv : vocab->metadata())
    if (kv.key.starts_with("tokenizer.")) writer.set_value(kv.key, kv.value);
  set_file_type(writer, target);

  const ModelFacts facts{"llama", shape.n_layers, shape.n_heads / shape.n_kv_heads, shape.tied_embeddings};
  const std::vector<TensorSpec> specs = tensor_specs(shape, n_vocab);
  uint64_t total_elements = 0;
  for (const TensorSpec& spec : specs) total_elements += spec.row_length() * spec.rows();
  Progress progress("gen-model", total_elements);

  for (uint64_t index = 0; index < specs.size(); ++index) {
    const TensorSpec& spec = specs[index];
    const uint64_t row_length = spec.row_length();
    const uint64_t rows = spec.rows();
    const TensorType type = spec.is_norm ? TensorType::F32 : choose_tensor_type(target, facts, spec.name, row_length);
    quant::require_supported(type, fmt::format("tensor '{}'", spec.name));
    const RowSource generate_rows = [seed = options.seed, index, row_length, is_norm = spec.is_norm](
                                        uint64_t first_row, uint64_t count, float* out) {
      for (uint64_t row = first_row; row < first_row + count; ++row, out += row_length) {
        if (is_norm) {
          std::fill(out, out + row_length, 1.0f);
        } else {
          RowRandom(seed, index, row).fill_normal(out, row_length, kWeightStddev);
        }
      }
    };
    writer.add_tensor(spec.name, type, spec.shape, [=, &progress](const gguf::ByteSink& sink) {
      convert_rows(type, row_length, rows, generate_rows, threads, sink, progress);
    });
  }
  if (options.sparse) {
    writer.write_without_data(options.output);
  } else {
    writer.write(options.output);
  }
}

}  // namespace

void add_gen_model_command(CLI::App& app) {
  auto options = std::make_shared<GenModelOptions>();
  CLI::App* command = app.add_subcommand(
      "gen-model", "Write a llama model of a real model's shape with random weights and a real tokenizer");
  command->add_option("--shape", options->shape, fmt::format("Model shape: {}", shape_names()))->required();
  command->add_option("--type", options->type, fmt::format("Weight type: {}", quant_target_names()))->required();
  command->add_option("--vocab", options->vocab, "GGUF file whose tokenizer.* keys are copied (sets the vocab size)")
      ->required();
  command->add_option("output", options->output, "GGUF file to write")->required();
  command->add_option("--seed", options->seed, "Random seed (the same seed gives the same file)");
  command->add_option("-t,--threads", options->threads, "Threads (0 = every core)")->check(CLI::NonNegativeNumber);
  command->add_flag("--sparse", options->sparse,
                    "Write only the header: tensor data is a hole that reads as zeros (for measuring open and "
                    "inspect on full-size files without the disk they would take)");
  command->callback([options] {
    gen_model(*options);
    print_written(options->output);
  });
}

}  // namespace rf::cli
