// One sequence fed fabricated rows of logits (or the tokens chosen from them), with stories260K's tokenizer and no
// model: greedy choice, the finish reasons (max_tokens, an end-of-generation token that is not emitted, a stop string
// split across two tokens, a full context, cancellation), what is held back and when it comes out (the start of a
// stop string, of a character), logit bias, log-probabilities of the row given, the prompt and the tokens given as
// the penalties' history, when a step needs only the argmax, and the parameters checked when the sequence is created.
#include "engine/sequence.h"

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "error_of.h"
#include "gguf/gguf.h"
#include "greedy.h"
#include "random_normal.h"
#include "test_paths.h"

namespace rf::engine {
namespace {

using test::error_of;

const Tokenizer& stories() {
  static const Tokenizer tokenizer(*gguf::File::open(test::shared_path("models/stories260K.gguf")));
  return tokenizer;
}

// A row of logits whose most likely token is `token`.
std::vector<float> row_for(int32_t token) {
  std::vector<float> row(static_cast<size_t>(stories().n_vocab()), 0.0f);
  row[static_cast<size_t>(token)] = 10.0f;
  return row;
}

// A row of logits whose most likely token is `token` (10), with `runner_up` next at `logit`.
std::vector<float> row_for(int32_t token, int32_t runner_up, float logit) {
  std::vector<float> row = row_for(token);
  row[static_cast<size_t>(runner_up)] = logit;
  return row;
}

std::vector<float> random_row(uint32_t seed) {
  return test::random_normal(static_cast<size_t>(stories().n_vocab()), seed, 3.0f);
}

using test::greedy;

// Greedy choice under a repeat penalty of 2: a token seen before falls from 10 to 5, below a runner-up at 9.
GenerationParams greedy_penalizing_repeats() {
  GenerationParams params = greedy(8);
  params.sampling.repeat_penalty = 2.0f;
  return params;
}

// Token ids of " Once", " upon", " a", " time": pieces without multi-byte characters.
struct Words {
  int32_t once, upon, a, time;
};

Words words() {
  const std::vector<int32_t> ids = stories().encode("Once upon a time", false, false);
  EXPECT_EQ(ids.size(), 4u);
  EXPECT_EQ(stories().decode(ids), "Once upon a time");
  EXPECT_EQ(stories().token_to_piece(ids[1]), " upon");
  return {ids[0], ids[1], ids[2], ids[3]};
}

// Steps `sequence` through rows making each of `tokens` the most likely in turn.
std::vector<Step> steps(Sequence& sequence, const std::vector<int32_t>& tokens) {
  std::vector<Step> taken;
  for (const int32_t token : tokens) taken.push_back(sequence.step(row_for(token), false));
  return taken;
}

std::string text_of(const std::vector<Step>& taken) {
  std::string text;
  for (const Step& step : taken) text += step.text;
  return text;
}

TEST(Sequence, GreedyPicksTheArgmax) {
  const std::vector<float> row = random_row(1);
  const auto best = static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
  Sequence sequence({}, greedy(8), stories());
  const Step step = sequence.step(row, false);
  EXPECT_EQ(step.token, best);
  EXPECT_EQ(step.text, stories().token_to_piece(best));
  EXPECT_FALSE(step.logprobs);
  EXPECT_FALSE(step.finish);
  EXPECT_EQ(sequence.tokens(), std::vector<int32_t>{best});
  EXPECT_FALSE(sequence.finished());
}

TEST(Sequence, MaxTokensFinishesWithLength) {
  const Words w = words();
  Sequence sequence({}, greedy(3), stories());
  const std::vector<Step> taken = steps(sequence, {w.once, w.upon, w.a});
  EXPECT_FALSE(taken[0].finish);
  EXPECT_FALSE(taken[1].finish);
  EXPECT_EQ(taken[2].finish, FinishReason::Length);
  EXPECT_EQ(text_of(taken), " Once upon a");
  EXPECT_EQ(sequence.tokens(), (std::vector<int32_t>{w.once, w.upon, w.a}));
  EXPECT_EQ(sequence.finish_reason(), FinishReason::Length);
  EXPECT_EQ(error_of([&] { sequence.step(row_for(w.time), false); }),
            "the sequence has finished: it takes no more steps");
}

TEST(Sequence, ZeroMaxTokensHasFinishedBeforeAnyStep) {
  const Sequence sequence({}, greedy(0), stories());
  EXPECT_EQ(sequence.finish_reason(), FinishReason::Length);
}

TEST(Sequence, EndOfGenerationTokenFinishesAndIsNotEmitted) {
  const Words w = words();
  GenerationParams params = greedy(8);
  params.top_logprobs = 2;
  Sequence sequence({}, params, stories());
  const std::vector<Step> taken = steps(sequence, {w.once, stories().eos()});
  EXPECT_EQ(taken[1].token, stories().eos());
  EXPECT_EQ(taken[1].finish, FinishReason::EndOfGeneration);
  EXPECT_EQ(taken[1].text, "");
  EXPECT_FALSE(taken[1].logprobs);
  EXPECT_EQ(sequence.tokens(), std::vector<int32_t>{w.once});
}

TEST(Sequence, IgnoreEosGoesOn) {
  const Words w = words();
  GenerationParams params = greedy(8);
  params.ignore_eos = true;
  Sequence sequence({}, params, stories());
  const std::vector<Step> taken = steps(sequence, {w.once, stories().eos(), w.upon});
  EXPECT_FALSE(sequence.finished());
  EXPECT_EQ(taken[1].text, "");  // a control token has no text
  EXPECT_EQ(text_of(taken), " Once upon");
  EXPECT_EQ(sequence.tokens(), (std::vector<int32_t>{w.once, stories().eos(), w.upon}));
}

TEST(Sequence, StopStringSplitAcrossTwoTokensEndsTheTextBeforeIt) {
  const Words w = words();
  GenerationParams params = greedy(8);
  params.stop_strings = {"xyz", "on a"};
  Sequence sequence({}, params, stories());
  const std::vector<Step> taken = steps(sequence, {w.once, w.upon, w.a});
  EXPECT_EQ(taken[0].text, " Once");
  EXPECT_EQ(taken[1].text, " up");  // "on" may start "on a"
  EXPECT_FALSE(taken[1].finish);
  EXPECT_EQ(taken[2].text, "");
  EXPECT_EQ(taken[2].finish, FinishReason::StopString);
  EXPECT_EQ(sequence.stop_string(), 1u);
  EXPECT_EQ(sequence.tokens(), (std::vector<int32_t>{w.once, w.upon, w.a}));
}

TEST(Sequence, HeldBackTextComesOutWhenTheSequenceFinishesOtherwise) {
  const Words w = words();
  GenerationParams params = greedy(2);
  params.stop_strings = {"on a"};
  Sequence by_length({}, params, stories());
  const std::vector<Step> taken = steps(by_length, {w.once, w.upon});
  EXPECT_EQ(taken[1].text, " upon");
  EXPECT_EQ(taken[1].finish, FinishReason::Length);
  EXPECT_FALSE(by_length.stop_string());

  params.max_tokens = 8;
  Sequence by_end({}, params, stories());
  const std::vector<Step> ended = steps(by_end, {w.upon, stories().eos()});
  EXPECT_EQ(ended[0].text, " up");
  EXPECT_EQ(ended[1].text, "on");
  EXPECT_EQ(ended[1].finish, FinishReason::EndOfGeneration);
}

TEST(Sequence, CharacterSplitAcrossTokensComesOutWhole) {
  const int32_t first = stories().token_id("<0xC3>");
  const int32_t second = stories().token_id("<0xA9>");
  ASSERT_NE(first, kNoToken);
  ASSERT_NE(second, kNoToken);
  Sequence sequence({}, greedy(8), stories());
  const std::vector<Step> taken = steps(sequence, {first, second, first, stories().eos()});
  EXPECT_EQ(taken[0].text, "");
  EXPECT_EQ(taken[1].text, "\xC3\xA9");
  EXPECT_EQ(taken[2].text, "");
  EXPECT_EQ(taken[3].text, "\xEF\xBF\xBD");  // the stream ended inside a character: U+FFFD
}

TEST(Sequence, ContextFullFinishesAfterTheTokenChosen) {
  const Words w = words();
  Sequence sequence({}, greedy(8), stories());
  const Step step = sequence.step(row_for(w.once), true);
  EXPECT_EQ(step.finish, FinishReason::ContextFull);
  EXPECT_EQ(step.text, " Once");
  EXPECT_EQ(sequence.tokens(), std::vector<int32_t>{w.once});
}

TEST(Sequence, CancelFinishesBetweenStepsWithTheHeldBackText) {
  const Words w = words();
  GenerationParams params = greedy(8);
  params.stop_strings = {"on a"};
  Sequence sequence({}, params, stories());
  steps(sequence, {w.once, w.upon});
  const Step cancelled = sequence.cancel();
  EXPECT_EQ(cancelled.token, kNoToken);
  EXPECT_EQ(cancelled.text, "on");
  EXPECT_EQ(cancelled.finish, FinishReason::Cancelled);
  EXPECT_EQ(sequence.finish_reason(), FinishReason::Cancelled);
  EXPECT_EQ(sequence.tokens(), (std::vector<int32_t>{w.once, w.upon}));

  const Step again = sequence.cancel();
  EXPECT_EQ(again.text, "");
  EXPECT_FALSE(again.finish);
  EXPECT_EQ(sequence.finish_reason(), FinishReason::Cancelled);
  EXPECT_NE(error_of([&] { sequence.step(row_for(w.a), false); }), "");
}

TEST(Sequence, LogitBiasBansAndForces) {
  const Words w = words();
  const std::vector<float> row = row_for(w.once, w.upon, 5.0f);
  GenerationParams params = greedy(8);
  params.sampling.logit_bias = {{w.once, -sampling::kMaxLogitBias}};
  EXPECT_EQ(Sequence({}, params, stories()).step(row, false).token, w.upon);
  params.sampling.logit_bias = {{w.time, sampling::kMaxLogitBias}};
  EXPECT_EQ(Sequence({}, params, stories()).step(row, false).token, w.time);
}

TEST(Sequence, LogprobsAreThoseOfTheRowGiven) {
  GenerationParams params;
  params.sampling.seed = 5;
  params.top_logprobs = 5;
  Sequence sequence({}, params, stories());
  for (uint32_t seed = 0; seed < 4; ++seed) {
    const std::vector<float> row = random_row(seed);
    const Step step = sequence.step(row, false);
    ASSERT_TRUE(step.logprobs);
    const sampling::Logprobs expected = sampling::token_logprobs(row, step.token, 5);
    EXPECT_EQ(step.logprobs->chosen.id, step.token);
    EXPECT_EQ(step.logprobs->chosen.logprob, expected.chosen.logprob);
    ASSERT_EQ(step.logprobs->top.size(), 5u);
    for (size_t i = 0; i < expected.top.size(); ++i) {
      EXPECT_EQ(step.logprobs->top[i].id, expected.top[i].id);
      EXPECT_EQ(step.logprobs->top[i].logprob, expected.top[i].logprob);
    }
  }

  params.top_logprobs = 0;
  const Step chosen_only = Sequence({}, params, stories()).step(random_row(9), false);
  ASSERT_TRUE(chosen_only.logprobs);
  EXPECT_TRUE(chosen_only.logprobs->top.empty());
}

TEST(Sequence, PenaltiesSeeThePromptAsHistory) {
  const Words w = words();
  const std::vector<float> row = row_for(w.once, w.upon, 9.0f);
  const GenerationParams params = greedy_penalizing_repeats();
  EXPECT_EQ(Sequence({}, params, stories()).step(row, false).token, w.once);
  const std::vector<int32_t> prompt = {w.time, w.once};
  EXPECT_EQ(Sequence(prompt, params, stories()).step(row, false).token, w.upon);
}

TEST(Sequence, StepWithATokenIsTheStepWithLogitsThatChooseIt) {
  const Words w = words();
  GenerationParams params = greedy(8);
  params.stop_strings = {"on a"};
  Sequence with_logits({}, params, stories());
  Sequence with_tokens({}, params, stories());
  for (const int32_t token : {w.once, w.upon, w.a}) {
    const Step expected = with_logits.step(row_for(token), false);
    const Step step = with_tokens.step(token, false);
    EXPECT_EQ(step.token, expected.token);
    EXPECT_EQ(step.text, expected.text);
    EXPECT_EQ(step.finish, expected.finish);
  }
  EXPECT_EQ(with_tokens.finish_reason(), FinishReason::StopString);
  EXPECT_EQ(with_tokens.tokens(), with_logits.tokens());
  EXPECT_EQ(error_of([&] { with_tokens.step(w.time, false); }), "the sequence has finished: it takes no more steps");
}

TEST(Sequence, PenaltiesSeeTheTokensStepsWereGiven) {
  const Words w = words();
  Sequence sequence({}, greedy_penalizing_repeats(), stories());
  sequence.step(w.once, false);
  EXPECT_EQ(sequence.step(row_for(w.once, w.upon, 9.0f), false).token, w.upon);
}

TEST(Sequence, StepsFromArgmaxWhereGreedyChoiceNeedsNothingElse) {
  const Words w = words();
  EXPECT_TRUE(Sequence({}, greedy(8), stories()).steps_from_argmax());
  GenerationParams params = greedy(8);
  params.top_logprobs = 0;
  EXPECT_FALSE(Sequence({}, params, stories()).steps_from_argmax());
  params = greedy(8);
  params.sampling.logit_bias = {{w.once, 1.0f}};
  EXPECT_FALSE(Sequence({}, params, stories()).steps_from_argmax());
  params = greedy(8);
  params.sampling.presence_penalty = 0.5f;
  EXPECT_FALSE(Sequence({}, params, stories()).steps_from_argmax());
  params = greedy(8);
  params.sampling.temperature = 0.5f;
  EXPECT_FALSE(Sequence({}, params, stories()).steps_from_argmax());
}

TEST(Sequence, ParametersAreCheckedWhenItIsCreated) {
  const auto error_for = [](const GenerationParams& params) {
    return error_of([&] { Sequence({}, params, stories()); });
  };
  GenerationParams params;
  params.sampling.logit_bias = {{512, 1.0f}};
  EXPECT_EQ(error_for(params), "logit bias: token 512 is outside the vocabulary of 512 tokens");
  params.sampling.logit_bias = {{3, std::numeric_limits<float>::quiet_NaN()}};
  EXPECT_NE(error_for(params).find("logit bias of token 3"), std::string::npos);

  params = {};
  params.top_logprobs = sampling::kMaxTopLogprobs + 1;
  EXPECT_EQ(error_for(params), "top log-probabilities must be 0 to 20, got 21");
  params.top_logprobs = -1;
  EXPECT_EQ(error_for(params), "top log-probabilities must be 0 to 20, got -1");

  params = {};
  params.stop_strings = {"fine", ""};
  EXPECT_EQ(error_for(params), "stop string 1 is empty");

  params = {};
  params.sampling.top_p = 0.0f;
  EXPECT_NE(error_for(params).find("top-p must be positive"), std::string::npos);
}

}  // namespace
}  // namespace rf::engine
