// `rocmforge gen-model`: llama.cpp's layout and types for a shape, the tokenizer copied, N(0, 0.02) weights,
// the same bytes whatever the thread count, and full-size shapes written sparse.
#include <cmath>

#include <fmt/format.h>

#include "cli/cli_run.h"
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

const std::string kTinyVocab = fmt::format("--vocab '{}'", model_path("stories260K.gguf"));
const std::string kLlama3Vocab = fmt::format("--vocab '{}'", shared_path("vocab/ggml-vocab-llama-bpe.gguf"));

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
  // Q4_K_M gives attn_v and ffn_down Q6_K in the first and last eighth of the layers and every third between.
  for (int layer = 0; layer < 32; ++layer) {
    const bool more_bits = layer < 4 || layer >= 28 || (layer - 4) % 3 == 2;
    const TensorType expected = more_bits ? TensorType::Q6_K : TensorType::Q4_K;
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

}  // namespace
}  // namespace rf::test
