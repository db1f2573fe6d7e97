// The engine on a real trained model, on each backend (the GPU's tests skip where there is none), and with the
// first layers on the CPU and the last on the GPU: greedy generation reproduces llama.cpp's continuation, chat
// turns reuse the KV cache (evaluating only the new tokens, with the logits of a fresh evaluation), a stop string
// spanning two generated tokens ends the text before it, log-probabilities are a log-softmax of the logits
// `evaluate` gives, logit bias steers the choice, and the limits of the context are reported rather than crashed
// into. Device::Auto picks the GPU when there is one, and the GPU generates the CPU's greedy text.
#include "engine/engine.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "error_of.h"
#include "greedy.h"
#include "reference.h"
#include "test_paths.h"
#include "tokenizer/tokenizer.h"
#include "util/argmax.h"
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

EngineOptions small_context(int64_t context, Device device = Device::Cpu) {
  EngineOptions options;
  options.device = device;
  options.context = context;
  options.threads = 2;
  return options;
}

using test::greedy;

bool keep_going(const Step&) { return true; }

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Where the layers of a test's engine run.
struct Placement {
  Device device;
  int64_t gpu_layers;  // EngineOptions::gpu_layers
  const char* name;
};
// stories260K has 5 layers: the last 2 on the GPU.
constexpr int64_t kSplitGpuLayers = 2;

// Each test of this suite runs on the CPU, on the GPU, and on both.
class EngineTest : public ::testing::TestWithParam<Placement> {
 protected:
  void SetUp() override {
    if (GetParam().device == Device::Gpu && !gpu_available()) GTEST_SKIP() << "no GPU";
  }
  EngineOptions small_context(int64_t context) const {
    EngineOptions options = engine::small_context(context, GetParam().device);
    options.gpu_layers = GetParam().gpu_layers;
    return options;
  }
};

TEST_P(EngineTest, RunsOnTheDeviceAskedFor) {
  Engine engine(test::shared_path(kStories), small_context(16));
  const Placement placement = GetParam();
  EXPECT_EQ(engine.device(), placement.device);
  if (placement.device == Device::Cpu) {
    EXPECT_EQ(engine.device_name(), "CPU");
    EXPECT_EQ(engine.threads(), 2);
    EXPECT_EQ(engine.gpu_layers(), 0);
  } else if (placement.gpu_layers < 0) {
    EXPECT_NE(engine.device_name(), "CPU");
    EXPECT_EQ(engine.threads(), 1);
    EXPECT_EQ(engine.gpu_layers(), engine.config().n_layers);
  } else {
    EXPECT_NE(engine.device_name().find(" + CPU"), std::string::npos) << engine.device_name();
    EXPECT_EQ(engine.threads(), 2);
    EXPECT_EQ(engine.gpu_layers(), kSplitGpuLayers);
    EXPECT_LT(kSplitGpuLayers, engine.config().n_layers);
  }
}

TEST_P(EngineTest, GreedyGenerationMatchesLlamaCpp) {
  const Reference ref = read_reference();
  Engine engine(test::shared_path(kStories), small_context(128));
  EXPECT_EQ(engine.tokenizer().encode(ref.prompt, true, false), ref.prompt_tokens);

  std::vector<int32_t> streamed;
  std::string streamed_text;
  const Generation generation = engine.generate(
      ref.prompt_tokens, greedy(static_cast<int64_t>(ref.greedy_tokens.size())), [&](const Step& step) {
        streamed.push_back(step.token);
        streamed_text += step.text;
        return true;
      });
  EXPECT_EQ(generation.tokens, ref.greedy_tokens);
  EXPECT_EQ(streamed, ref.greedy_tokens);
  Detokenizer detokenizer(engine.tokenizer());
  std::string text;
  for (const int32_t token : ref.greedy_tokens) text += detokenizer.push(token);
  text += detokenizer.flush();
  EXPECT_EQ(generation.text, text);
  EXPECT_EQ(streamed_text, text);
  EXPECT_TRUE(generation.logprobs.empty());
  EXPECT_EQ(generation.finish, FinishReason::Length);
  EXPECT_EQ(generation.prompt_tokens, static_cast<int64_t>(ref.prompt_tokens.size()));
  EXPECT_EQ(generation.decoded_tokens, static_cast<int64_t>(ref.greedy_tokens.size()) - 1);
}

TEST_P(EngineTest, NextTurnEvaluatesOnlyNewTokensWithFreshLogits) {
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
  const double agreement = test::cosine(reused, expected);
  std::cout << "[ engine ] reused vs fresh logits: cosine " << agreement << "\n";
  if (GetParam().device == Device::Cpu) {
    // A token's keys and values come out the same whether it ran in a batch or alone.
    for (size_t i = 0; i < expected.size(); ++i) ASSERT_NEAR(reused[i], expected[i], 1e-4f) << "logit " << i;
  } else {
    // The GPU runs batches as GEMMs and single tokens as matrix-vector products, which round differently
    // before the f16 cache (the generated tokens' keys and values were computed alone): held as the backend's
    // tests hold the GPU to the CPU, with the same most likely token.
    EXPECT_GE(agreement, 0.9999);
    EXPECT_EQ(index_of_largest(reused), index_of_largest(expected));
  }
}

