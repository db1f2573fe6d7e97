// ../shared/reference pairs (MODEL.pN.json + MODEL.pN.logits.f32, llama.cpp's logits) and the measures tests
// compare them with; shared by every backend's end-to-end test.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_paths.h"

namespace rf::test {

struct Reference {
  std::string model;
  std::vector<int32_t> prompt_tokens;
  std::vector<int32_t> greedy_tokens;
  int64_t n_vocab = 0;
  int64_t rows = 0;
  std::vector<float> logits;  // rows x n_vocab

  std::span<const float> row(int64_t i) const {
    return std::span<const float>(logits).subspan(static_cast<size_t>(i * n_vocab), static_cast<size_t>(n_vocab));
  }
};

inline Reference read_reference(const std::string& json_name) {
  const std::string dir = shared_path("reference/");
  const nlohmann::json json = nlohmann::json::parse(std::ifstream(dir + json_name));
  Reference ref;
  ref.model = json.at("model").get<std::string>();
  ref.prompt_tokens = json.at("prompt_tokens").get<std::vector<int32_t>>();
  ref.greedy_tokens = json.at("greedy_tokens").get<std::vector<int32_t>>();
  ref.n_vocab = json.at("n_vocab").get<int64_t>();
  ref.rows = json.at("logits_rows").get<int64_t>();
  ref.logits.resize(static_cast<size_t>(ref.rows * ref.n_vocab));
  std::ifstream in(dir + json.at("logits_file").get<std::string>(), std::ios::binary);
  in.read(reinterpret_cast<char*>(ref.logits.data()), static_cast<std::streamsize>(ref.logits.size() * sizeof(float)));
  if (!in) throw std::runtime_error("cannot read the logits of " + json_name);
  return ref;
}

// The json files of ../shared/reference, sorted (empty when the folder is missing).
inline std::vector<std::string> reference_files() {
  std::vector<std::string> names;
  const std::filesystem::path dir = shared_path("reference");
  if (!std::filesystem::is_directory(dir)) return names;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().extension() == ".json") names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

inline double cosine(std::span<const float> a, std::span<const float> b) {
  double ab = 0.0, aa = 0.0, bb = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    ab += static_cast<double>(a[i]) * b[i];
    aa += static_cast<double>(a[i]) * a[i];
    bb += static_cast<double>(b[i]) * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

inline int32_t argmax(std::span<const float> row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

}  // namespace rf::test
