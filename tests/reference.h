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
  std::string model;       // the file name
  std::string model_path;  // where it is: models/ beside the reference folder
  std::vector<int32_t> prompt_tokens;
  std::vector<int32_t> greedy_tokens;
  int64_t n_vocab = 0;
  int64_t rows = 0;
  std::vector<float> logits;  // rows x n_vocab

  std::span<const float> row(int64_t i) const {
    return std::span<const float>(logits).subspan(static_cast<size_t>(i * n_vocab), static_cast<size_t>(n_vocab));
  }
};

// `json_name`: a reference's path under ../shared, as reference_files() gives it.
inline Reference read_reference(const std::string& json_name) {
  const std::filesystem::path json_path = shared_path(json_name);
  const std::string dir = json_path.parent_path().string() + "/";
  const nlohmann::json json = nlohmann::json::parse(std::ifstream(json_path));
  Reference ref;
  ref.model = json.at("model").get<std::string>();
  ref.model_path = (json_path.parent_path().parent_path() / "models" / ref.model).string();
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

// The json files of ../shared/reference (llama) and ../shared/arch/reference (the other architectures) as paths
// under ../shared, sorted (none from a folder that is missing).
inline std::vector<std::string> reference_files() {
  std::vector<std::string> names;
  for (const std::string folder : {"reference", "arch/reference"}) {
    const std::filesystem::path dir = shared_path(folder);
    if (!std::filesystem::is_directory(dir)) continue;
    for (const auto& entry : std::filesystem::directory_iterator(dir))
      if (entry.path().extension() == ".json") names.push_back(folder + "/" + entry.path().filename().string());
  }
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

}  // namespace rf::test
