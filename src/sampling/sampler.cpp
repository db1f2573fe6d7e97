#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <utility>

#include "util/argmax.h"
#include "util/error.h"

namespace rf::sampling {
namespace {

bool higher_logit(const Candidate& a, const Candidate& b) { return a.logit > b.logit; }
bool lower_logit(const Candidate& a, const Candidate& b) { return a.logit < b.logit; }

}  // namespace

void check_logit_bias(const std::map<int32_t, float>& logit_bias, size_t n_vocab) {
  for (const auto& [token, bias] : logit_bias) {
    if (token < 0 || static_cast<size_t>(token) >= n_vocab)
      fail("logit bias: token {} is outside the vocabulary of {} tokens", token, n_vocab);
    // Written so that NaN fails too.
    if (!(bias >= -kMaxLogitBias && bias <= kMaxLogitBias))
      fail("logit bias of token {} must be within [-{}, {}], got {}", token, kMaxLogitBias, kMaxLogitBias, bias);
  }
}

void check_params(const SamplingParams& params) {
  // Each test is written so that NaN fails it.
  if (!(params.temperature >= 0.0f && std::isfinite(params.temperature)))
    fail("temperature must be finite and at least 0 (0: greedy), got {}", params.temperature);
  if (params.top_k < 0) fail("top-k must be at least 0 (0: off), got {}", params.top_k);
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f))
    fail("top-p must be positive and at most 1 (1: off), got {}", params.top_p);
  if (!(params.min_p >= 0.0f && params.min_p <= 1.0f)) fail("min-p must be in [0, 1] (0: off), got {}", params.min_p);
  if (!(params.repeat_penalty > 0.0f && std::isfinite(params.repeat_penalty)))
    fail("repeat penalty must be positive and finite (1: off), got {}", params.repeat_penalty);
  for (const auto& [name, penalty] :
       {std::pair{"frequency", params.frequency_penalty}, std::pair{"presence", params.presence_penalty}})
    if (!(std::fabs(penalty) <= kMaxPenalty))
      fail("{} penalty must be in [-{}, {}] (0: off), got {}", name, kMaxPenalty, kMaxPenalty, penalty);
  if (params.penalty_last_n < -1)
    fail("penalty window must be -1 (all), 0 (off) or positive, got {}", params.penalty_last_n);
}

void apply_logit_bias(std::vector<Candidate>& candidates, const std::map<int32_t, float>& logit_bias) {
  check_logit_bias(logit_bias, candidates.size());
  for (const auto& [token, bias] : logit_bias) candidates[static_cast<size_t>(token)].logit += bias;
}

bool penalizes(const SamplingParams& params) {
  return params.repeat_penalty != 1.0f || params.frequency_penalty != 0.0f || params.presence_penalty != 0.0f;
}

bool chooses_largest_logit(const SamplingParams& params) {
  return params.temperature <= 0.0f && params.logit_bias.empty() && !penalizes(params);
}

void apply_penalties(std::vector<Candidate>& candidates, std::span<const int32_t> recent,
                     const SamplingParams& params) {
  if (!penalizes(params)) return;
  std::unordered_map<int32_t, int> counts;
  for (const int32_t token : recent) ++counts[token];
  for (const auto& [token, count] : counts) {
    if (token < 0 || static_cast<size_t>(token) >= candidates.size()) continue;
    float& logit = candidates[static_cast<size_t>(token)].logit;
    // Dividing a negative logit would raise it; the penalty must always make the token less likely.
    logit = logit <= 0.0f ? logit * params.repeat_penalty : logit / params.repeat_penalty;
    logit -= static_cast<float>(count) * params.frequency_penalty + params.presence_penalty;
  }
}

void top_k(std::vector<Candidate>& candidates, int32_t k) {
  if (k <= 0 || static_cast<size_t>(k) >= candidates.size()) {
    std::sort(candidates.begin(), candidates.end(), higher_logit);
    return;
  }
  std::partial_sort(candidates.begin(), candidates.begin() + k, candidates.end(), higher_logit);
  candidates.resize(static_cast<size_t>(k));
}

