// `rocmforge run`: text on stdout (greedy text equal to llama.cpp's continuation), speeds on stderr, and one
// error line for a prompt longer than the context or a file without weights.
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/cli_run.h"
#include "model_variant.h"
#include "tokenizer/tokenizer.h"

namespace rf::test {
namespace {

const std::string kStories = model_path("stories260K.gguf");

class RunTest : public CliTest {};

TEST_F(RunTest, StreamsTextAndReportsSpeeds) {
  const RunResult result = run("run -m '" + kStories + "' -p 'Once upon a time' -n 16 --seed 7 --ctx 64");
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_EQ(result.out.rfind("Once upon a time", 0), 0u) << result.out;
  EXPECT_GT(result.out.size(), std::string("Once upon a time").size() + 8) << result.out;
  EXPECT_NE(result.err.find("backend: "), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("load: "), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("prompt: 5 tokens"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("decode: 15 tokens"), std::string::npos) << result.err;
}

TEST_F(RunTest, GreedyTextIsLlamaCppsContinuation) {
  const nlohmann::json ref = nlohmann::json::parse(std::ifstream(shared_path("reference/stories260K.p1.json")));
  const auto greedy = ref.at("greedy_tokens").get<std::vector<int32_t>>();
  const auto file = gguf::File::open(kStories);
  const Tokenizer tokenizer(*file);
  Detokenizer detokenizer(tokenizer);
  std::string expected = ref.at("prompt").get<std::string>();
  for (const int32_t token : greedy) expected += detokenizer.push(token);
  expected += detokenizer.flush() + "\n";

  const RunResult result =
      run("run -m '" + kStories + "' -p 'Once upon a time' --temp 0 -n " + std::to_string(greedy.size()));
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_EQ(result.out, expected);
}

TEST_F(RunTest, PromptLongerThanTheContext) {
  expect_error("run -m '" + kStories + "' -p 'Once upon a time there was a dog' --ctx 4",
               "does not fit the context of 4");
}

TEST_F(RunTest, UnsupportedArchitectureAndMissingTensor) {
  const TempModel mamba("stories260K",
                        ModelEdits().edit_keys([](gguf::Writer& w) { w.set_string("general.architecture", "mamba"); }));
  expect_error("run -m '" + mamba.path() + "' -p 'Hello'",
               "architecture 'mamba' is not supported (supported: llama, qwen2, qwen3, gemma, gemma2, gemma3, phi2, "
               "phi3, gpt2, glm4, chatglm)");
  const TempModel no_norm("stories260K", ModelEdits().drop_tensor("output_norm.weight"));
  expect_error("run -m '" + no_norm.path() + "' -p 'Hello'",
               "tensor 'output_norm.weight' is missing (the llama architecture needs it)");
  const TempModel no_bias(shared_path("arch/models/synth-qwen2-Q4_K_M.gguf"),
                          ModelEdits().drop_tensor("blk.1.attn_k.bias"));
  expect_error("run -m '" + no_bias.path() + "' -p 'Hello'",
               "tensor 'blk.1.attn_k.bias' is missing (the qwen2 architecture needs it)");
}

TEST_F(RunTest, VocabularyOnlyFile) {
  expect_error("run -m '" + shared_path("vocab/ggml-vocab-llama-spm.gguf") + "' -p 'Hello'", "no tensors");
}

}  // namespace
}  // namespace rf::test
