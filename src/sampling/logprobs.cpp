#include "sampling/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "util/error.h"

namespace rf::sampling {
namespace {

// Higher logit first, the lower id among equal logits.
bool more_likely(const TokenLogprob& a, const TokenLogprob& b) {
  return a.logprob != b.logprob ? a.logprob > b.logprob : a.id < b.id;
}

}  // namespace

void check_top_logprobs(int32_t top) {
  if (top < 0 || top > kMaxTopLogprobs) fail("top log-probabilities must be 0 to {}, got {}", kMaxTopLogprobs, top);
}

Logprobs token_logprobs(std::span<const float> logits, int32_t chosen, int32_t top) {
  if (chosen < 0 || static_cast<size_t>(chosen) >= logits.size())
    fail("token {} is outside the vocabulary of {} tokens", chosen, logits.size());
  check_top_logprobs(top);

  // log p_i = (x_i - m) - log sum_j exp(x_j - m) with m the largest logit: no exponential overflows, the largest
  // term of the sum is exactly 1, and subtracting m first keeps the precision of large logits.
  double max_logit = -std::numeric_limits<double>::infinity();
  for (size_t id = 0; id < logits.size(); ++id) {
    if (std::isnan(logits[id]) || logits[id] == std::numeric_limits<float>::infinity())
      fail("the logit of token {} is {}", id, logits[id]);
    max_logit = std::max(max_logit, static_cast<double>(logits[id]));
  }
  if (std::isinf(max_logit)) fail("every logit of the row is -infinity");
  double sum = 0.0;
  for (const float logit : logits) sum += std::exp(static_cast<double>(logit) - max_logit);
  const double log_sum = std::log(sum);
  const auto logprob = [&](double logit) { return (logit - max_logit) - log_sum; };

  // The best `top` so far, kept sorted: most tokens fall below the last and cost one comparison. Their logprob
  // holds the logit until the end.
  Logprobs result{{chosen, logprob(logits[static_cast<size_t>(chosen)])}, {}};
  const size_t kept = std::min(static_cast<size_t>(top), logits.size());
  result.top.reserve(kept + 1);
  for (size_t id = 0; id < logits.size() && kept > 0; ++id) {
    const TokenLogprob token{static_cast<int32_t>(id), static_cast<double>(logits[id])};
    if (result.top.size() == kept && !more_likely(token, result.top.back())) continue;
    result.top.insert(std::upper_bound(result.top.begin(), result.top.end(), token, more_likely), token);
    if (result.top.size() > kept) result.top.pop_back();
  }
  for (TokenLogprob& token : result.top) token.logprob = logprob(token.logprob);
  return result;
}

}  // namespace rf::sampling
