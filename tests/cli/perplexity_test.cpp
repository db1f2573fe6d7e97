// `rocmforge perplexity`: the running estimate per chunk and llama.cpp's final line.
#include <fstream>
#include <regex>

#include "cli/cli_run.h"

namespace rf::test {
namespace {

using PerplexityTest = CliTest;

TEST_F(PerplexityTest, PrintsChunksAndFinalEstimate) {
  // The start of wikitext-2 is text enough for three chunks of 64 and keeps the test quick.
  std::ofstream(path("wiki.txt"), std::ios::binary) << read_text(shared_path("data/wiki.test.raw")).substr(0, 4000);
  const RunResult result =
      run("perplexity -m '" + model_path("stories260K.gguf") + "' -f '" + path("wiki.txt") + "' -c 64 --chunks 3");
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_TRUE(std::regex_search(result.out, std::regex(R"(^\[1\][0-9]+\.[0-9]{4},\[2\][0-9]+\.[0-9]{4},\[3\][0-9]+\.[0-9]{4},\n)")))
      << result.out;
  EXPECT_TRUE(std::regex_search(result.out, std::regex(R"(\nFinal estimate: PPL = [0-9]+\.[0-9]{4} \+/- [0-9]+\.[0-9]{5}\n$)")))
      << result.out;
}

TEST_F(PerplexityTest, TooShortText) {
  std::ofstream(path("short.txt")) << "Once upon a time";
  expect_error("perplexity -m '" + model_path("stories260K.gguf") + "' -f '" + path("short.txt") + "' -c 64",
               "needs at least 128");
}

}  // namespace
}  // namespace rf::test
