// `rocmforge gen-model`: llama.cpp's layout and types for a shape, the tokenizer copied, N(0, 0.02) weights,
// the same bytes whatever the thread count, and full-size shapes written sparse, in every family it knows
// (llama, qwen2, qwen3, phi3, gemma3) with the names and keys ROCmForge's loader and llama.cpp's expect.
#include <cmath>
#include <map>
#include <memory>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/cpu/residency.h"
#include "cli/cli_run.h"
#include "model/execution_plan.h"
#include "quant/quant.h"

namespace rf::test {
namespace {

class GenModelTest : public CliTest {
 protected:
  std::unique_ptr<gguf::File> generate(const std::string& name, const std::string& args) {
    run_ok(fmt::format("gen-model {} '{}'", args, path(name)));
    return gguf::File::open(path(name));
  }
};

using nlohmann::json;

const std::string kTinyVocab = fmt::format("--vocab '{}'", model_path("stories260K.gguf"));
const std::string kLlama3Vocab = fmt::format("--vocab '{}'", shared_path("vocab/ggml-vocab-llama-bpe.gguf"));
const std::string kPhi3Vocab = fmt::format("--vocab '{}'", shared_path("vocab/ggml-vocab-phi-3.gguf"));

using Shape = std::vector<uint64_t>;

uint64_t parameters(const gguf::File& model) {
  uint64_t count = 0;
  for (const auto& tensor : model.tensors()) count += tensor.elements();
  return count;
}

// What ROCmForge's loader makes of a file: building the plan checks every tensor's name, shape and (for
// vectors) type against the keys, reading no tensor data, so a sparse file will do.
model::ModelConfig loaded_config(const std::string& path) {
  return model::ExecutionPlan::build(gguf::File::open(path), std::make_shared<cpu::MappedResidency>()).config();
}

// Q4_K_M gives attn_v (and attn_qkv) and ffn_down Q6_K in the first and last eighth of the layers and every
// third between, Q4_K elsewhere.
TensorType q4_k_m_more_bits_type(int layer, int n_layers) {
  const bool more_bits = layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
  return more_bits ? TensorType::Q6_K : TensorType::Q4_K;
}

// K-quants search their scales: slow in debug and sanitized builds, which take Q8_0.
const std::string kTinyType = kOptimizedBuild ? "Q4_K_M" : "Q8_0";

// synth-tiny256-*.gguf is this very shape made by llama.cpp's tools: same keys and values, same tensors with
// the same types and shapes (only the random numbers differ).
TEST_F(GenModelTest, Tiny256HasLlamaCppsKeysTensorsAndTypes) {
  const auto model = generate("tiny.gguf", fmt::format("--shape tiny-256 --type {} {}", kTinyType, kTinyVocab));
  expect_same_model(*model, *gguf::File::open(model_path(fmt::format("synth-tiny256-{}.gguf", kTinyType))), false);
}

TEST_F(GenModelTest, IsTheSameForAnyThreadCountAndDiffersBySeed) {
  const std::string args = fmt::format("--shape tiny-256 --type {} {}", kTinyType, kTinyVocab);
  generate("one.gguf", args + " --seed 5 --threads 1");
  generate("three.gguf", args + " --seed 5 --threads 3");
  generate("other.gguf", args + " --seed 6 --threads 3");
  EXPECT_TRUE(read_text(path("one.gguf")) == read_text(path("three.gguf")));
  EXPECT_FALSE(read_text(path("one.gguf")) == read_text(path("other.gguf")));
}

TEST_F(GenModelTest, WeightsAreNormalWithDeviationPoint02AndNormsOne) {
  const auto model = generate("f32.gguf", fmt::format("--shape tiny-256 --type F32 {}", kTinyVocab));
  for (const auto& tensor : model->tensors()) {
    SCOPED_TRACE(tensor.name);
    ASSERT_EQ(tensor.type(), TensorType::F32);
    const auto* values = reinterpret_cast<const float*>(model->tensor_data(tensor).data());
    const uint64_t n = tensor.elements();
    if (tensor.n_dims == 1) {
      EXPECT_TRUE(std::all_of(values, values + n, [](float v) { return v == 1.0f; }));
      continue;
    }
    double sum = 0, sum_squares = 0;
    for (uint64_t i = 0; i < n; ++i) {
      sum += values[i];
      sum_squares += double(values[i]) * values[i];
    }
    const double mean = sum / n, deviation = std::sqrt(sum_squares / n - mean * mean);
    EXPECT_NEAR(mean, 0.0, 5 * 0.02 / std::sqrt(double(n)));
    EXPECT_NEAR(deviation, 0.02, 0.02 * 0.02);
  }
}

// Full-size shapes, header only: tensor data is a hole, so this takes no time and no disk.
TEST_F(GenModelTest, Llama3_8BHasItsShapesVocabularyAndMix) {
  const auto model = generate("8b.gguf", fmt::format("--shape llama3-8b --type Q4_K_M --sparse {}", kLlama3Vocab));
  EXPECT_EQ(model->get<uint32_t>("llama.vocab_size"), 128256u);
  EXPECT_EQ(model->get<uint32_t>("llama.block_count"), 32u);
  EXPECT_EQ(model->get<uint32_t>("llama.attention.head_count_kv"), 8u);
  EXPECT_EQ(model->get<float>("llama.rope.freq_base"), 500000.0f);
  EXPECT_EQ(model->get<uint32_t>("llama.rope.dimension_count"), 128u);
  EXPECT_EQ(model->get<std::string_view>("tokenizer.ggml.pre"), "llama-bpe");
  EXPECT_EQ(model->get_value("tokenizer.ggml.merges").size(),
            gguf::File::open(shared_path("vocab/ggml-vocab-llama-bpe.gguf"))->get_value("tokenizer.ggml.merges").size());
  EXPECT_EQ(model->tensors().size(), 3 + 32 * 9u);
  EXPECT_EQ(model->tensor("token_embd.weight").shape(), (std::vector<uint64_t>{4096, 128256}));
  EXPECT_EQ(model->tensor("blk.31.attn_k.weight").shape(), (std::vector<uint64_t>{4096, 1024}));
  EXPECT_EQ(model->tensor("blk.31.ffn_down.weight").shape(), (std::vector<uint64_t>{14336, 4096}));
  EXPECT_EQ(model->tensor("output.weight").type(), TensorType::Q6_K);
  for (int layer = 0; layer < 32; ++layer) {
    const TensorType expected = q4_k_m_more_bits_type(layer, 32);
    EXPECT_EQ(model->tensor(fmt::format("blk.{}.attn_v.weight", layer)).type(), expected) << layer;
    EXPECT_EQ(model->tensor(fmt::format("blk.{}.ffn_down.weight", layer)).type(), expected) << layer;
    EXPECT_EQ(model->tensor(fmt::format("blk.{}.attn_q.weight", layer)).type(), TensorType::Q4_K) << layer;
  }
  EXPECT_EQ(model->tensor("blk.0.ffn_norm.weight").type(), TensorType::F32);
  uint64_t parameters = 0;
  for (const auto& tensor : model->tensors()) parameters += tensor.elements();
  EXPECT_EQ(parameters, 8030261248u);  // Llama 3 8B's published count
}

// Llama 3.2 1B ties its output to token_embd, which then gets the output's type.
TEST_F(GenModelTest, Llama3_1BTiesItsEmbeddings) {
  const auto model = generate("1b.gguf", fmt::format("--shape llama3-1b --type Q4_K_M --sparse {}", kLlama3Vocab));
  EXPECT_EQ(model->find_tensor("output.weight"), nullptr);
  EXPECT_EQ(model->tensor("token_embd.weight").type(), TensorType::Q6_K);
  EXPECT_EQ(model->tensor("blk.15.ffn_up.weight").shape(), (std::vector<uint64_t>{2048, 8192}));
  uint64_t parameters = 0;
  for (const auto& tensor : model->tensors()) parameters += tensor.elements();
  EXPECT_EQ(parameters, 1235814400u);  // Llama 3.2 1B's published count
}

// The other families at full size, header only. Qwen 2.5 7B: q, k and v with biases, 7 query heads per KV head.
TEST_F(GenModelTest, Qwen25_7BHasQkvBiases) {
  const auto model = generate("qwen.gguf", fmt::format("--shape qwen2.5-7b --type Q4_K_M --sparse {}", kLlama3Vocab));
  EXPECT_EQ(model->architecture(), "qwen2");
  EXPECT_EQ(model->get<uint32_t>("qwen2.embedding_length"), 3584u);
  EXPECT_EQ(model->get<uint32_t>("qwen2.attention.head_count_kv"), 4u);
  EXPECT_EQ(model->get<uint32_t>("qwen2.context_length"), 32768u);
  EXPECT_EQ(model->get<float>("qwen2.rope.freq_base"), 1e6f);
  EXPECT_EQ(model->get<float>("qwen2.attention.layer_norm_rms_epsilon"), 1e-6f);
  EXPECT_EQ(model->tensors().size(), 3 + 28 * 12u);
  EXPECT_EQ(model->tensor("blk.27.attn_k.weight").shape(), (Shape{3584, 512}));
  EXPECT_EQ(model->tensor("blk.27.ffn_up.weight").shape(), (Shape{3584, 18944}));
  for (const auto& [bias, size] : {std::pair{"attn_q.bias", 3584u}, {"attn_k.bias", 512u}, {"attn_v.bias", 512u}}) {
    const gguf::TensorInfo& tensor = model->tensor(fmt::format("blk.3.{}", bias));
    EXPECT_EQ(tensor.type(), TensorType::F32) << bias;
    EXPECT_EQ(tensor.shape(), (Shape{size})) << bias;
  }
  EXPECT_EQ(model->tensor("output.weight").type(), TensorType::Q6_K);
  // Qwen2.5 7B's published 7615616512 parameters, less its 152064-token embeddings and output.
  const uint64_t embeddings = 2 * 3584 * model->get<uint32_t>("qwen2.vocab_size");
  EXPECT_EQ(parameters(*model) - embeddings, 7615616512u - 2 * 3584 * 152064u);

  const model::ModelConfig c = loaded_config(path("qwen.gguf"));
  EXPECT_EQ(c.architecture, "qwen2");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rope_dims, 128);
  EXPECT_EQ(c.n_ff, 18944);
  EXPECT_FALSE(c.tied_embeddings);
}

// Qwen 3 8B: per-head q and k norms, the head size in its own keys; read through `inspect --json`.
TEST_F(GenModelTest, Qwen3_8BHasQkNormsAndHeadSizeKeys) {
  generate("qwen3.gguf", fmt::format("--shape qwen3-8b --type Q4_K_M --sparse {}", kLlama3Vocab));
  const json out = json::parse(run_ok(fmt::format("inspect --json '{}'", path("qwen3.gguf"))));
  EXPECT_EQ(out["architecture"], "qwen3");
  const json& keys = out["metadata"];
  EXPECT_EQ(keys["qwen3.embedding_length"], 4096);
  EXPECT_EQ(keys["qwen3.block_count"], 36);
  EXPECT_EQ(keys["qwen3.attention.head_count"], 32);
  EXPECT_EQ(keys["qwen3.attention.head_count_kv"], 8);
  EXPECT_EQ(keys["qwen3.attention.key_length"], 128);
  EXPECT_EQ(keys["qwen3.attention.value_length"], 128);
  EXPECT_EQ(keys["qwen3.feed_forward_length"], 12288);
  EXPECT_EQ(keys["qwen3.context_length"], 40960);
  EXPECT_EQ(keys["qwen3.rope.freq_base"], 1e6);
  EXPECT_FLOAT_EQ(keys["qwen3.attention.layer_norm_rms_epsilon"].get<float>(), 1e-6f);
  EXPECT_EQ(keys["general.file_type"], 15);
  std::map<std::string, json> tensors;
  for (const json& tensor : out["tensors"]) tensors[tensor["name"]] = tensor;
  EXPECT_EQ(tensors.size(), 3 + 36 * 11u);
  for (const char* norm : {"blk.0.attn_q_norm.weight", "blk.35.attn_k_norm.weight"}) {
    EXPECT_EQ(tensors[norm]["type"], "F32") << norm;
    EXPECT_EQ(tensors[norm]["shape"], json::array({128})) << norm;
  }
  EXPECT_EQ(tensors["blk.35.attn_q.weight"]["shape"], json::array({4096, 4096}));
  EXPECT_EQ(tensors["blk.35.attn_q.weight"]["type"], "Q4_K");
  EXPECT_EQ(tensors["blk.35.attn_v.weight"]["type"], "Q6_K");
  EXPECT_EQ(tensors["output.weight"]["type"], "Q6_K");
  // Qwen3 8B's published 8190735360 parameters, less its 151936-token embeddings and output.
  EXPECT_EQ(out["parameters"].get<uint64_t>() - 2 * 4096 * keys["qwen3.vocab_size"].get<uint64_t>(),
            8190735360u - 2 * 4096 * 151936u);

  const model::ModelConfig c = loaded_config(path("qwen3.gguf"));
  EXPECT_EQ(c.architecture, "qwen3");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.q_dim(), 4096);
  EXPECT_EQ(c.kv_dim(), 1024);
}

