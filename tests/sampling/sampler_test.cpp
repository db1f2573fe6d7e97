// The sampler chain against distributions worked out by hand: logits are chosen as logs of known
// probabilities, so every stage's expected result follows from the definitions of softmax, top-k, top-p,
// min-p and temperature rather than from this code. Logit bias: banned and forced tokens, its place before the
// penalties, and the entries it refuses.
#include "sampling/sampler.h"

#include <cmath>
#include <map>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "error_of.h"

namespace rf::sampling {
namespace {

using test::error_of;

constexpr float kTolerance = 1e-6f;

// Candidates in vocabulary order with logit log(p_i): softmax gives back p_i / sum(p).
std::vector<Candidate> from_probabilities(const std::vector<float>& probabilities) {
  std::vector<Candidate> candidates;
  for (size_t i = 0; i < probabilities.size(); ++i)
    candidates.push_back({static_cast<int32_t>(i), std::log(probabilities[i]), 0.0f});
  return candidates;
}

std::vector<float> logs_of(const std::vector<float>& probabilities) {
  std::vector<float> logits;
  for (const float p : probabilities) logits.push_back(std::log(p));
  return logits;
}

// Parameters with every stage switched off; tests switch on the one they look at.
SamplingParams plain(float temperature = 1.0f) {
  SamplingParams params;
  params.temperature = temperature;
  params.top_k = 0;
  params.top_p = 1.0f;
  params.min_p = 0.0f;
  return params;
}

void expect_distribution(std::span<const Candidate> actual, const std::vector<std::pair<int32_t, double>>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(actual[i].id, expected[i].first) << "candidate " << i;
    EXPECT_NEAR(actual[i].p, expected[i].second, kTolerance) << "candidate " << i;
  }
}

TEST(Softmax, ExponentialsOverTheirSum) {
  std::vector<Candidate> candidates = {{0, 2.0f, 0}, {1, 1.0f, 0}, {2, 0.0f, 0}};
  softmax(candidates);
  const double sum = std::exp(2.0) + std::exp(1.0) + 1.0;
  EXPECT_NEAR(candidates[0].p, std::exp(2.0) / sum, kTolerance);
  EXPECT_NEAR(candidates[1].p, std::exp(1.0) / sum, kTolerance);
  EXPECT_NEAR(candidates[2].p, 1.0 / sum, kTolerance);
}

TEST(TopK, KeepsTheKHighestLogitsInOrder) {
  std::vector<Candidate> candidates = {{0, 1, 0}, {1, 5, 0}, {2, 3, 0}, {3, 4, 0}, {4, 2, 0}};
  top_k(candidates, 2);
  ASSERT_EQ(candidates.size(), 2u);
  EXPECT_EQ(candidates[0].id, 1);
  EXPECT_EQ(candidates[1].id, 3);
}

TEST(TopK, ZeroKeepsEverythingSorted) {
  std::vector<Candidate> candidates = {{0, 1, 0}, {1, 5, 0}, {2, 3, 0}};
  top_k(candidates, 0);
  ASSERT_EQ(candidates.size(), 3u);
  EXPECT_EQ(candidates[0].id, 1);
  EXPECT_EQ(candidates[1].id, 2);
  EXPECT_EQ(candidates[2].id, 0);
}

TEST(TopP, KeepsTheSmallestPrefixReachingP) {
  // 0.5 + 0.3 = 0.8 is the first cumulative sum >= 0.75.
  std::vector<Candidate> candidates = from_probabilities({0.5f, 0.3f, 0.15f, 0.05f});
  top_p(candidates, 0.75f);
  ASSERT_EQ(candidates.size(), 2u);
  EXPECT_EQ(candidates[1].id, 1);

  // 0.5 alone reaches 0.45.
  candidates = from_probabilities({0.5f, 0.3f, 0.15f, 0.05f});
  top_p(candidates, 0.45f);
  ASSERT_EQ(candidates.size(), 1u);
  EXPECT_EQ(candidates[0].id, 0);
}

TEST(MinP, KeepsTokensAtLeastMinPTimesTheBest) {
  // min_p 0.25 of p_max 0.5 is 0.125: 0.5, 0.3 and 0.15 stay, 0.05 goes.
  std::vector<Candidate> candidates = from_probabilities({0.5f, 0.3f, 0.15f, 0.05f});
  min_p(candidates, 0.25f);
  ASSERT_EQ(candidates.size(), 3u);
  EXPECT_EQ(candidates[2].id, 2);
}

TEST(Temperature, SharpensAndFlattens) {
  // Dividing log p by T makes the distribution proportional to p^(1/T).
  std::vector<Candidate> candidates = from_probabilities({0.6f, 0.3f, 0.1f});
  apply_temperature(candidates, 0.5f);
  softmax(candidates);
  const double sum = 0.36 + 0.09 + 0.01;
  EXPECT_NEAR(candidates[0].p, 0.36 / sum, kTolerance);
  EXPECT_NEAR(candidates[1].p, 0.09 / sum, kTolerance);
  EXPECT_NEAR(candidates[2].p, 0.01 / sum, kTolerance);

  candidates = from_probabilities({0.6f, 0.3f, 0.1f});
  apply_temperature(candidates, 2.0f);
  softmax(candidates);
  const double root_sum = std::sqrt(0.6) + std::sqrt(0.3) + std::sqrt(0.1);
  EXPECT_NEAR(candidates[0].p, std::sqrt(0.6) / root_sum, kTolerance);
  EXPECT_NEAR(candidates[2].p, std::sqrt(0.1) / root_sum, kTolerance);
}

TEST(Penalties, AsLlamaCppDefinesThem) {
  // Token 0 (positive logit) seen once, token 1 (negative) twice, token 3 once; token 2 never.
  std::vector<Candidate> candidates = {{0, 2.0f, 0}, {1, -1.0f, 0}, {2, 0.5f, 0}, {3, 3.0f, 0}};
  SamplingParams params = plain();
  params.repeat_penalty = 1.5f;
  params.frequency_penalty = 0.1f;
  params.presence_penalty = 0.2f;
  const std::vector<int32_t> recent = {0, 1, 3, 1};
  apply_penalties(candidates, recent, params);
  EXPECT_NEAR(candidates[0].logit, 2.0f / 1.5f - 1 * 0.1f - 0.2f, kTolerance);
  EXPECT_NEAR(candidates[1].logit, -1.0f * 1.5f - 2 * 0.1f - 0.2f, kTolerance);
  EXPECT_NEAR(candidates[2].logit, 0.5f, kTolerance);
  EXPECT_NEAR(candidates[3].logit, 3.0f / 1.5f - 1 * 0.1f - 0.2f, kTolerance);
}

TEST(Penalties, LookOnlyAtTheLastNTokens) {
  // Token 0 leads 1.0 to 0.9 unless a repeat penalty of 2 halves it.
  const std::vector<float> logits = {1.0f, 0.9f, 0.0f};
  for (const int32_t last_n : {2, 3}) {
    SamplingParams params = plain(0.0f);
    params.repeat_penalty = 2.0f;
    params.penalty_last_n = last_n;
    Sampler sampler(params);
    for (const int32_t token : {0, 2, 2}) sampler.accept(token);
    EXPECT_EQ(sampler.sample(logits), last_n == 2 ? 0 : 1) << "last_n " << last_n;
  }
}

TEST(Sampler, ChainMatchesHandComputedDistribution) {
  // top-k 4 drops 0.05; top-p 0.8 over the renormalized 0.4/0.95, 0.3/0.95, 0.15/0.95 (cumulative 0.42,
  // 0.74, 0.89) keeps three; min-p 0.3 (threshold 0.3 * 0.4 = 0.12) keeps 0.15; temperature 1 leaves the
  // three renormalized over 0.85.
  SamplingParams params = plain();
  params.top_k = 4;
  params.top_p = 0.8f;
  params.min_p = 0.3f;
  Sampler sampler(params);
  const std::vector<float> logits = logs_of({0.1f, 0.4f, 0.05f, 0.3f, 0.15f});
  expect_distribution(sampler.distribution(logits), {{1, 0.4 / 0.85}, {3, 0.3 / 0.85}, {4, 0.15 / 0.85}});
}

TEST(Sampler, MinPBeforeTemperature) {
  // min-p 0.2 of 0.6 is 0.12 and drops 0.1 before temperature 0.5 squares the rest: 0.36 and 0.09.
  SamplingParams params = plain(0.5f);
  params.min_p = 0.2f;
  Sampler sampler(params);
  expect_distribution(sampler.distribution(logs_of({0.6f, 0.3f, 0.1f})), {{0, 0.36 / 0.45}, {1, 0.09 / 0.45}});
}

TEST(Sampler, DrawsFollowTheDistribution) {
  Sampler sampler(plain());
  const std::vector<float> logits = logs_of({0.6f, 0.3f, 0.1f});
  constexpr int kDraws = 20000;
  std::map<int32_t, int> counts;
  for (int i = 0; i < kDraws; ++i) ++counts[sampler.sample(logits)];
  // Standard deviation of a frequency near 0.5 over 20000 draws is 0.0035; allow about 4 of them.
  EXPECT_NEAR(counts[0] / double(kDraws), 0.6, 0.015);
  EXPECT_NEAR(counts[1] / double(kDraws), 0.3, 0.015);
  EXPECT_NEAR(counts[2] / double(kDraws), 0.1, 0.015);
}

TEST(Sampler, GreedyIsArgmax) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  Sampler sampler(plain(0.0f));
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> logits(1000);
    for (float& logit : logits) logit = normal(rng);
    const auto best = std::max_element(logits.begin(), logits.end()) - logits.begin();
    EXPECT_EQ(sampler.sample(logits), best);
  }
}

