#include "model/forward_pass.h"

#include <algorithm>

#include "util/error.h"

namespace rf::model {

void check_tokens(const ModelConfig& config, std::span<const int32_t> tokens) {
  for (const int32_t token : tokens)
    if (token < 0 || token >= config.vocab_size)
      fail("token id {} is out of range: the vocabulary has {} tokens", token, config.vocab_size);
}

int64_t kv_cache_rows(const ModelConfig& config, int64_t layer, int64_t context, int64_t max_batch) {
  return config.sliding(layer) ? std::min(context, config.sliding_window + max_batch) : context;
}

int64_t positions_after_truncate(const ModelConfig& config, int64_t context, int64_t max_batch, int64_t written,
                                 int64_t positions) {
  const int64_t oldest_seen = std::max<int64_t>(0, positions - config.sliding_window + 1);
  for (int64_t l = 0; l < config.n_layers; ++l) {
    const int64_t rows = kv_cache_rows(config, l, context, max_batch);
    if (rows < context && oldest_seen < written - rows) return 0;
  }
  return positions;
}

void check_positions(const ModelConfig& config, int64_t n, int64_t position, int64_t cached, int64_t context) {
  if (n == 0) fail("forward: no tokens to evaluate");
  if (position < 0 || position > cached)
    fail("forward: position {} is not within the {} cached positions", position, cached);
  if (position + n > context)
    fail("{} tokens at position {} do not fit in the context of {} positions", n, position, context);
  if (config.arch->positions == Positions::Learned && position + n > config.context_length)
    fail("{} tokens at position {} pass the model's {} learned positions", n, position, config.context_length);
}

void check_kept(int64_t position, int64_t kept) {
  if (kept != position)
    fail("forward: the KV cache cannot continue at position {}: its sliding-window rings have overwritten keys that "
         "position sees (truncate, then continue from the {} positions it keeps)",
         position, kept);
}

}  // namespace rf::model
