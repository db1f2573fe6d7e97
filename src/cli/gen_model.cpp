// rocmforge gen-model: a model of a real model's shape with random N(0, 0.02) weights and biases (norms 1.0)
// and a real tokenizer, for testing and benchmarking the engine at full size without downloading weights. Each
// family (llama, qwen2, qwen3, phi3, gemma3) gets llama.cpp's tensor names and keys for its architecture. Rows
// are generated and quantized in parallel; each row's random numbers depend only on (seed, tensor, row), so a
// file is the same whatever the thread count.
#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli/commands.h"
#include "cli/convert.h"
#include "cli/file_type.h"
#include "cli/options.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "model/architecture.h"
#include "quant/quant.h"
#include "util/error.h"

namespace rf::cli {
namespace {

constexpr float kWeightStddev = 0.02f;

// How a family's converter lays out its files, beyond the weights its architecture needs (model/architecture.h:
// the optional weight groups gen-model writes are the `needs` of the family's entry there).
enum Layout : uint32_t {
  kFusedQkv = 1u << 0,      // attn_qkv.weight (q, k and v rows) in place of attn_q, attn_k and attn_v
  kFusedGateUp = 1u << 1,   // ffn_up.weight holds the gate's rows then up's; no ffn_gate.weight
  kHeadSizeKeys = 1u << 2,  // attention.key_length and attention.value_length
  kRopeDimsKey = 1u << 3,   // rope.dimension_count
};

struct Family {
  std::string_view architecture;  // general.architecture, and the prefix of the hyperparameter keys
  float norm_epsilon;             // attention.layer_norm_rms_epsilon
  uint32_t layout;
};

constexpr Family kLlama{"llama", 1e-5f, kRopeDimsKey};
constexpr Family kQwen2{"qwen2", 1e-6f, 0};
constexpr Family kQwen3{"qwen3", 1e-6f, kHeadSizeKeys | kRopeDimsKey};
constexpr Family kPhi3{"phi3", 1e-5f, kFusedQkv | kFusedGateUp | kRopeDimsKey};
constexpr Family kGemma3{"gemma3", 1e-6f, kHeadSizeKeys};

// Sliding-window attention (Gemma 3): all layers but every `pattern`-th see only the last `window` positions,
// and rotate with their own base.
struct SlidingWindow {
  uint32_t window = 0;  // 0: none
  uint32_t pattern = 0;
  float rope_base = 0.0f;
};

struct ModelShape {
  std::string_view name;
  Family family;
  uint32_t dim;
  uint32_t n_layers;
  uint32_t n_heads;
  uint32_t n_kv_heads;
  uint32_t head_dim;  // dim / n_heads, except where the family sets its own (Gemma 3)
  uint32_t ffn_dim;
  uint32_t context;
  float rope_base;
  bool tied_embeddings;  // no output.weight: token_embd is also the output matrix
  SlidingWindow sliding = {};
};

// Llama 3.2 1B reaches 128K tokens only with rope scaling, which these files do not carry: its context stays
// at Llama 3's 8192 (Gemma 3 12B's at 32768 likewise).
constexpr std::array kShapes = {
    //         name          family   dim   layers heads kv  head ffn    context rope base  tied
    ModelShape{"llama3-8b",  kLlama,  4096, 32,    32,   8,  128, 14336, 8192,   500000.0f, false},
    ModelShape{"llama3-1b",  kLlama,  2048, 16,    32,   8,  64,  8192,  8192,   500000.0f, true},
    ModelShape{"llama2-7b",  kLlama,  4096, 32,    32,   32, 128, 11008, 4096,   10000.0f,  false},
    ModelShape{"tiny-256",   kLlama,  256,  4,     4,    2,  64,  768,   2048,   10000.0f,  false},
    ModelShape{"qwen2.5-7b", kQwen2,  3584, 28,    28,   4,  128, 18944, 32768,  1e6f,      false},
    ModelShape{"qwen3-8b",   kQwen3,  4096, 36,    32,   8,  128, 12288, 40960,  1e6f,      false},
    ModelShape{"phi3-mini",  kPhi3,   3072, 32,    32,   32, 96,  8192,  4096,   10000.0f,  false},
    ModelShape{"gemma3-12b", kGemma3, 3840, 48,    16,   8,  256, 15360, 32768,  1e6f,      true, {1024, 6, 10000.0f}},
};

std::string shape_names() {
  std::vector<std::string_view> names;
  for (const ModelShape& shape : kShapes) names.push_back(shape.name);
  return fmt::format("{}", fmt::join(names, " "));
}

// "llama3-8b (llama), ...", for --help.
std::string shapes_with_architectures() {
  std::vector<std::string> shapes;
  for (const ModelShape& shape : kShapes)
    shapes.push_back(fmt::format("{} ({})", shape.name, shape.family.architecture));
  return fmt::format("{}", fmt::join(shapes, ", "));
}

const ModelShape& find_shape(std::string_view name) {
  for (const ModelShape& shape : kShapes)
    if (shape.name == name) return shape;
  fail("unknown shape '{}' (known: {})", name, shape_names());
}

struct TensorSpec {
  std::string name;
  std::vector<uint64_t> shape;  // ne0 (the input dimension) first, as llama.cpp stores it; 1 or 2 dimensions

