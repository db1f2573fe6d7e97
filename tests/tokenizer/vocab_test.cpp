// llama.cpp's tokenizer test vectors: every string of each ../shared/vocab set must give exactly its ids.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "test_paths.h"
#include "tokenizer/tokenizer.h"

namespace rf {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << "cannot open " << path;
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

struct VocabCase {
  std::string text;
  std::vector<int32_t> ids;
};

// .inp: strings each followed by "\n__ggml_vocab_test__\n"; .out: one line of ids per string.
std::vector<VocabCase> read_cases(const std::string& vocab_path) {
  const std::string inputs = read_file(vocab_path + ".inp");
  const std::string separator = "\n__ggml_vocab_test__\n";
  std::vector<VocabCase> cases;
  for (size_t begin = 0, end; (end = inputs.find(separator, begin)) != std::string::npos;
       begin = end + separator.size()) {
    cases.push_back({inputs.substr(begin, end - begin), {}});
  }
  std::istringstream outputs(read_file(vocab_path + ".out"));
  std::string line;
  for (VocabCase& c : cases) {
    EXPECT_TRUE(std::getline(outputs, line)) << "fewer lines of ids than strings";
    std::istringstream ids(line);
    for (int32_t id; ids >> id;) c.ids.push_back(id);
  }
  return cases;
}

std::string ids_to_string(const std::vector<int32_t>& ids) {
  std::string out;
  for (int32_t id : ids) out += " " + std::to_string(id);
  return out;
}

class VocabTest : public testing::TestWithParam<std::string> {};

TEST_P(VocabTest, EveryStringGivesItsExpectedIds) {
  const std::string path = test::shared_path("vocab/ggml-vocab-" + GetParam() + ".gguf");
  const Tokenizer tokenizer(*gguf::File::open(path));
  const std::vector<VocabCase> cases = read_cases(path);
  ASSERT_EQ(cases.size(), 46u);
  int mismatches = 0;
  for (const VocabCase& c : cases) {
    const std::vector<int32_t> ids = tokenizer.encode(c.text, /*add_special=*/false, /*parse_special=*/false);
    if (ids != c.ids) {
      ++mismatches;
      ADD_FAILURE() << "text '" << c.text << "'\n  expected" << ids_to_string(c.ids) << "\n  got     "
                    << ids_to_string(ids);
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << cases.size() << " strings";
}

// Byte fallback (SentencePiece) and byte-level BPE can spell any text, so decoding gives the input back.
TEST_P(VocabTest, DecodeInvertsEncode) {
  const std::string path = test::shared_path("vocab/ggml-vocab-" + GetParam() + ".gguf");
  const Tokenizer tokenizer(*gguf::File::open(path));
  for (const VocabCase& c : read_cases(path)) {
    EXPECT_EQ(tokenizer.decode(tokenizer.encode(c.text, true, false)), c.text);
  }
}

INSTANTIATE_TEST_SUITE_P(SharedVocabs, VocabTest,
                         testing::Values("llama-spm", "phi-3", "llama-bpe", "gpt-2", "deepseek-llm", "starcoder"),
                         [](const testing::TestParamInfo<std::string>& param_info) {
                           std::string name = param_info.param;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace rf
