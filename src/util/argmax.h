// The index of a row's largest value, the one rule for greedy choice that the sampler, the CPU's forward pass and the
// tests share, and that the GPU's argmax kernel (backend/gpu/kernels.h) reproduces.
#pragma once
#include <algorithm>
#include <cstdint>
#include <span>

namespace rf {

// The index of the first of the largest values (std::max_element's): a later value is taken only where it is
// strictly greater. `values` must not be empty.
inline int32_t index_of_largest(std::span<const float> values) {
  return static_cast<int32_t>(std::max_element(values.begin(), values.end()) - values.begin());
}

}  // namespace rf
