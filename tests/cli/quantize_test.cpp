// `rocmforge quantize`: the same types, mixes and bytes as llama.cpp's quantizer, fallbacks for rows that are
// not whole blocks, and values close to the source.
#include <cmath>

#include "cli/cli_run.h"
#include "quant/quant.h"

namespace rf::test {
namespace {

class QuantizeTest : public CliTest {
 protected:
  std::unique_ptr<gguf::File> quantize(const std::string& model, const std::string& type) {
    const std::string out = path(fmt::format("{}.{}.gguf", model, type));
    const std::string printed = run_ok(fmt::format("quantize '{}' '{}' {}", model_path(model), out, type));
    EXPECT_EQ(printed.rfind(fmt::format("wrote {}: ", out), 0), 0u) << printed;
    return gguf::File::open(out);
  }
};

std::vector<float> dequantized(const gguf::File& file, const gguf::TensorInfo& tensor) {
  std::vector<float> values(tensor.elements());
  quant::dequantize(tensor.type(), file.tensor_data(tensor).data(), values.data(), static_cast<int64_t>(values.size()));
  return values;
}

// The largest over tensors of |quantized - source| / |source| (root mean square of each).
double worst_relative_error(const gguf::File& quantized, const gguf::File& source) {
  double worst = 0;
  for (const auto& tensor : source.tensors()) {
    const std::vector<float> want = dequantized(source, tensor);
    const std::vector<float> got = dequantized(quantized, quantized.tensor(tensor.name));
    double error = 0, norm = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      error += (got[i] - want[i]) * (got[i] - want[i]);
      norm += want[i] * want[i];
    }
    worst = std::max(worst, std::sqrt(error / norm));
  }
  return worst;
}

uint32_t file_type(const gguf::File& file) { return file.get<uint32_t>("general.file_type"); }

std::string type_of(const gguf::File& file, const std::string& tensor) {
  return std::string(file.tensor(tensor).type_info->name);
}

struct TypeCase {
  const char* type;
  double max_error;  // worst relative error of a tensor, with a margin over what llama.cpp's bytes give
  bool cheap;        // quick enough for debug and sanitized builds
};
constexpr TypeCase kTypeCases[] = {
    {"F16", 0.001, true},   {"BF16", 0.005, true},   {"Q8_0", 0.01, true},    {"Q4_0", 0.12, true},
    {"Q4_1", 0.12, false},  {"Q5_0", 0.06, false},   {"Q5_1", 0.06, true},    {"Q2_K", 0.4, false},
    {"Q3_K_M", 0.2, true},  {"Q4_K_M", 0.12, false}, {"Q5_K_M", 0.06, false}, {"Q6_K", 0.03, false},
    {"IQ4_NL", 0.12, false}, {"IQ4_XS", 0.12, false},
};

// shared/models holds the synthetic model quantized by llama.cpp to each type: quantizing its F32 file here
// must give every key the same value and every tensor the same type and the very same bytes.
TEST_F(QuantizeTest, MatchesLlamaCppOnEverySharedQuantization) {
  const auto source = gguf::File::open(model_path("synth-tiny256-F32.gguf"));
  for (const TypeCase& c : kTypeCases) {
    if (!kOptimizedBuild && !c.cheap) continue;
    SCOPED_TRACE(c.type);
    const auto ours = quantize("synth-tiny256-F32.gguf", c.type);
    expect_same_model(*ours, *gguf::File::open(model_path(fmt::format("synth-tiny256-{}.gguf", c.type))));
    EXPECT_LT(worst_relative_error(*ours, *source), c.max_error);
  }
}

// stories260K has 64-element rows (not whole 256-element K blocks) and 172-element rows (not even whole
// 32-element blocks): llama.cpp falls back to Q5_0 for Q4_K, Q8_0 for Q6_K, and to F16 where nothing fits.
TEST_F(QuantizeTest, FallsBackWhereRowsAreNotWholeBlocks) {
  const auto pure = quantize("stories260K.gguf", "Q4_K");
  EXPECT_EQ(file_type(*pure), 15u);
  EXPECT_EQ(type_of(*pure, "blk.0.attn_q.weight"), "Q5_0");
  EXPECT_EQ(type_of(*pure, "blk.0.ffn_down.weight"), "F16");
  EXPECT_EQ(type_of(*pure, "output.weight"), "Q5_0");
  EXPECT_EQ(type_of(*pure, "blk.0.attn_norm.weight"), "F32");

  const auto mixed = quantize("stories260K.gguf", "Q4_K_M");
  EXPECT_EQ(type_of(*mixed, "output.weight"), "Q8_0");
  EXPECT_EQ(type_of(*mixed, "blk.1.attn_v.weight"), "Q5_0");  // Q4_K falls back
  EXPECT_EQ(type_of(*mixed, "blk.2.attn_v.weight"), "Q8_0");  // one of the layers given Q6_K, which falls back
  EXPECT_EQ(type_of(*mixed, "blk.0.ffn_down.weight"), "F16");
  const auto source = gguf::File::open(model_path("stories260K.gguf"));
  EXPECT_LT(worst_relative_error(*mixed, *source), 0.1);
}

// TinyStories ties its output to token_embd (no output.weight), so token_embd gets the output's type; the
// rest is requantized from Q8_0.
TEST_F(QuantizeTest, RequantizesAModelWithTiedEmbeddings) {
  const auto out = quantize("TinyStories-656K-Q8_0.gguf", "Q4_0");
  EXPECT_EQ(file_type(*out), 2u);
  EXPECT_EQ(type_of(*out, "token_embd.weight"), "Q8_0");  // Q6_K, which 128-element rows cannot hold
  EXPECT_EQ(type_of(*out, "blk.0.ffn_up.weight"), "Q4_0");
  EXPECT_EQ(type_of(*out, "blk.0.attn_norm.weight"), "F32");
  const auto source = gguf::File::open(model_path("TinyStories-656K-Q8_0.gguf"));
  EXPECT_LT(worst_relative_error(*out, *source), 0.2);
  for (const auto& kv : source->metadata()) {
    if (kv.key != "general.file_type") {
      EXPECT_TRUE(same_value(out->get_value(kv.key), kv.value)) << kv.key;
    }
  }
}

}  // namespace
}  // namespace rf::test