void softmax(std::vector<Candidate>& candidates) {
  if (candidates.empty()) return;
  const float max_logit = std::max_element(candidates.begin(), candidates.end(), lower_logit)->logit;
  double sum = 0.0;
  for (Candidate& c : candidates) {
    c.p = std::exp(c.logit - max_logit);
    sum += c.p;
  }
  for (Candidate& c : candidates) c.p = static_cast<float>(c.p / sum);
}

void top_p(std::vector<Candidate>& candidates, float p) {
  if (p >= 1.0f || candidates.empty()) return;
  softmax(candidates);
  double cumulative = 0.0;
  size_t kept = candidates.size();
  for (size_t i = 0; i < candidates.size(); ++i) {
    cumulative += candidates[i].p;
    if (cumulative >= p) {
      kept = i + 1;
      break;
    }
  }
  candidates.resize(kept);
}

void min_p(std::vector<Candidate>& candidates, float min_p) {
  if (min_p <= 0.0f || candidates.empty()) return;
  // p_i >= min_p * p_max  <=>  logit_i >= logit_max + log(min_p), since both share the softmax denominator.
  const float min_logit = candidates.front().logit + std::log(min_p);
  const auto first_dropped = std::find_if(candidates.begin() + 1, candidates.end(),
                                          [min_logit](const Candidate& c) { return c.logit < min_logit; });
  candidates.erase(first_dropped, candidates.end());
}

void apply_temperature(std::vector<Candidate>& candidates, float temperature) {
  for (Candidate& c : candidates) c.logit /= temperature;
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) { check_params(params); }

void Sampler::accept(int32_t token) {
  if (params_.penalty_last_n == 0) return;
  recent_.push_back(token);
  if (params_.penalty_last_n > 0 && recent_.size() > static_cast<size_t>(params_.penalty_last_n))
    recent_.erase(recent_.begin());
}

double Sampler::uniform() { return static_cast<double>(rng_() >> 11) * 0x1p-53; }

std::span<const Candidate> Sampler::distribution(std::span<const float> logits) {
  if (logits.empty()) fail("cannot sample from an empty row of logits");
  // Greedy over untouched logits is their first largest: listing the whole vocabulary as candidates would cost
  // several times the search, for every sequence of a batched step.
  if (chooses_largest_logit(params_)) {
    const int32_t best = index_of_largest(logits);
    candidates_.assign(1, {best, logits[static_cast<size_t>(best)], 1.0f});
    return candidates_;
  }
  candidates_.resize(logits.size());
  for (size_t id = 0; id < logits.size(); ++id) candidates_[id] = {static_cast<int32_t>(id), logits[id], 0.0f};

  apply_logit_bias(candidates_, params_.logit_bias);
  apply_penalties(candidates_, recent_, params_);
  if (params_.temperature <= 0.0f) {
    const Candidate best = *std::max_element(candidates_.begin(), candidates_.end(), lower_logit);
    candidates_.assign(1, {best.id, best.logit, 1.0f});
    return candidates_;
  }
  top_k(candidates_, params_.top_k);
  top_p(candidates_, params_.top_p);
  min_p(candidates_, params_.min_p);
  apply_temperature(candidates_, params_.temperature);
  softmax(candidates_);
  return candidates_;
}

int32_t Sampler::sample(std::span<const float> logits) {
  const std::span<const Candidate> candidates = distribution(logits);
  if (candidates.size() == 1) return candidates.front().id;
  // Walk the cumulative distribution to the first candidate past a uniform draw; rounding can leave the sum
  // a hair below the draw, in which case the last candidate is the answer.
  const double target = uniform();
  double cumulative = 0.0;
  for (const Candidate& c : candidates) {
    cumulative += c.p;
    if (target < cumulative) return c.id;
  }
  return candidates.back().id;
}

}  // namespace rf::sampling
