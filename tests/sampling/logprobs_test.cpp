// Log-probabilities against a direct softmax computed here in long double: on random rows, on logits too large
// or too small for exp, with -infinity, with ties (lower id first), at the limits of `top`, on the errors, and on
// llama.cpp's real logits for stories260K, whose greedy tokens must come out as each row's most likely token.
#include "sampling/logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "error_of.h"
#include "reference.h"

namespace rf::sampling {
namespace {

using test::error_of;

constexpr float kInfinity = std::numeric_limits<float>::infinity();

// log(exp(x_i) / sum_j exp(x_j)), straight from the definition; the logits must be small enough for exp.
std::vector<double> direct_log_softmax(std::span<const float> logits) {
  long double sum = 0.0L;
  for (const float x : logits) sum += std::exp(static_cast<long double>(x));
  std::vector<double> result;
  for (const float x : logits)
    result.push_back(static_cast<double>(std::log(std::exp(static_cast<long double>(x)) / sum)));
  return result;
}

// Token ids by logit, highest first, the lower id first among equal logits.
std::vector<int32_t> ranking(std::span<const float> logits) {
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)];
  });
  return ids;
}

// The top tokens are the first of ranking() with their expected log-probabilities.
void expect_top(const Logprobs& result, std::span<const float> logits, const std::vector<double>& expected,
                size_t count, double tolerance) {
  const std::vector<int32_t> ids = ranking(logits);
  ASSERT_EQ(result.top.size(), count);
  for (size_t i = 0; i < count; ++i) {
    EXPECT_EQ(result.top[i].id, ids[i]) << "top " << i;
    EXPECT_NEAR(result.top[i].logprob, expected[static_cast<size_t>(ids[i])], tolerance) << "top " << i;
  }
}

TEST(Logprobs, MatchesADirectSoftmax) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> logits(1000);
    for (float& x : logits) x = normal(rng);
    const std::vector<double> expected = direct_log_softmax(logits);
    const auto chosen = static_cast<int32_t>(rng() % logits.size());
    for (const int32_t top : {0, 1, 5, kMaxTopLogprobs}) {
      const Logprobs result = token_logprobs(logits, chosen, top);
      EXPECT_EQ(result.chosen.id, chosen);
      EXPECT_NEAR(result.chosen.logprob, expected[static_cast<size_t>(chosen)], 1e-12);
      expect_top(result, logits, expected, static_cast<size_t>(top), 1e-12);
    }
  }
}

TEST(Logprobs, ProbabilitiesSumToOne) {
  std::mt19937 rng(12);
  std::normal_distribution<float> normal(0.0f, 10.0f);
  std::vector<float> logits(500);
  for (float& x : logits) x = normal(rng);
  double sum = 0.0;
  for (size_t id = 0; id < logits.size(); ++id)
    sum += std::exp(token_logprobs(logits, static_cast<int32_t>(id), 0).chosen.logprob);
  EXPECT_NEAR(sum, 1.0, 1e-12);
}

TEST(Logprobs, LogitsTooLargeOrTooSmallForExp) {
  // The softmax does not change when every logit moves by the same amount; exp overflows at 89 in float and at
  // 710 in double, and underflows at the same magnitudes below zero.
  const std::vector<float> base = {3.0f, 1.0f, 0.5f, -2.0f, 2.5f};
  const std::vector<double> expected = direct_log_softmax(base);
  for (const float shift : {1e4f, -1e4f, 1e6f, -1e6f}) {
    std::vector<float> logits;
    for (const float x : base) logits.push_back(x + shift);  // exact in float at these magnitudes
    const Logprobs result = token_logprobs(logits, 3, kMaxTopLogprobs);
    EXPECT_NEAR(result.chosen.logprob, expected[3], 1e-12) << "shift " << shift;
    expect_top(result, logits, expected, base.size(), 1e-12);
  }

  // The extremes of float: the largest takes all the probability, the other gets the difference.
  const std::vector<float> extremes = {-3e38f, 3e38f};
  EXPECT_EQ(token_logprobs(extremes, 1, 0).chosen.logprob, 0.0);
  EXPECT_EQ(token_logprobs(extremes, 0, 0).chosen.logprob, -2.0 * static_cast<double>(3e38f));
}