TEST_P(EngineTest, GenerateCountsReusedAndNewPromptTokens) {
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

// Gemma 2's sliding-window layers keep rings of their window and one pass on the CPU (8 + 512 positions, fewer than
// this context): a prompt that shares a long prefix with the cache reuses it, one that shares only a short prefix
// finds those keys overwritten and is evaluated from position 0, both with a fresh evaluation's logits. (The GPU's
// passes of 2048 tokens make its rings longer than this context: there it reuses both.)
TEST_P(EngineTest, ReusesAPrefixWhereTheSlidingWindowRingsKeepIt) {
  const std::string gemma2 = test::shared_path("arch/models/synth-gemma2-Q4_K_M.gguf");
  constexpr int64_t kContext = 600;
  std::vector<int32_t> first(560);
  for (size_t i = 0; i < first.size(); ++i) first[i] = static_cast<int32_t>(1 + i * 7 % 500);
  const std::vector<int32_t> tail = {5, 77, 301, 42, 9};
  Engine engine(gemma2, small_context(kContext));
  engine.evaluate(first);
  const bool rings = GetParam().device == Device::Cpu || GetParam().gpu_layers >= 0;
  for (const int64_t keep : {550, 20}) {
    SCOPED_TRACE("sharing " + std::to_string(keep) + " tokens");
    const std::vector<int32_t> prompt = concat({first.begin(), first.begin() + keep}, tail);
    const std::vector<float> reused = [&] {
      const std::span<const float> logits = engine.evaluate(prompt);
      return std::vector<float>(logits.begin(), logits.end());
    }();
    const bool kept = keep == 550 || !rings;
    EXPECT_EQ(engine.last_evaluated(), static_cast<int64_t>(kept ? tail.size() : prompt.size()));
    EXPECT_EQ(engine.cached_tokens(), prompt);

    Engine fresh(gemma2, small_context(kContext));
    const std::span<const float> expected = fresh.evaluate(prompt);
    // Passes of other lengths round the 8-bit activations of some products differently, which this model's sharp
    // attention magnifies (as in reference_test.cpp, to cosines of 0.9992 on an H200).
    EXPECT_GE(test::cosine(reused, expected), 0.995);
    EXPECT_EQ(index_of_largest(reused), index_of_largest(expected));
  }
}

TEST_P(EngineTest, SameSeedSameText) {
  const Reference ref = read_reference();
  GenerationParams params;
  params.max_tokens = 24;
  params.sampling.seed = 1234;
  Engine a(test::shared_path(kStories), small_context(64));
  Engine b(test::shared_path(kStories), small_context(64));
  const Generation from_a = a.generate(ref.prompt_tokens, params, keep_going);
  const Generation from_b = b.generate(ref.prompt_tokens, params, keep_going);
  EXPECT_EQ(from_a.tokens, from_b.tokens);
  EXPECT_FALSE(from_a.text.empty());
  EXPECT_EQ(from_a.text, from_b.text);
}

// The greedy text's pieces, token by token; then a stop string made of the end of one piece and the start of the
// next: the same generation stops at the token that completes it, with the text before it.
TEST_P(EngineTest, StopStringSpanningTwoTokensEndsTheTextBeforeIt) {
  const Reference ref = read_reference();
  std::vector<std::string> pieces;
  const Generation full = Engine(test::shared_path(kStories), small_context(128))
                              .generate(ref.prompt_tokens, greedy(32), [&](const Step& step) {
                                pieces.push_back(step.text);
                                return true;
                              });
  ASSERT_EQ(pieces.size(), full.tokens.size());
  std::string stop;
  size_t completing = 0;  // the token whose text completes it
  size_t end = 0;         // where piece i ends in the text
  for (size_t i = 0; i + 1 < pieces.size() && stop.empty(); ++i) {
    end += pieces[i].size();
    // A few tokens in, so that text comes before it.
    if (i < 4 || pieces[i].empty() || static_cast<uint8_t>(pieces[i].back()) >= 0x80 || pieces[i + 1].size() < 2)
      continue;
    const std::string candidate = pieces[i].back() + pieces[i + 1].substr(0, 2);
    // Its first occurrence in the text must be the one across this boundary.
    if (full.text.find(candidate) == end - 1) {
      stop = candidate;
      completing = i + 1;
    }
  }
  ASSERT_FALSE(stop.empty()) << full.text;
  std::cout << "[ engine ] stop string \"" << stop << "\" across tokens " << completing - 1 << " and " << completing
            << ", after \"" << full.text.substr(0, end - 1) << "\"\n";

  GenerationParams params = greedy(32);
  params.stop_strings = {"not in this story", stop};
  std::string streamed;
  const Generation stopped = Engine(test::shared_path(kStories), small_context(128))
                                 .generate(ref.prompt_tokens, params, [&](const Step& step) {
                                   streamed += step.text;
                                   return true;
                                 });
  EXPECT_EQ(stopped.finish, FinishReason::StopString);
  EXPECT_EQ(stopped.stop_string, 1u);
  EXPECT_EQ(stopped.text, full.text.substr(0, full.text.find(stop)));
  EXPECT_EQ(streamed, stopped.text);
  EXPECT_EQ(stopped.tokens, std::vector<int32_t>(full.tokens.begin(), full.tokens.begin() + completing + 1));
}

// Issue 40's acceptance: log-probabilities agree with a softmax of the logits the model gives for each prefix.
TEST_P(EngineTest, LogprobsAreALogSoftmaxOfTheLogitsOfEvaluate) {
  const Reference ref = read_reference();
  constexpr int32_t kTop = 5;
  GenerationParams params = greedy(12);
  params.top_logprobs = kTop;
  const Generation generation =
      Engine(test::shared_path(kStories), small_context(128)).generate(ref.prompt_tokens, params, keep_going);
  ASSERT_EQ(generation.logprobs.size(), generation.tokens.size());

  Engine engine(test::shared_path(kStories), small_context(128));
  std::vector<int32_t> prefix = ref.prompt_tokens;
  for (size_t i = 0; i < generation.tokens.size(); ++i) {
    SCOPED_TRACE("token " + std::to_string(i));
    const std::span<const float> logits = engine.evaluate(prefix);
    long double sum = 0.0L;
    for (const float logit : logits) sum += std::exp(static_cast<long double>(logit));
    const auto log_softmax = [&](int32_t id) {
      return static_cast<double>(std::log(std::exp(static_cast<long double>(logits[static_cast<size_t>(id)])) / sum));
    };
    std::vector<int32_t> ranked(logits.size());
    for (size_t id = 0; id < ranked.size(); ++id) ranked[id] = static_cast<int32_t>(id);
    std::stable_sort(ranked.begin(), ranked.end(), [&](int32_t a, int32_t b) {
      return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)];
    });

    const sampling::Logprobs& logprobs = generation.logprobs[i];
    EXPECT_EQ(logprobs.chosen.id, generation.tokens[i]);
    EXPECT_EQ(generation.tokens[i], ranked[0]);  // greedy
    EXPECT_NEAR(logprobs.chosen.logprob, log_softmax(generation.tokens[i]), 1e-5);
    ASSERT_EQ(logprobs.top.size(), static_cast<size_t>(kTop));
    for (size_t k = 0; k < logprobs.top.size(); ++k) {
      EXPECT_EQ(logprobs.top[k].id, ranked[k]) << "top " << k;
      EXPECT_NEAR(logprobs.top[k].logprob, log_softmax(ranked[k]), 1e-5) << "top " << k;
    }
    prefix.push_back(generation.tokens[i]);
  }
}

