// Every numeric option's range: each value outside it is one `error:` line naming the option and its range and an
// exit status (never a signal: `run --threads 100000` aborted with "terminate called", `--temp nan` and `--top-p 7`
// were taken); the edges inside it run.
#include <algorithm>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/cli_run.h"

namespace rf::test {
namespace {

class OptionsTest : public CliTest {
 protected:
  const std::string model_ = model_path("stories260K.gguf");  // a context of 2048 positions
  const std::string run_ = fmt::format("run -m '{}' -p 'Once upon a time' ", model_);

  struct BadValue {
    std::string args;     // after `command`
    std::string mention;  // what the error line must say: the option and its range
  };

  // Each bad value is refused with one line, "error: ...", and an exit status (expect_error): no "terminate
  // called" line, no signal.
  void expect_refused(const std::string& command, const std::vector<BadValue>& table) const {
    for (const BadValue& bad : table) expect_error(command + bad.args, bad.mention);
  }
};

// The most threads a --threads option takes: four per hardware thread.
int max_threads() { return 4 * std::max(1, static_cast<int>(std::thread::hardware_concurrency())); }

TEST_F(OptionsTest, RunRefusesEachValueOutOfRange) {
  const std::string threads = fmt::format("--threads: must be an integer in [0, {}]", max_threads());
  const std::string temperature = "--temp: temperature must be finite and at least 0 (0: greedy), got ";
  const std::string top_p = "--top-p: top-p must be positive and at most 1 (1: off), got ";
  expect_refused(run_, {
                           {"--threads 100000", threads + ", got 100000"},
                           {"--threads -1", threads + ", got -1"},
                           {fmt::format("-t {}", max_threads() + 1), threads},
                           {"--threads 2.5", threads + ", got 2.5"},
                           {"--temp nan", temperature + "nan"},
                           {"--temp -1", temperature + "-1"},
                           {"--temp inf", temperature + "inf"},
                           {"--temp -inf", temperature + "-inf"},
                           {"--temp 1e39", "--temp: must be a finite number, got 1e39"},
                           {"--temp warm", "--temp: must be a finite number, got warm"},
                           {"--top-p 7", top_p + "7"},
                           {"--top-p 0", top_p + "0"},
                           {"--top-p nan", top_p + "nan"},
                           {"--min-p 2", "--min-p: min-p must be in [0, 1] (0: off), got 2"},
                           {"--min-p -0.5", "--min-p: min-p must be in [0, 1] (0: off), got -0.5"},
                           {"--top-k -5", "--top-k: top-k must be at least 0 (0: off), got -5"},
                           {"--top-k 3000000000", "--top-k: must be an integer in [-2147483648, 2147483647]"},
                           {"--repeat-penalty 0", "--repeat-penalty: repeat penalty must be positive and finite"},
                           {"--repeat-penalty inf", "--repeat-penalty: repeat penalty must be positive and finite"},
                           {"--repeat-last-n -2", "--repeat-last-n: penalty window must be -1 (all), 0 (off)"},
                           {"--frequency-penalty nan", "--frequency-penalty: frequency penalty must be in [-2, 2]"},
                           {"--presence-penalty 2.5", "--presence-penalty: presence penalty must be in [-2, 2]"},
                           {"--seed -1", "--seed: must be an integer in [0, 18446744073709551615], got -1"},
                           {"--seed 18446744073709551616", "--seed: must be an integer in [0, 18446744073709551615]"},
                           {"-c -3", "--ctx: must be an integer in [0, 9223372036854775807], got -3"},
                           {"-c 1000000000000", "--ctx 1000000000000 is more than the model's context of 2048"},
                           {"-c 2049", "--ctx 2049 is more than the model's context of 2048 positions"},
                           {"-n -5", "--n-predict: must be an integer in [-1, 9223372036854775807], got -5"},
                           {"--gpu-layers -2", "--gpu-layers: must be an integer in [0, 9223372036854775807]"},
                       });
}

TEST_F(OptionsTest, RunTakesTheEdgesOfEachRange) {
  const std::vector<std::string> edges = {"--temp 0", "--top-p 1", "--top-p 1e-30", "--min-p 0", "--min-p 1",
                                          "--top-k 0", "--threads 0", "--threads 1",
                                          fmt::format("--threads {}", max_threads()), "--repeat-penalty 1e-3",
                                          "--repeat-last-n -1", "--repeat-last-n 0", "--frequency-penalty -2",
                                          "--presence-penalty 2", "--seed 0", "--seed 18446744073709551615",
                                          "--gpu-layers 0"};
  for (const std::string& edge : edges) {
    SCOPED_TRACE(edge);
    const RunResult result = run(run_ + "-n 2 " + edge);
    EXPECT_EQ(result.status, 0) << result.err;
  }
  // No tokens, tokens until a context of 64 is full, and the model's whole context.
  for (const char* edge : {"-n 0", "-n -1 --ctx 64", "-n 1 --ctx 2048"}) {
    SCOPED_TRACE(edge);
    const RunResult result = run(run_ + edge);
    EXPECT_EQ(result.status, 0) << result.err;
  }
}

TEST_F(OptionsTest, ChatHasRunsRanges) {
  expect_refused(fmt::format("chat -m '{}' ", model_),
                 {{"--top-p 7", "--top-p: top-p must be positive and at most 1"},
                  {"--threads 100000", "--threads: must be an integer in [0, "},
                  {"-c 4096", "--ctx 4096 is more than the model's context of 2048 positions"}});
}

TEST_F(OptionsTest, BenchPerplexityAndEvalRefuseValuesOutOfRange) {
  expect_refused(fmt::format("bench -m '{}' ", model_),
                 {{"-r 0", "--repetitions: must be an integer in [1, 2147483647], got 0"},
                  {"-p -1", "--n-prompt: must be an integer in [0, 9223372036854775807], got -1"},
                  {"-n -1", "--n-gen: must be an integer in [0, 9223372036854775807], got -1"},
                  {"-p 100000 -n 8", "the longer of -p 100000 and -n 8 is more than the model's context of 2048"},
                  {"-t 100000", "--threads: must be an integer in [0, "}});
  std::ofstream(path("text.txt")) << "Once upon a time there was a little dog.\n";
  expect_refused(fmt::format("perplexity -m '{}' -f '{}' ", model_, path("text.txt")),
                 {{"-c 3", "--ctx: must be an integer in [4, 9223372036854775807], got 3"},
                  {"-c 4096", "--ctx 4096 is more than the model's context of 2048 positions"},
                  {"-c 64 --chunks 0", "--chunks: must be -1 (all) or an integer >= 1, got 0"},
                  {"-c 64 --chunks -2", "--chunks: must be -1 (all) or an integer >= 1, got -2"},
                  {"-t -1", "--threads: must be an integer in [0, "}});
  expect_refused(fmt::format("eval -m '{}' -p 'Once' --out '{}' ", model_, path("eval")),
                 {{"-n 0", "--tokens: must be an integer in [1, 2147483647], got 0"},
                  {"-n 99999999999", "--tokens: must be an integer in [1, 2147483647], got 99999999999"},
                  {"-n 3000", "2 prompt tokens + 3000 generated is more than the model's context of 2048"},
                  {"-n 2 --threads -1", "--threads: must be an integer in [0, "}});
}

TEST_F(OptionsTest, BenchTakesNothingToRun) {
  const RunResult result = run(fmt::format("bench -m '{}' -p 0 -n 0 -r 1", model_));
  EXPECT_EQ(result.status, 0) << result.err;
}

TEST_F(OptionsTest, QuantizeAndGenModelRefuseValuesOutOfRange) {
  expect_refused(fmt::format("quantize '{}' '{}' Q8_0 ", model_, path("q.gguf")),
                 {{"--threads 100000", "--threads: must be an integer in [0, "}});
  expect_refused(fmt::format("gen-model --shape tiny-256 --type Q8_0 --vocab '{}' '{}' ", model_, path("g.gguf")),
                 {{"--seed -1", "--seed: must be an integer in [0, 18446744073709551615], got -1"},
                  {"--seed 0x10", "--seed: must be an integer in [0, 18446744073709551615], got 0x10"},
                  {"--threads 100000", "--threads: must be an integer in [0, "}});
  EXPECT_FALSE(fs::exists(path("q.gguf")));
  EXPECT_FALSE(fs::exists(path("g.gguf")));
}

}  // namespace
}  // namespace rf::test
