// `rocmforge eval` writes what ../shared/reference holds, byte for byte in the JSON (same tokens) and row
// for row in the logits; and for every reference, the prompt tokens llama.cpp made.
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "reference.h"
#include "test_paths.h"

namespace rf {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<float> read_floats(const std::string& path) {
  const std::string bytes = read_text(path);
  std::vector<float> values(bytes.size() / sizeof(float));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(float));
  return values;
}

TEST(EvalCommandTest, WritesTheReferenceFormat) {
  const std::string prefix = ::testing::TempDir() + "rf_eval_" + std::to_string(::getpid());
  const std::string command = test::cli_path() + " eval -m " + test::shared_path("models/stories260K.gguf") +
                              " -p 'Once upon a time' -n 48 --threads 2 --out " + prefix + " > /dev/null";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;

  const std::string reference = test::shared_path("reference/stories260K.p1");
  // Byte for byte, except the name of the logits file, which follows our prefix.
  const std::string ours_json = read_text(prefix + ".json");
  const std::string reference_json = read_text(reference + ".json");
  const auto before_and_after = [](const std::string& json) {
    return std::pair(json.substr(0, json.find("\"logits_file\"")), json.substr(json.find("\"logits_rows\"")));
  };
  EXPECT_EQ(before_and_after(ours_json), before_and_after(reference_json));
  EXPECT_NE(ours_json.find("\"logits_file\": \"rf_eval_"), std::string::npos) << ours_json;

  const std::vector<float> ours = read_floats(prefix + ".logits.f32");
  const std::vector<float> theirs = read_floats(reference + ".logits.f32");
  ASSERT_EQ(ours.size(), theirs.size());
  constexpr size_t kVocab = 512;
  for (size_t row = 0; row < ours.size() / kVocab; ++row) {
    double ab = 0.0, aa = 0.0, bb = 0.0;
    for (size_t i = row * kVocab; i < (row + 1) * kVocab; ++i) {
      ab += static_cast<double>(ours[i]) * theirs[i];
      aa += static_cast<double>(ours[i]) * ours[i];
      bb += static_cast<double>(theirs[i]) * theirs[i];
    }
    EXPECT_GE(ab / std::sqrt(aa * bb), 0.999) << "row " << row;
  }
  std::remove((prefix + ".json").c_str());
  std::remove((prefix + ".logits.f32").c_str());
}

// For every reference, eval tokenizes the prompt as llama.cpp did (BOS as the model's tokenizer says).
class EvalPromptTest : public ::testing::TestWithParam<std::string> {};

TEST_P(EvalPromptTest, PromptTokensAreTheReferences) {
  const test::Reference ref = test::read_reference(GetParam());
  const nlohmann::json json = nlohmann::json::parse(std::ifstream(test::shared_path(GetParam())));
  const std::string prefix = ::testing::TempDir() + "rf_eval_prompt_" + std::to_string(::getpid());
  const std::string prompt_file = prefix + ".prompt";
  std::ofstream(prompt_file, std::ios::binary) << json.at("prompt").get<std::string>();
  const std::string command = test::cli_path() + " eval -m '" + ref.model_path + "' -p \"$(cat '" + prompt_file +
                              "')\" -n 1 --threads 2 --out " + prefix + " > /dev/null";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  const nlohmann::json ours = nlohmann::json::parse(std::ifstream(prefix + ".json"));
  EXPECT_EQ(ours.at("prompt_tokens").get<std::vector<int32_t>>(), ref.prompt_tokens);
  EXPECT_EQ(ours.at("add_bos").get<bool>(), json.at("add_bos").get<bool>());
  for (const char* suffix : {".json", ".logits.f32", ".prompt"}) std::remove((prefix + suffix).c_str());
}

std::string reference_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param.substr(0, info.param.size() - std::string(".json").size());
  std::replace_if(name.begin(), name.end(), [](char c) { return !std::isalnum(static_cast<unsigned char>(c)); }, '_');
  return name;
}

INSTANTIATE_TEST_SUITE_P(Shared, EvalPromptTest, ::testing::ValuesIn(test::reference_files()), reference_name);

TEST(EvalCommandTest, MissingModelIsOneErrorLine) {
  const std::string command = test::cli_path() + " eval -m /nonexistent.gguf -p x -n 1 --out /tmp/x 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[256];
  while (std::fgets(buffer, sizeof(buffer), pipe)) output += buffer;
  EXPECT_NE(::pclose(pipe), 0);
  EXPECT_NE(output.find("error: /nonexistent.gguf"), std::string::npos) << output;
}

}  // namespace
}  // namespace rf
