#include "model/forward_pass.h"

#include "util/error.h"

namespace rf::model {

void check_tokens(const ModelConfig& config, std::span<const int32_t> tokens) {
  for (const int32_t token : tokens)
    if (token < 0 || token >= config.vocab_size)
      fail("token id {} is out of range: the vocabulary has {} tokens", token, config.vocab_size);
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

}  // namespace rf::model
