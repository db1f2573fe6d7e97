// What every backend's forward pass offers the engine, and the checks they share, so that the engine runs a CPU
// and a GPU transformer through one interface.
#pragma once
#include <cstdint>
#include <span>

#include "model/config.h"

namespace rf::model {

// Which logits forward() returns.
enum class Logits {
  Last,  // of the last token only (generation)
  All,   // of every token, row by row (evaluation, perplexity)
};

class ForwardPass {
 public:
  virtual ~ForwardPass() = default;
  // Evaluates `tokens` at positions position, position + 1, ...: positions from `position` on are first dropped
  // from the cache (position <= cached()), then the tokens' keys and values are added. Returns the logits
  // (vocab_size floats per row) of the last token or of all tokens; the span stays valid until the next call.
  // A token id out of range, a position past the cache or past the context is an rf::Error.
  virtual std::span<const float> forward(std::span<const int32_t> tokens, int64_t position, Logits which) = 0;
  virtual int64_t cached() const = 0;  // positions in the KV cache
  virtual void truncate(int64_t positions) = 0;
  virtual int64_t context() const = 0;  // positions the KV cache holds at most
};

// An rf::Error naming a token id outside the vocabulary.
void check_tokens(const ModelConfig& config, std::span<const int32_t> tokens);
// An rf::Error unless n > 0 tokens at `position` follow the `cached` positions (position <= cached) within
// `context` positions and, for learned positions, within the model's context length.
void check_positions(const ModelConfig& config, int64_t n, int64_t position, int64_t cached, int64_t context);

}  // namespace rf::model
