// `--device auto|cpu|gpu` (and its synonym `--gpu`) on every command that runs a model: stderr names the
// backend, a device that does not exist is one error line, and where a GPU is present it generates the CPU's
// greedy text, the CPU's perplexity and the CPU's eval tokens (those tests skip without a GPU), also with
// `--gpu-layers` keeping the first layers on the CPU.
#include <iostream>
#include <regex>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/cli_run.h"
#include "engine/engine.h"

namespace rf::test {
namespace {

using engine::gpu_available;

class DeviceTest : public CliTest {
 protected:
  const std::string stories_ = model_path("stories260K.gguf");
};

// The number of "Final estimate: PPL = X +/- Y".
double final_perplexity(const std::string& out) {
  std::smatch match;
  if (!std::regex_search(out, match, std::regex(R"(Final estimate: PPL = ([0-9.]+) )"))) {
    ADD_FAILURE() << "no final estimate in: " << out;
    return 0.0;
  }
  return std::stod(match[1]);
}

TEST_F(DeviceTest, StderrNamesTheBackend) {
  const RunResult cpu = run("run -m '" + stories_ + "' -p 'Once upon a time' -n 4 --device cpu --threads 2");
  ASSERT_EQ(cpu.status, 0) << cpu.err;
  EXPECT_NE(cpu.err.find("backend: CPU (2 threads)\n"), std::string::npos) << cpu.err;

  const RunResult automatic = run("run -m '" + stories_ + "' -p 'Once upon a time' -n 4");
  ASSERT_EQ(automatic.status, 0) << automatic.err;
  EXPECT_NE(automatic.err.find(gpu_available() ? "backend: GPU (" : "backend: CPU ("), std::string::npos)
      << automatic.err;
}

TEST_F(DeviceTest, UnknownDeviceOrTwoChoicesAreErrors) {
  expect_error("run -m '" + stories_ + "' -p 'Once' --device tpu", "--device");
  expect_error("bench -m '" + stories_ + "' --gpu --device cpu", "--gpu");
  expect_error("run -m '" + stories_ + "' -p 'Once' --gpu-layers -1", "--gpu-layers");
}

TEST_F(DeviceTest, EveryCommandRefusesAMissingGpu) {
  if (gpu_available()) GTEST_SKIP() << "a GPU is here";
  std::ofstream(path("wiki.txt"), std::ios::binary) << read_text(shared_path("data/wiki.test.raw")).substr(0, 4000);
  const std::string model = "-m '" + stories_ + "' ";
  for (const std::string& command :
       {"run " + model + "-p 'Once' --device gpu", "chat " + model + "--device gpu",
        "perplexity " + model + "-f '" + path("wiki.txt") + "' -c 64 --device gpu",
        "eval " + model + "-p 'Once' -n 2 --out '" + path("eval") + "' --device gpu",
        "eval " + model + "-p 'Once' -n 2 --out '" + path("eval") + "' --gpu", "bench " + model + "-p 8 -n 2 --gpu",
        "bench " + model + "-p 8 -n 2 --device GPU"})
    expect_error(command, "the GPU was asked for, but");
}

TEST_F(DeviceTest, GpuGeneratesTheCpusGreedyText) {
  if (!gpu_available()) GTEST_SKIP() << "no GPU";
  const std::string command = "run -m '" + stories_ + "' -p 'Once upon a time' -n 64 --temp 0 --device ";
  const RunResult cpu = run(command + "cpu");
  const RunResult gpu = run(command + "gpu");
  ASSERT_EQ(cpu.status, 0) << cpu.err;
  ASSERT_EQ(gpu.status, 0) << gpu.err;
  EXPECT_NE(gpu.err.find("backend: GPU ("), std::string::npos) << gpu.err;
  EXPECT_GT(cpu.out.size(), std::string("Once upon a time").size() + 64) << cpu.out;
  EXPECT_EQ(gpu.out, cpu.out);
  std::cout << "[ device ] " << gpu.out;
}

TEST_F(DeviceTest, GpuLayersKeepTheFirstLayersOnTheCpu) {
  if (!gpu_available()) GTEST_SKIP() << "no GPU";
  const std::string command = "run -m '" + stories_ + "' -p 'Once upon a time' -n 64 --temp 0 --threads 2 ";
  const RunResult cpu = run(command + "--device cpu");
  const RunResult split = run(command + "--gpu --gpu-layers 2");
  ASSERT_EQ(cpu.status, 0) << cpu.err;
  ASSERT_EQ(split.status, 0) << split.err;
  EXPECT_NE(split.err.find("+ CPU; layers 3..4 on the GPU, the others on 2 CPU threads)"), std::string::npos)
      << split.err;
  EXPECT_EQ(split.out, cpu.out);

  const std::string perplexity =
      "perplexity -m '" + stories_ + "' -f '" + shared_path("data/wiki.test.raw") + "' -c 128 --chunks 20 ";
  const RunResult cpu_ppl = run(perplexity + "--device cpu");
  const RunResult split_ppl = run(perplexity + "--gpu --n-gpu-layers 3");
  ASSERT_EQ(cpu_ppl.status, 0) << cpu_ppl.err;
  ASSERT_EQ(split_ppl.status, 0) << split_ppl.err;
  EXPECT_NEAR(final_perplexity(split_ppl.out), final_perplexity(cpu_ppl.out), final_perplexity(cpu_ppl.out) * 2e-3);
}

TEST_F(DeviceTest, GpuPerplexityIsTheCpus) {
  if (!gpu_available()) GTEST_SKIP() << "no GPU";
  const std::string command =
      "perplexity -m '" + stories_ + "' -f '" + shared_path("data/wiki.test.raw") + "' -c 128 --chunks 50 --device ";
  const RunResult cpu = run(command + "cpu");
  const RunResult gpu = run(command + "gpu");
  ASSERT_EQ(cpu.status, 0) << cpu.err;
  ASSERT_EQ(gpu.status, 0) << gpu.err;
  const double cpu_ppl = final_perplexity(cpu.out);
  const double gpu_ppl = final_perplexity(gpu.out);
  std::cout << "[ device ] perplexity -c 128 --chunks 50: CPU " << cpu_ppl << ", GPU " << gpu_ppl << "\n";
  EXPECT_GT(cpu_ppl, 1.0);
  EXPECT_NEAR(gpu_ppl, cpu_ppl, cpu_ppl * 2e-3);
}

TEST_F(DeviceTest, GpuEvalAndBench) {
  if (!gpu_available()) GTEST_SKIP() << "no GPU";
  const std::string eval = "eval -m '" + stories_ + "' -p 'Once upon a time' -n 24 --out ";
  ASSERT_EQ(run(eval + "'" + path("cpu") + "'").status, 0);
  ASSERT_EQ(run(eval + "'" + path("gpu") + "' --gpu").status, 0);
  const nlohmann::json cpu = nlohmann::json::parse(read_text(path("cpu.json")));
  const nlohmann::json gpu = nlohmann::json::parse(read_text(path("gpu.json")));
  EXPECT_EQ(gpu.at("greedy_tokens"), cpu.at("greedy_tokens"));
  EXPECT_EQ(fs::file_size(path("gpu.logits.f32")), fs::file_size(path("cpu.logits.f32")));

  const RunResult bench = run("bench -m '" + stories_ + "' -p 32 -n 8 -r 1 --json --device gpu");
  ASSERT_EQ(bench.status, 0) << bench.err;
  const nlohmann::json json = nlohmann::json::parse(bench.out);
  EXPECT_NE(json.at("backend"), "CPU");
  EXPECT_EQ(json.at("threads"), 1);
  // Decoding's bound: the measured copy bandwidth, and the tg test's share of it.
  const double copy_gbps = json.at("copy_gbps");
  EXPECT_GT(copy_gbps, 100.0);
  const nlohmann::json& tg = json.at("tests").at(1);
  EXPECT_DOUBLE_EQ(tg.at("fraction_of_copy_bandwidth").get<double>(), tg.at("gbps").get<double>() / copy_gbps);
}

}  // namespace
}  // namespace rf::test
