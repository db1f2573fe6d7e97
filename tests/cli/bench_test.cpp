// `rocmforge bench --json`: one object with the fields tools read; `bench --parallel`, llama-batched-bench's rows.
#include <nlohmann/json.hpp>

#include "cli/cli_run.h"

namespace rf::test {
namespace {

using BenchTest = CliTest;

TEST_F(BenchTest, JsonHasEveryField) {
  const RunResult result = run("bench -m '" + model_path("stories260K.gguf") + "' -p 32 -n 8 -r 2 --json");
  ASSERT_EQ(result.status, 0) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  for (const char* key : {"model", "size_bytes", "params", "backend", "threads", "tests", "load"})
    EXPECT_TRUE(json.contains(key)) << key;
  EXPECT_EQ(json.at("backend"), "CPU");
  EXPECT_GT(json.at("size_bytes").get<uint64_t>(), 0u);
  EXPECT_GT(json.at("params").get<uint64_t>(), 0u);
  const nlohmann::json& tests = json.at("tests");
  ASSERT_EQ(tests.size(), 2u);
  EXPECT_EQ(tests[0].at("test"), "pp32");
  EXPECT_EQ(tests[1].at("test"), "tg8");
  for (const nlohmann::json& test : tests) {
    EXPECT_GT(test.at("tokens_per_s").get<double>(), 0.0);
    EXPECT_GE(test.at("std").get<double>(), 0.0);
  }
  EXPECT_GT(tests[1].at("gbps").get<double>(), 0.0);
  for (const char* key : {"open_ms", "ready_ms", "first_token_ms"}) EXPECT_GE(json.at("load").at(key).get<double>(), 0.0);
}

TEST_F(BenchTest, Table) {
  const std::string out = run_ok("bench -m '" + model_path("stories260K.gguf") + "' -p 16 -n 4 -r 1");
  EXPECT_NE(out.find("| model"), std::string::npos) << out;
  EXPECT_NE(out.find("pp16"), std::string::npos) << out;
  EXPECT_NE(out.find("tg4"), std::string::npos) << out;
  EXPECT_NE(out.find("first token"), std::string::npos) << out;
}

TEST_F(BenchTest, ParallelJsonHasARowPerBatch) {
  const RunResult result =
      run("bench -m '" + model_path("stories260K.gguf") + "' --parallel 1,4 -p 16 -n 8 -r 1 --device cpu --json");
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_EQ(result.err, "");
  const nlohmann::json json = nlohmann::json::parse(result.out);
  for (const char* key : {"model", "size_bytes", "params", "backend", "threads", "kv_positions"})
    EXPECT_TRUE(json.contains(key)) << key;
  EXPECT_EQ(json.at("backend"), "CPU");
  const nlohmann::json& rows = json.at("parallel");
  ASSERT_EQ(rows.size(), 2u);
  for (size_t i = 0; i < rows.size(); ++i) {
    const nlohmann::json& row = rows[i];
    const int64_t sequences = i == 0 ? 1 : 4;
    EXPECT_EQ(row.at("pl"), sequences);
    EXPECT_EQ(row.at("pp"), 16);
    EXPECT_EQ(row.at("tg"), 8);
    EXPECT_EQ(row.at("n_kv"), sequences * (16 + 8));
    for (const char* key : {"speed_pp", "speed_tg", "speed", "t_pp", "t_tg"})
      EXPECT_GT(row.at(key).get<double>(), 0.0) << key;
    EXPECT_DOUBLE_EQ(row.at("t").get<double>(), row.at("t_pp").get<double>() + row.at("t_tg").get<double>());
    // A decoding step's forward pass and sampling are parts of it.
    for (const char* key : {"step_ms", "forward_ms", "sampling_ms"}) EXPECT_GT(row.at(key).get<double>(), 0.0) << key;
    EXPECT_GE(row.at("step_ms").get<double>(),
              row.at("forward_ms").get<double>() + row.at("sampling_ms").get<double>());
  }
  // Every sequence of the largest row fits at once: 4 sequences of 24 positions in blocks of 16.
  EXPECT_EQ(json.at("kv_positions"), 4 * 32);
}

TEST_F(BenchTest, ParallelTable) {
  const std::string out = run_ok("bench -m '" + model_path("stories260K.gguf") + "' --parallel 2 -p 8 -n 4 -r 1");
  EXPECT_NE(out.find("|     PP |     TG |    B |   N_KV |"), std::string::npos) << out;
  EXPECT_NE(out.find("|      8 |      4 |    2 |     24 |"), std::string::npos) << out;
  EXPECT_NE(out.find("A decoding step, in ms"), std::string::npos) << out;
}

TEST_F(BenchTest, ParallelRefusesBadListsAndSizes) {
  const std::string bench = "bench -m '" + model_path("stories260K.gguf") + "' ";
  const std::string range = "--parallel: must be an integer in [1, 1024], got ";
  expect_error(bench + "--parallel 0", range + "0");
  expect_error(bench + "--parallel x", range + "x");
  expect_error(bench + "--parallel 1,2000", range + "2000");
  expect_error(bench + "--parallel 2 -p 0", "--parallel needs prompts of at least one token");
  expect_error(bench + "--parallel 2 -p 2000 -n 100", "a sequence of -p 2000 + -n 100 positions is more than");
  expect_error(bench + "--parallel 2 -p 16 -n 8 --ctx 20", "--ctx 20 cannot hold a sequence of -p 16 + -n 8");
  expect_error(bench + "--ctx 64", "--ctx requires --parallel");
}

// A KV cache too small for every sequence at once preempts some, says so, and still measures every row.
TEST_F(BenchTest, ParallelWithASmallContextPreempts) {
  const RunResult result =
      run("bench -m '" + model_path("stories260K.gguf") + "' --parallel 4 -p 16 -n 8 -r 1 --ctx 64 --json");
  ASSERT_EQ(result.status, 0) << result.err;
  EXPECT_NE(result.err.find("preempted"), std::string::npos) << result.err;
  const nlohmann::json json = nlohmann::json::parse(result.out);
  EXPECT_GT(json.at("parallel").at(0).at("speed_tg").get<double>(), 0.0);
}

}  // namespace
}  // namespace rf::test
