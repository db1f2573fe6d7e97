// `rocmforge bench --json`: one object with the fields tools read.
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

}  // namespace
}  // namespace rf::test