// Phi-3 mini: q, k and v in one attn_qkv, gate and up in one ffn_up; attn_qkv takes attn_v's types, as in
// llama.cpp's quantizer (shared/arch/models/synth-phi3-Q4_K_M.gguf is its output).
TEST_F(GenModelTest, Phi3MiniFusesQkvAndGateUp) {
  const auto model = generate("phi3.gguf", fmt::format("--shape phi3-mini --type Q4_K_M --sparse {}", kPhi3Vocab));
  EXPECT_EQ(model->architecture(), "phi3");
  EXPECT_EQ(model->get<uint32_t>("phi3.attention.head_count_kv"), 32u);
  EXPECT_EQ(model->get<uint32_t>("phi3.rope.dimension_count"), 96u);
  EXPECT_EQ(model->get<float>("phi3.rope.freq_base"), 10000.0f);
  EXPECT_EQ(model->get<float>("phi3.attention.layer_norm_rms_epsilon"), 1e-5f);
  EXPECT_EQ(model->get<uint32_t>("phi3.context_length"), 4096u);
  EXPECT_EQ(model->tensors().size(), 3 + 32 * 6u);
  EXPECT_EQ(model->find_tensor("blk.0.attn_q.weight"), nullptr);
  EXPECT_EQ(model->find_tensor("blk.0.ffn_gate.weight"), nullptr);
  EXPECT_EQ(model->tensor("blk.31.attn_qkv.weight").shape(), (Shape{3072, 9216}));
  EXPECT_EQ(model->tensor("blk.31.ffn_up.weight").shape(), (Shape{3072, 16384}));
  for (int layer = 0; layer < 32; ++layer) {
    const TensorType expected = q4_k_m_more_bits_type(layer, 32);
    EXPECT_EQ(model->tensor(fmt::format("blk.{}.attn_qkv.weight", layer)).type(), expected) << layer;
    EXPECT_EQ(model->tensor(fmt::format("blk.{}.ffn_down.weight", layer)).type(), expected) << layer;
    EXPECT_EQ(model->tensor(fmt::format("blk.{}.ffn_up.weight", layer)).type(), TensorType::Q4_K) << layer;
  }
  EXPECT_EQ(model->tensor("output.weight").type(), TensorType::Q6_K);
  EXPECT_EQ(model->get_value("tokenizer.ggml.tokens").size(), 32064u);
  EXPECT_EQ(parameters(*model), 3821079552u);  // Phi-3 mini's published count

  const model::ModelConfig c = loaded_config(path("phi3.gguf"));
  EXPECT_EQ(c.architecture, "phi3");
  EXPECT_EQ(c.head_dim, 96);
  EXPECT_EQ(c.rope_dims, 96);
  EXPECT_EQ(c.n_ff, 8192);
}

