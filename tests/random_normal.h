// Normally distributed test values, the same for the same seed.
#pragma once
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace rf::test {

inline std::vector<float> random_normal(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(n);
  for (float& v : values) v = normal(rng);
  return values;
}

}  // namespace rf::test
