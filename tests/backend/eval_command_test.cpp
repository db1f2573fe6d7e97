// `rocmforge eval` writes what ../shared/reference holds, byte for byte in the JSON (same tokens) and row
// for row in the logits; and for every reference, the prompt tokens llama.cpp made.
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <span>
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
    const auto row_of = [&](const std::vector<float>& logits) {
      return std::span(logits).subspan(row * kVocab, kVocab);
    };
    EXPECT_GE(test::cosine(row_of(ours), row_of(theirs)), 0.999) << "row " << row;
  }
  std::remove((prefix + ".json").c_str());
  std::remove((prefix + ".logits.f32").c_str());
}

// For every reference, eval makes llama.cpp's prompt tokens (BOS as the model's tokenizer says) and logits rows
// within cosine 0.999 of its rows: the arch references with --float-activations, as llama.cpp computed them on
// the dequantized weights (../shared/README.md). Rows are compared while eval's greedy continuation is the
// reference's, which for the trained models and the arch models it must be all the way.
class EvalReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(EvalReferenceTest, PromptTokensAndLogitsAreTheReferences) {
  const test::Reference ref = test::read_reference(GetParam());
  const nlohmann::json json = nlohmann::json::parse(std::ifstream(test::shared_path(GetParam())));
  const bool arch = GetParam().starts_with("arch/");
  const std::string prefix = ::testing::TempDir() + "rf_eval_prompt_" + std::to_string(::getpid());
  const std::string prompt_file = prefix + ".prompt";
  std::ofstream(prompt_file, std::ios::binary) << json.at("prompt").get<std::string>();
  const std::string command = test::cli_path() + " eval -m '" + ref.model_path + "' -p \"$(cat '" + prompt_file +
                              "')\" -n " + std::to_string(ref.greedy_tokens.size()) + " --threads 2 --out " + prefix +
                              (arch ? " --float-activations" : "") + " > /dev/null";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  const nlohmann::json ours = nlohmann::json::parse(std::ifstream(prefix + ".json"));
  EXPECT_EQ(ours.at("prompt_tokens").get<std::vector<int32_t>>(), ref.prompt_tokens);
  EXPECT_EQ(ours.at("add_bos").get<bool>(), json.at("add_bos").get<bool>());

  const auto greedy = ours.at("greedy_tokens").get<std::vector<int32_t>>();
  if (arch || ref.model == "stories260K.gguf" || ref.model == "TinyStories-656K-Q8_0.gguf") {
    EXPECT_EQ(greedy, ref.greedy_tokens);
  }
  const size_t agreeing = std::mismatch(greedy.begin(), greedy.end(), ref.greedy_tokens.begin(),
                                        ref.greedy_tokens.end()).first - greedy.begin();
  const std::vector<float> logits = read_floats(prefix + ".logits.f32");
  ASSERT_EQ(logits.size(), ref.logits.size());
  // Row P + i chose greedy token i after tokens 0..i-1: comparable while those agree.
  const int64_t rows = static_cast<int64_t>(ref.prompt_tokens.size() + std::min(agreeing + 1, greedy.size()));
  double min_cosine = 1.0;
  for (int64_t row = 0; row < rows; ++row) {
    const std::span<const float> our_row(logits.data() + row * ref.n_vocab, static_cast<size_t>(ref.n_vocab));
    const double c = test::cosine(our_row, ref.row(row));
    EXPECT_GE(c, 0.999) << "row " << row;
    min_cosine = std::min(min_cosine, c);
  }
  std::cout << "[ eval ] " << GetParam() << ": min cosine " << min_cosine << " over " << rows << " rows, greedy "
            << agreeing << "/" << ref.greedy_tokens.size() << "\n";
  for (const char* suffix : {".json", ".logits.f32", ".prompt"}) std::remove((prefix + suffix).c_str());
}

std::string reference_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param.substr(0, info.param.size() - std::string(".json").size());
  std::replace_if(name.begin(), name.end(), [](char c) { return !std::isalnum(static_cast<unsigned char>(c)); }, '_');
  return name;
}

INSTANTIATE_TEST_SUITE_P(Shared, EvalReferenceTest, ::testing::ValuesIn(test::reference_files()), reference_name);

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
