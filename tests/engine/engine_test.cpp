// The engine on a real trained model: greedy generation reproduces llama.cpp's continuation, chat turns reuse
// the KV cache (evaluating only the new tokens, with the logits of a fresh evaluation), and the limits of the
// context are reported rather than crashed into.
#include "engine/engine.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_paths.h"
#include "util/error.h"

namespace rf::engine {
namespace {

const std::string kStories = "models/stories260K.gguf";

struct Reference {
  std::string prompt;
  std::vector<int32_t> prompt_tokens;
  std::vector<int32_t> greedy_tokens;
};

Reference read_reference() {
  const nlohmann::json json = nlohmann::json::parse(std::ifstream(test::shared_path("reference/stories260K.p1.json")));
  return {json.at("prompt").get<std::string>(), json.at("prompt_tokens").get<std::vector<int32_t>>(),
          json.at("greedy_tokens").get<std::vector<int32_t>>()};
}

EngineOptions small_context(int64_t context) {
  EngineOptions options;
  options.context = context;
  options.threads = 2;
  return options;
}

GenerationParams greedy(int64_t max_tokens) {
  GenerationParams params;
  params.max_tokens = max_tokens;
  params.sampling.temperature = 0.0f;
  return params;
}

bool keep_going(int32_t) { return true; }

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(Engine, GreedyGenerationMatchesLlamaCpp) {
  const Reference ref = read_reference();
  Engine engine(test::shared_path(kStories), small_context(128));
  EXPECT_EQ(engine.tokenizer().encode(ref.prompt, true, false), ref.prompt_tokens);

  std::vector<int32_t> streamed;
  const Generation generation =
      engine.generate(ref.prompt_tokens, greedy(static_cast<int64_t>(ref.greedy_tokens.size())), [&](int32_t token) {
        streamed.push_back(token);
        return true;
      });
  EXPECT_EQ(generation.tokens, ref.greedy_tokens);
  EXPECT_EQ(streamed, ref.greedy_tokens);
  EXPECT_EQ(generation.stop, StopReason::TokenLimit);
  EXPECT_EQ(generation.prompt_tokens, static_cast<int64_t>(ref.prompt_tokens.size()));
  EXPECT_EQ(generation.decoded_tokens, static_cast<int64_t>(ref.greedy_tokens.size()) - 1);
}

TEST(Engine, NextTurnEvaluatesOnlyNewTokensWithFreshLogits) {
  const Reference ref = read_reference();
  Engine chat(test::shared_path(kStories), small_context(128));
  const Generation first = chat.generate(ref.prompt_tokens, greedy(8), keep_going);
  // The last generated token was chosen but never evaluated: the cache holds the prompt and the others.
  const std::vector<int32_t> cached = chat.cached_tokens();
  ASSERT_EQ(cached.size(), ref.prompt_tokens.size() + first.tokens.size() - 1);

  const std::vector<int32_t> next_turn = chat.tokenizer().encode(" The dog said hello.", false, false);
  const std::vector<int32_t> conversation = concat(concat(ref.prompt_tokens, first.tokens), next_turn);
  const std::span<const float> logits = chat.evaluate(conversation);
  EXPECT_EQ(chat.last_evaluated(), static_cast<int64_t>(conversation.size() - cached.size()));
  const std::vector<float> reused(logits.begin(), logits.end());

  Engine fresh(test::shared_path(kStories), small_context(128));
  const std::span<const float> expected = fresh.evaluate(conversation);
  EXPECT_EQ(fresh.last_evaluated(), static_cast<int64_t>(conversation.size()));
  ASSERT_EQ(reused.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) ASSERT_NEAR(reused[i], expected[i], 1e-4f) << "logit " << i;
}

TEST(Engine, GenerateCountsReusedAndNewPromptTokens) {
  const Reference ref = read_reference();
  Engine chat(test::shared_path(kStories), small_context(128));
  const Generation first = chat.generate(ref.prompt_tokens, greedy(8), keep_going);
  const auto cached = static_cast<int64_t>(chat.cached_tokens().size());

  const std::vector<int32_t> next_turn = chat.tokenizer().encode(" The dog said hello.", false, false);
  const std::vector<int32_t> conversation = concat(concat(ref.prompt_tokens, first.tokens), next_turn);
  const Generation second = chat.generate(conversation, greedy(4), keep_going);
  EXPECT_EQ(second.reused_tokens, cached);
  EXPECT_EQ(second.prompt_tokens, static_cast<int64_t>(conversation.size()) - cached);

  // A conversation that diverges after the prompt keeps only the prompt.
  const std::vector<int32_t> other = concat(ref.prompt_tokens, next_turn);
  chat.evaluate(other);
  EXPECT_EQ(chat.last_evaluated(), static_cast<int64_t>(next_turn.size()));
}

TEST(Engine, SameSeedSameText) {
  const Reference ref = read_reference();
  GenerationParams params;
  params.max_tokens = 24;
  params.sampling.seed = 1234;
  Engine a(test::shared_path(kStories), small_context(64));
  Engine b(test::shared_path(kStories), small_context(64));
  EXPECT_EQ(a.generate(ref.prompt_tokens, params, keep_going).tokens,
            b.generate(ref.prompt_tokens, params, keep_going).tokens);
}

TEST(Engine, StopsWhenTheContextIsFull) {
  const Reference ref = read_reference();
  constexpr int64_t kContext = 16;
  Engine engine(test::shared_path(kStories), small_context(kContext));
  GenerationParams params = greedy(-1);
  params.ignore_eos = true;
  const Generation generation = engine.generate(ref.prompt_tokens, params, keep_going);
  EXPECT_EQ(generation.stop, StopReason::ContextFull);
  // Every position holds a token, and one more was chosen from the logits of the last.
  EXPECT_EQ(static_cast<int64_t>(engine.cached_tokens().size()), kContext);
  EXPECT_EQ(static_cast<int64_t>(generation.tokens.size()), kContext - static_cast<int64_t>(ref.prompt_tokens.size()) + 1);
}

TEST(Engine, CallbackStopsGeneration) {
  const Reference ref = read_reference();
  Engine engine(test::shared_path(kStories), small_context(64));
  int calls = 0;
  const Generation generation = engine.generate(ref.prompt_tokens, greedy(20), [&](int32_t) { return ++calls < 3; });
  EXPECT_EQ(generation.stop, StopReason::Callback);
  EXPECT_EQ(generation.tokens.size(), 3u);
}

TEST(Engine, ZeroTokensEvaluatesThePromptOnly) {
  const Reference ref = read_reference();
  Engine engine(test::shared_path(kStories), small_context(64));
  const Generation generation = engine.generate(ref.prompt_tokens, greedy(0), keep_going);
  EXPECT_TRUE(generation.tokens.empty());
  EXPECT_EQ(engine.cached_tokens(), ref.prompt_tokens);
}

TEST(Engine, PromptLongerThanTheContextIsAnError) {
  Engine engine(test::shared_path(kStories), small_context(8));
  const std::vector<int32_t> prompt(9, 403);
  try {
    engine.generate(prompt, greedy(4), keep_going);
    FAIL() << "expected an rf::Error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "prompt of 9 tokens does not fit the context of 8");
  }
}

TEST(Engine, VocabularyOnlyFileIsAnError) {
  EXPECT_THROW(Engine(test::shared_path("vocab/ggml-vocab-llama-spm.gguf")), Error);
}

TEST(Engine, DefaultContextIsTheModelsWhenItFits) {
  Engine engine(test::shared_path(kStories));
  EXPECT_EQ(engine.context(), engine.config().context_length);
  EXPECT_EQ(default_context(engine.config()), engine.config().context_length);
}

}  // namespace
}  // namespace rf::engine