// Gemma 3 12B: heads of 256 (16 x 256 > 3840), q/k norms, norms of the attention and FFN outputs, sliding
// windows on five layers of six with their own rope base, and token_embd doubling as the output.
TEST_F(GenModelTest, Gemma3_12BHasSlidingWindowsPostNormsAndTiedOutput) {
  const auto model = generate("gemma3.gguf", fmt::format("--shape gemma3-12b --type Q4_K_M --sparse {}", kTinyVocab));
  EXPECT_EQ(model->architecture(), "gemma3");
  EXPECT_EQ(model->get<uint32_t>("gemma3.attention.key_length"), 256u);
  EXPECT_EQ(model->get<uint32_t>("gemma3.attention.value_length"), 256u);
  EXPECT_EQ(model->get<uint32_t>("gemma3.attention.sliding_window"), 1024u);
  EXPECT_EQ(model->get<uint32_t>("gemma3.attention.sliding_window_pattern"), 6u);
  EXPECT_EQ(model->get<float>("gemma3.rope.freq_base"), 1e6f);
  EXPECT_EQ(model->get<float>("gemma3.rope.freq_base_swa"), 1e4f);
  EXPECT_EQ(model->get<float>("gemma3.attention.layer_norm_rms_epsilon"), 1e-6f);
  EXPECT_EQ(model->tensors().size(), 2 + 48 * 13u);
  EXPECT_EQ(model->find_tensor("output.weight"), nullptr);
  EXPECT_EQ(model->tensor("token_embd.weight").type(), TensorType::Q6_K);
  EXPECT_EQ(model->tensor("blk.47.attn_q.weight").shape(), (Shape{3840, 4096}));
  EXPECT_EQ(model->tensor("blk.47.attn_k.weight").shape(), (Shape{3840, 2048}));
  EXPECT_EQ(model->tensor("blk.47.attn_output.weight").shape(), (Shape{4096, 3840}));
  EXPECT_EQ(model->tensor("blk.47.attn_k_norm.weight").shape(), (Shape{256}));
  for (const char* norm : {"post_attention_norm.weight", "post_ffw_norm.weight"}) {
    const gguf::TensorInfo& tensor = model->tensor(fmt::format("blk.0.{}", norm));
    EXPECT_EQ(tensor.shape(), (Shape{3840})) << norm;
    EXPECT_EQ(tensor.type(), TensorType::F32) << norm;
  }

  const model::ModelConfig c = loaded_config(path("gemma3.gguf"));
  EXPECT_EQ(c.architecture, "gemma3");
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.sliding_window, 1024);
  EXPECT_EQ(c.sliding_pattern, 6);
  EXPECT_EQ(c.rope_base, 1e6f);
  EXPECT_EQ(c.rope_base_sliding, 1e4f);
  EXPECT_TRUE(c.tied_embeddings);
}

}  // namespace
}  // namespace rf::test