TEST(Logprobs, NegativeInfinityIsImpossibleAndRankedLast) {
  const std::vector<float> logits = {-kInfinity, 0.0f, -kInfinity, 0.0f};
  const Logprobs result = token_logprobs(logits, 0, 4);
  EXPECT_EQ(result.chosen.logprob, -std::numeric_limits<double>::infinity());
  ASSERT_EQ(result.top.size(), 4u);
  EXPECT_EQ(result.top[0].id, 1);
  EXPECT_DOUBLE_EQ(result.top[0].logprob, std::log(0.5));
  EXPECT_EQ(result.top[1].id, 3);
  EXPECT_DOUBLE_EQ(result.top[1].logprob, std::log(0.5));
  EXPECT_EQ(result.top[2].id, 0);
  EXPECT_EQ(result.top[3].id, 2);
  EXPECT_EQ(result.top[3].logprob, -std::numeric_limits<double>::infinity());
}

TEST(Logprobs, TiesGoToTheLowerId) {
  const std::vector<float> logits(50, 1.5f);
  const Logprobs result = token_logprobs(logits, 49, kMaxTopLogprobs);
  EXPECT_DOUBLE_EQ(result.chosen.logprob, -std::log(50.0));
  ASSERT_EQ(result.top.size(), static_cast<size_t>(kMaxTopLogprobs));
  for (int32_t i = 0; i < kMaxTopLogprobs; ++i) {
    EXPECT_EQ(result.top[static_cast<size_t>(i)].id, i);
    EXPECT_DOUBLE_EQ(result.top[static_cast<size_t>(i)].logprob, -std::log(50.0));
  }
}

TEST(Logprobs, TopIsCutToTheRow) {
  const std::vector<float> logits = {0.1f, 0.3f, 0.2f};
  const Logprobs result = token_logprobs(logits, 0, kMaxTopLogprobs);
  ASSERT_EQ(result.top.size(), 3u);
  EXPECT_EQ(result.top[0].id, 1);
  EXPECT_EQ(result.top[2].id, 0);
  EXPECT_EQ(result.top[2].logprob, result.chosen.logprob);
}

TEST(Logprobs, ErrorsNameWhatIsWrong) {
  const std::vector<float> logits = {0.0f, 1.0f};
  EXPECT_EQ(error_of([&] { token_logprobs(logits, 2, 1); }), "token 2 is outside the vocabulary of 2 tokens");
  EXPECT_EQ(error_of([&] { token_logprobs(logits, -1, 1); }), "token -1 is outside the vocabulary of 2 tokens");
  EXPECT_EQ(error_of([&] { token_logprobs(logits, 0, 21); }), "top log-probabilities must be 0 to 20, got 21");
  EXPECT_EQ(error_of([&] { token_logprobs(logits, 0, -1); }), "top log-probabilities must be 0 to 20, got -1");
  const std::vector<float> not_a_number = {0.0f, std::nanf(""), 1.0f};
  EXPECT_EQ(error_of([&] { token_logprobs(not_a_number, 0, 1); }), "the logit of token 1 is nan");
  const std::vector<float> infinite = {0.0f, 1.0f, kInfinity};
  EXPECT_EQ(error_of([&] { token_logprobs(infinite, 0, 1); }), "the logit of token 2 is inf");
  const std::vector<float> impossible = {-kInfinity, -kInfinity};
  EXPECT_EQ(error_of([&] { token_logprobs(impossible, 0, 1); }), "every logit of the row is -infinity");
}

TEST(Logprobs, LlamaCppLogitsOfStories260K) {
  // Row P + i of the reference (P prompt tokens) holds the logits that chose greedy token i.
  const test::Reference ref = test::read_reference("reference/stories260K.p1.json");
  const auto n_prompt = static_cast<int64_t>(ref.prompt_tokens.size());
  ASSERT_EQ(ref.rows, n_prompt + static_cast<int64_t>(ref.greedy_tokens.size()));
  for (size_t i = 0; i < ref.greedy_tokens.size(); ++i) {
    const std::span<const float> row = ref.row(n_prompt + static_cast<int64_t>(i));
    const int32_t greedy = ref.greedy_tokens[i];
    const std::vector<double> expected = direct_log_softmax(row);
    const Logprobs result = token_logprobs(row, greedy, kMaxTopLogprobs);
    EXPECT_NEAR(result.chosen.logprob, expected[static_cast<size_t>(greedy)], 1e-12) << "greedy token " << i;
    EXPECT_LE(result.chosen.logprob, 0.0);
    ASSERT_FALSE(result.top.empty());
    EXPECT_EQ(result.top[0].id, greedy) << "greedy token " << i;
    EXPECT_EQ(result.top[0].logprob, result.chosen.logprob) << "greedy token " << i;
    expect_top(result, row, expected, static_cast<size_t>(kMaxTopLogprobs), 1e-12);
  }
}

}  // namespace
}  // namespace rf::sampling
