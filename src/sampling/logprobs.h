// Log-probabilities of tokens, as OpenAI's logprobs and top_logprobs report them: the log-softmax of a row of
// logits, computed in double precision and stable for any finite range of logits. They are the model's own
// distribution over the raw logits, before logit bias, penalties, top-k/top-p/min-p and temperature (as OpenAI
// and vLLM by default report them), so they do not depend on the sampling settings of the request.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace rf::sampling {

// The most top tokens a request may ask for (OpenAI's limit on top_logprobs).
inline constexpr int32_t kMaxTopLogprobs = 20;

struct TokenLogprob {
  int32_t id;
  double logprob;  // natural logarithm; -infinity for a logit of -infinity
};

struct Logprobs {
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;  // most likely first; of equal ones the lower id first
};

// An rf::Error unless 0 <= top <= kMaxTopLogprobs: for requests to check before they run.
void check_top_logprobs(int32_t top);
// The log-probability of `chosen` and of the `top` most likely tokens (0..kMaxTopLogprobs; fewer when the row
// is shorter) under the softmax of `logits` (one per vocabulary entry). A chosen id outside the row, `top` out
// of range, a NaN or +infinity logit, or a row of only -infinity is an rf::Error naming what was wrong.
Logprobs token_logprobs(std::span<const float> logits, int32_t chosen, int32_t top);

}  // namespace rf::sampling