std::vector<int32_t> draws(uint64_t seed) {
  SamplingParams params;  // the defaults: top-k 40, top-p 0.95, min-p 0.05, temperature 0.8
  params.seed = seed;
  Sampler sampler(params);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<int32_t> tokens;
  for (int i = 0; i < 100; ++i) {
    std::vector<float> logits(256);
    for (float& logit : logits) logit = normal(rng);
    tokens.push_back(sampler.sample(logits));
    sampler.accept(tokens.back());
  }
  return tokens;
}

TEST(Sampler, SameSeedSameTokens) {
  EXPECT_EQ(draws(42), draws(42));
  EXPECT_NE(draws(42), draws(43));
}

std::vector<float> normal_logits(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> logits(n);
  for (float& logit : logits) logit = normal(rng);
  return logits;
}

TEST(LogitBias, BannedTokenIsNeverSampled) {
  // Token 0 is the most likely by far until -100 is added to its logit.
  const std::vector<float> logits = logs_of({0.9f, 0.06f, 0.04f});
  for (const float temperature : {0.0f, 1.0f, 2.0f}) {
    SamplingParams params = plain(temperature);
    params.logit_bias = {{0, -100.0f}};
    params.seed = 5;
    Sampler sampler(params);
    for (int i = 0; i < 5000; ++i) ASSERT_NE(sampler.sample(logits), 0) << "temperature " << temperature;
  }
}