TEST_P(EngineTest, LogitBiasSteersTheChoiceAndIsCheckedFirst) {
  const Reference ref = read_reference();
  Engine engine(test::shared_path(kStories), small_context(64));
  GenerationParams params = greedy(6);
  const int32_t banned = ref.greedy_tokens[0];
  params.sampling.logit_bias = {{banned, -sampling::kMaxLogitBias}};
  EXPECT_NE(engine.generate(ref.prompt_tokens, params, keep_going).tokens[0], banned);
  const int32_t forced = ref.greedy_tokens[3];
  params.sampling.logit_bias = {{forced, sampling::kMaxLogitBias}};
  EXPECT_EQ(engine.generate(ref.prompt_tokens, params, keep_going).tokens, std::vector<int32_t>(6, forced));

  // A bad bias is refused before the prompt is evaluated.
  engine.reset();
  params.sampling.logit_bias = {{engine.tokenizer().n_vocab(), 1.0f}};
  EXPECT_EQ(test::error_of([&] { engine.generate(ref.prompt_tokens, params, keep_going); }),
            "logit bias: token 512 is outside the vocabulary of 512 tokens");
  EXPECT_TRUE(engine.cached_tokens().empty());
}

TEST_P(EngineTest, StopsWhenTheContextIsFull) {
  const Reference ref = read_reference();
  constexpr int64_t kContext = 16;
  Engine engine(test::shared_path(kStories), small_context(kContext));
  GenerationParams params = greedy(-1);
  params.ignore_eos = true;
  const Generation generation = engine.generate(ref.prompt_tokens, params, keep_going);
  EXPECT_EQ(generation.finish, FinishReason::ContextFull);
  // Every position holds a token, and one more was chosen from the logits of the last.
  EXPECT_EQ(static_cast<int64_t>(engine.cached_tokens().size()), kContext);
  EXPECT_EQ(static_cast<int64_t>(generation.tokens.size()), kContext - static_cast<int64_t>(ref.prompt_tokens.size()) + 1);
}