  bool is_norm() const { return name.ends_with("norm.weight"); }
  uint64_t row_length() const { return shape[0]; }
  uint64_t rows() const { return shape.size() > 1 ? shape[1] : 1; }
};

// llama.cpp's tensors for the shape's architecture, in the order its converter writes llama's. A tensor's
// place in this list seeds its random numbers.
std::vector<TensorSpec> tensor_specs(const ModelShape& shape, uint64_t n_vocab) {
  const uint64_t dim = shape.dim, ffn = shape.ffn_dim, head = shape.head_dim;
  const uint64_t q_dim = head * shape.n_heads, kv_dim = head * shape.n_kv_heads;
  const uint32_t needs = model::find_architecture(shape.family.architecture)->needs;
  const auto has = [&](model::Weights weights) { return (needs & weights) != 0; };
  const auto laid_out = [&](Layout layout) { return (shape.family.layout & layout) != 0; };
  std::vector<TensorSpec> specs = {{"token_embd.weight", {dim, n_vocab}}};
  for (uint32_t layer = 0; layer < shape.n_layers; ++layer) {
    const auto add = [&](std::string_view name, std::vector<uint64_t> dims, bool present = true) {
      if (present) specs.push_back({fmt::format("blk.{}.{}", layer, name), std::move(dims)});
    };
    add("attn_norm.weight", {dim});
    if (laid_out(kFusedQkv)) {
      add("attn_qkv.weight", {dim, q_dim + 2 * kv_dim});
      add("attn_qkv.bias", {q_dim + 2 * kv_dim}, has(model::kQkvBias));
    } else {
      for (const auto& [part, rows] : {std::pair{"attn_q", q_dim}, {"attn_k", kv_dim}, {"attn_v", kv_dim}}) {
        add(fmt::format("{}.weight", part), {dim, rows});
        add(fmt::format("{}.bias", part), {rows}, has(model::kQkvBias));
      }
    }
    add("attn_q_norm.weight", {head}, has(model::kQkNorm));
    add("attn_k_norm.weight", {head}, has(model::kQkNorm));
    add("attn_output.weight", {q_dim, dim});
    add("post_attention_norm.weight", {dim}, has(model::kPostNorms));
    add("ffn_norm.weight", {dim});
    add("ffn_gate.weight", {dim, ffn}, !laid_out(kFusedGateUp));
    add("ffn_up.weight", {dim, laid_out(kFusedGateUp) ? 2 * ffn : ffn});
    add("ffn_down.weight", {ffn, dim});
    add("post_ffw_norm.weight", {dim}, has(model::kPostNorms));
  }
  specs.push_back({"output_norm.weight", {dim}});
  if (!shape.tied_embeddings) specs.push_back({"output.weight", {dim, n_vocab}});
  return specs;
}

// The architecture's hyperparameter keys, as llama.cpp's converter writes them.
void set_hyperparameters(gguf::Writer& writer, const ModelShape& shape, uint64_t n_vocab) {
  const Family& family = shape.family;
  const auto set = [&]<typename T>(std::string_view name, T value) {
    writer.set<T>(fmt::format("{}.{}", family.architecture, name), value);
  };
  set("context_length", shape.context);
  set("embedding_length", shape.dim);
  set("block_count", shape.n_layers);
  set("feed_forward_length", shape.ffn_dim);
  set("attention.head_count", shape.n_heads);
  set("attention.head_count_kv", shape.n_kv_heads);
  if (family.layout & kHeadSizeKeys) {
    set("attention.key_length", shape.head_dim);
    set("attention.value_length", shape.head_dim);
  }
  set("rope.freq_base", shape.rope_base);
  if (family.layout & kRopeDimsKey) set("rope.dimension_count", shape.head_dim);
  set("attention.layer_norm_rms_epsilon", family.norm_epsilon);
  if (shape.sliding.window > 0) {
    set("attention.sliding_window", shape.sliding.window);
    set("attention.sliding_window_pattern", shape.sliding.pattern);
    set("rope.freq_base_swa", shape.sliding.rope_base);
  }
  set("vocab_size", static_cast<uint32_t>(n_vocab));
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
  writer.set_string("general.architecture", shape.family.architecture);
  writer.set_string("general.name", fmt::format("synthetic-{}", shape.name));
  set_hyperparameters(writer, shape, n_vocab);
  for (const auto& kv : vocab->metadata())
    if (kv.key.starts_with("tokenizer.")) writer.set_value(kv.key, kv.value);
  set_file_type(writer, target);

  const ModelFacts facts{std::string(shape.family.architecture), shape.n_layers, shape.n_heads / shape.n_kv_heads,
                         shape.tied_embeddings};
  const std::vector<TensorSpec> specs = tensor_specs(shape, n_vocab);
  uint64_t total_elements = 0;
  for (const TensorSpec& spec : specs) total_elements += spec.row_length() * spec.rows();
  Progress progress("gen-model", total_elements);

  for (uint64_t index = 0; index < specs.size(); ++index) {
    const TensorSpec& spec = specs[index];
    const uint64_t row_length = spec.row_length();
    const uint64_t rows = spec.rows();
    const bool quantizable = is_quantizable(spec.name, static_cast<uint32_t>(spec.shape.size()));
    const TensorType type = quantizable ? choose_tensor_type(target, facts, spec.name, row_length) : TensorType::F32;
    quant::require_supported(type, fmt::format("tensor '{}'", spec.name));
    const RowSource generate_rows = [seed = options.seed, index, row_length, is_norm = spec.is_norm()](
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
      "gen-model", "Write a model of a real model's shape with random weights and a real tokenizer");
  command->add_option("--shape", options->shape,
                      fmt::format("Model shape (architecture): {}", shapes_with_architectures()))
      ->required();
  command->add_option("--type", options->type, fmt::format("Weight type: {}", quant_target_names()))->required();
  command->add_option("--vocab", options->vocab, "GGUF file whose tokenizer.* keys are copied (sets the vocab size)")
      ->required();
  command->add_option("output", options->output, "GGUF file to write")->required();
  command->add_option("--seed", options->seed, "Random seed (the same seed gives the same file)")
      ->transform(integer_in<uint64_t>(0));
  add_threads_option(*command, options->threads, "every hardware thread");
  command->add_flag("--sparse", options->sparse,
                    "Write only the header: tensor data is a hole that reads as zeros (for measuring open and "
                    "inspect on full-size files without the disk they would take)");
  command->callback([options] {
    gen_model(*options);
    print_written(options->output);
  });
}

}  // namespace rf::cli