TEST(LogitBias, PlusOneHundredForcesATokenUnderGreedyAndSeededSampling) {
  // The least likely of 1000 tokens, forced; the defaults plus penalties on it, which follow the bias.
  const std::vector<float> logits = normal_logits(1000, 3);
  const auto worst = static_cast<int32_t>(std::min_element(logits.begin(), logits.end()) - logits.begin());
  for (const float temperature : {0.0f, 0.8f, 1.5f}) {
    SamplingParams params;
    params.temperature = temperature;
    params.repeat_penalty = 1.3f;
    params.presence_penalty = 0.5f;
    params.seed = 1234;
    params.logit_bias = {{worst, 100.0f}};
    Sampler sampler(params);
    for (int i = 0; i < 500; ++i) {
      ASSERT_EQ(sampler.sample(logits), worst) << "temperature " << temperature;
      sampler.accept(worst);
    }
  }
}

TEST(LogitBias, AddedBeforeThePenalties) {
  // Token 0: logit 2, bias -4, seen once, repeat penalty 2. Bias first: (2 - 4) * 2 = -4; penalty first would
  // give 2 / 2 - 4 = -3.
  SamplingParams params = plain();
  params.logit_bias = {{0, -4.0f}, {1, 0.5f}};
  params.repeat_penalty = 2.0f;
  Sampler sampler(params);
  sampler.accept(0);
  const std::vector<float> logits = {2.0f, 0.0f};
  const std::span<const Candidate> candidates = sampler.distribution(logits);
  ASSERT_EQ(candidates.size(), 2u);
  EXPECT_EQ(candidates[0].id, 1);
  EXPECT_NEAR(candidates[0].logit, 0.5f, kTolerance);
  EXPECT_NEAR(candidates[1].logit, -4.0f, kTolerance);
}

TEST(LogitBias, BadEntriesAreErrorsNamingThem) {
  EXPECT_EQ(error_of([] { check_logit_bias({{3, 1.0f}, {10, 1.0f}}, 10); }),
            "logit bias: token 10 is outside the vocabulary of 10 tokens");
  EXPECT_EQ(error_of([] { check_logit_bias({{-1, 1.0f}}, 10); }),
            "logit bias: token -1 is outside the vocabulary of 10 tokens");
  EXPECT_EQ(error_of([] { check_logit_bias({{2, 100.5f}}, 10); }),
            "logit bias of token 2 must be within [-100, 100], got 100.5");
  EXPECT_EQ(error_of([] { check_logit_bias({{7, -101.0f}}, 10); }),
            "logit bias of token 7 must be within [-100, 100], got -101");
  EXPECT_EQ(error_of([] { check_logit_bias({{4, std::nanf("")}}, 10); }),
            "logit bias of token 4 must be within [-100, 100], got nan");
  EXPECT_EQ(error_of([] { check_logit_bias({{0, -100.0f}, {9, 100.0f}}, 10); }), "");

  // The sampler checks against the row it is given.
  SamplingParams params = plain(0.0f);
  params.logit_bias = {{3, 1.0f}};
  Sampler sampler(params);
  const std::vector<float> logits = {0.0f, 1.0f, 2.0f};
  EXPECT_EQ(error_of([&] { sampler.sample(logits); }), "logit bias: token 3 is outside the vocabulary of 3 tokens");
}

}  // namespace
}  // namespace rf::sampling