TEST_P(EngineTest, CallbackStopsGeneration) {
  const Reference ref = read_reference();
  Engine engine(test::shared_path(kStories), small_context(64));
  int calls = 0;
  const Generation generation =
      engine.generate(ref.prompt_tokens, greedy(20), [&](const Step&) { return ++calls < 3; });
  EXPECT_EQ(generation.finish, FinishReason::Cancelled);
  EXPECT_EQ(generation.tokens.size(), 3u);
  EXPECT_EQ(calls, 3);
}

TEST_P(EngineTest, ZeroTokensEvaluatesThePromptOnly) {
  const Reference ref = read_reference();
  Engine engine(test::shared_path(kStories), small_context(64));
  const Generation generation = engine.generate(ref.prompt_tokens, greedy(0), keep_going);
  EXPECT_TRUE(generation.tokens.empty());
  EXPECT_EQ(generation.finish, FinishReason::Length);
  EXPECT_EQ(engine.cached_tokens(), ref.prompt_tokens);
}

TEST_P(EngineTest, PromptLongerThanTheContextIsAnError) {
  Engine engine(test::shared_path(kStories), small_context(8));
  const std::vector<int32_t> prompt(9, 403);
  try {
    engine.generate(prompt, greedy(4), keep_going);
    FAIL() << "expected an rf::Error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "prompt of 9 tokens does not fit the context of 8");
  }
}

TEST_P(EngineTest, VocabularyOnlyFileIsAnError) {
  EXPECT_THROW(Engine(test::shared_path("vocab/ggml-vocab-llama-spm.gguf"), small_context(16)), Error);
}

INSTANTIATE_TEST_SUITE_P(Devices, EngineTest,
                         ::testing::Values(Placement{Device::Cpu, -1, "Cpu"}, Placement{Device::Gpu, -1, "Gpu"},
                                           Placement{Device::Gpu, kSplitGpuLayers, "CpuThenGpu"}),
                         [](const ::testing::TestParamInfo<Placement>& placement) {
                           return std::string(placement.param.name);
                         });

TEST(Engine, DefaultContextIsTheModelsWhenItFits) {
  Engine engine(test::shared_path(kStories), EngineOptions{.device = Device::Cpu});
  EXPECT_EQ(engine.context(), engine.config().context_length);
  EXPECT_EQ(default_context(engine.config()), engine.config().context_length);
}

TEST(Engine, AutoPicksTheGpuWhenThereIsOne) {
  Engine engine(test::shared_path(kStories), EngineOptions{.context = 16});
  EXPECT_EQ(engine.device(), gpu_available() ? Device::Gpu : Device::Cpu);
}

TEST(Engine, AskingForAMissingGpuIsAnError) {
  if (gpu_available()) GTEST_SKIP() << "a GPU is here";
  try {
    Engine engine(test::shared_path(kStories), small_context(16, Device::Gpu));
    FAIL() << "expected an rf::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the GPU was asked for, but"), std::string::npos) << e.what();
  }
}

// What `rocmforge run -p "Once upon a time" -n 64 --temp 0` generates: the same tokens on both backends.
TEST(Engine, GpuGeneratesTheCpusGreedyText) {
  if (!gpu_available()) GTEST_SKIP() << "no GPU";
  Engine cpu(test::shared_path(kStories), small_context(512, Device::Cpu));
  Engine gpu(test::shared_path(kStories), small_context(512, Device::Gpu));
  const std::vector<int32_t> prompt = cpu.tokenizer().encode("Once upon a time", true, false);
  const Generation on_cpu = cpu.generate(prompt, greedy(64), keep_going);
  const Generation on_gpu = gpu.generate(prompt, greedy(64), keep_going);
  EXPECT_GT(on_cpu.tokens.size(), 16u);
  EXPECT_EQ(on_gpu.tokens, on_cpu.tokens);
  EXPECT_EQ(on_gpu.finish, on_cpu.finish);
}

TEST(Engine, NoLayersOnTheGpuRunsOnTheCpu) {
  if (!gpu_available()) GTEST_SKIP() << "no GPU";
  EngineOptions options = small_context(16, Device::Gpu);
  options.gpu_layers = 0;
  Engine engine(test::shared_path(kStories), options);
  EXPECT_EQ(engine.device(), Device::Cpu);
  EXPECT_EQ(engine.gpu_layers(), 0);
}

}  // namespace
}  // namespace rf::engine
