// `rocmforge tokenize`: ids of -p text, and the --jsonl protocol checked against llama.cpp's tokenizer test
// vectors (tokenized without BOS, as the vectors were).
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/cli_run.h"

namespace rf::test {
namespace {

class TokenizeTest : public CliTest {};

TEST_F(TokenizeTest, PromptWithBos) {
  // stories260K's tokenizer, as llama.cpp tokenized the reference prompt.
  EXPECT_EQ(run_ok("tokenize -m '" + model_path("stories260K.gguf") + "' -p 'Once upon a time'"), "1 403 407 261 378\n");
  EXPECT_EQ(run_ok("tokenize -m '" + model_path("stories260K.gguf") + "' -p 'Once upon a time' --no-bos"),
            "403 407 261 378\n");
}

TEST_F(TokenizeTest, JsonlMatchesTheVocabTestVectors) {
  const std::string vocab = shared_path("vocab/ggml-vocab-llama-spm.gguf");
  const std::string inputs = read_text(vocab + ".inp");
  const std::string separator = "\n__ggml_vocab_test__\n";
  std::string jsonl;
  for (size_t begin = 0, end; (end = inputs.find(separator, begin)) != std::string::npos; begin = end + separator.size())
    jsonl += nlohmann::json(inputs.substr(begin, end - begin)).dump() + "\n";

  const RunResult result = run("tokenize -m '" + vocab + "' --jsonl --no-bos", jsonl);
  ASSERT_EQ(result.status, 0) << result.err;
  const std::vector<std::string> expected = lines(read_text(vocab + ".out"));
  const std::vector<std::string> actual = lines(result.out);
  ASSERT_EQ(actual.size(), lines(jsonl).size());
  ASSERT_GE(expected.size(), actual.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    std::vector<int32_t> ids;
    std::istringstream line(expected[i]);
    for (int32_t id; line >> id;) ids.push_back(id);
    EXPECT_EQ(nlohmann::json::parse(actual[i]).get<std::vector<int32_t>>(), ids) << "string " << i;
  }
}

TEST_F(TokenizeTest, JsonlRejectsWhatIsNotAString) {
  const RunResult result =
      run("tokenize -m '" + model_path("stories260K.gguf") + "' --jsonl", "\"fine\"\n[1, 2]\n");
  EXPECT_NE(result.status, 0);
  EXPECT_NE(result.err.find("error: line 2 of stdin is not a JSON string"), std::string::npos) << result.err;
}

}  // namespace
}  // namespace rf::test
