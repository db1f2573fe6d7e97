#include "tokenizer/pre_tokenizer.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "util/error.h"

namespace rf {
namespace {

using Words = std::vector<std::string_view>;

std::string join(const Words& words) {
  std::string out;
  for (std::string_view word : words) out += word;
  return out;
}

TEST(PreTokenizer, SplitsLikeTheGpt2Regex) {
  const PreTokenizer gpt2("gpt-2");
  EXPECT_EQ(gpt2.split("Hello world's  end!!\n"), (Words{"Hello", " world", "'s", " ", " end", "!!", "\n"}));
}

TEST(PreTokenizer, Llama3KeepsDigitsInThreesAndNewlinesApart) {
  const PreTokenizer llama3("llama-bpe");
  EXPECT_TRUE(llama3.ignore_merges());
  EXPECT_EQ(llama3.split("x 1234567\n\n  y"), (Words{"x", " ", "123", "456", "7", "\n\n", " ", " y"}));
}

TEST(PreTokenizer, AnEmptyMatchCutsTheText) {
  // superbpe's second regex is a bare lookahead that marks where digit groups of three begin.
  const PreTokenizer superbpe("superbpe");
  EXPECT_EQ(superbpe.split("1234567 89"), (Words{"1", "234", "567", " ", "89"}));
}

TEST(PreTokenizer, InvalidUtf8BecomesWordsOfItsOwn) {
  const PreTokenizer gpt2("gpt-2");
  EXPECT_EQ(gpt2.split("ab\xFF\xFE" "cd \xC3"), (Words{"ab", "\xFF\xFE", "cd", " ", "\xC3"}));
}

TEST(PreTokenizer, UnknownNameIsAnError) {
  EXPECT_THROW(PreTokenizer("no-such-pre"), Error);
}

// Every family compiles, and its words cover any input exactly, long runs included.
TEST(PreTokenizer, EveryFamilyCoversAnyInput) {
  std::mt19937 rng(7);
  std::vector<std::string> inputs = {
      "", "Hello, World! It's 2024-01-01 \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\xA6\x99 caf\xC3\xA9\r\n\tend  ",
      std::string(100000, 'a'), std::string(100000, ' '), std::string(20000, '7'),
  };
  std::string random(5000, '\0');
  for (char& c : random) c = static_cast<char>(rng());
  inputs.push_back(random);
  for (std::string_view name : PreTokenizer::known_names()) {
    const PreTokenizer pre(name);
    for (const std::string& input : inputs) {
      const Words words = pre.split(input);
      EXPECT_EQ(join(words), input) << name;
      for (std::string_view word : words) EXPECT_FALSE(word.empty()) << name;
    }
  }
}

}  // namespace
}  // namespace rf
