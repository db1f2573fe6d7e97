// Generation parameters that the engine's tests share.
#pragma once
#include <cstdint>

#include "engine/sequence.h"

namespace rf::test {

// The most likely token at every step, at most `max_tokens` of them.
inline engine::GenerationParams greedy(int64_t max_tokens) {
  engine::GenerationParams params;
  params.max_tokens = max_tokens;
  params.sampling.temperature = 0.0f;
  return params;
}

}  // namespace rf::test
