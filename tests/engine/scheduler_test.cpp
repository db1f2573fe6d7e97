// Many requests at once through one Scheduler on trained models, each compared with the same request run alone
// (a fresh scheduler: an empty pool, no other sequence): batching, preemption, prefix sharing and the n choices of
// a request change no result. Cancelling frees every block, stop strings split across tokens stop the text,
// log-probabilities are a log-softmax of the logits a single-sequence engine evaluates, greedy steps take the forward
// pass's argmax instead of a row of logits, and bad requests are rf::Errors at submit. On the CPU and on the GPU
// (skipped where there is none).
#include "engine/scheduler.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "error_of.h"
#include "greedy.h"
#include "test_paths.h"
#include "util/error.h"

namespace rf::engine {
namespace {

const std::string kStories = "models/stories260K.gguf";
const std::string kTinyStories = "models/TinyStories-656K-Q8_0.gguf";

EngineOptions paged(int64_t context, Device device = Device::Cpu) {
  EngineOptions options;
  options.device = device;
  options.context = context;
  options.threads = 2;
  options.paged = true;
  return options;
}

using test::greedy;

// Request i of a varied set: its own prompt (a story opening and a few words that differ), length and sampling.
Request varied_request(const Tokenizer& tokenizer, int i) {
  static const char* const kOpenings[] = {"Once upon a time", "One day, a little girl named Lily", "The sun was",
                                          "Tom and his dog", "There was a big red ball"};
  static const char* const kWords[] = {" went", " saw", " liked", " found", " wanted", " said", " ran", " was"};
  std::string text = kOpenings[i % 5];
  for (int w = 0; w < i % 7; ++w) text += kWords[(i + w) % 8];
  Request request;
  request.prompt = tokenizer.encode(text, true, false);
  request.params.max_tokens = 12 + i % 21;
  sampling::SamplingParams& sampling = request.params.sampling;
  sampling.seed = 1000 + static_cast<uint64_t>(i);
  switch (i % 4) {
    case 0:
      sampling.temperature = 0.0f;
      break;
    case 1:
      sampling.temperature = 0.9f;
      break;
    case 2:
      sampling.temperature = 0.7f;
      sampling.top_p = 0.9f;
      sampling.min_p = 0.1f;
      break;
    default:
      sampling.temperature = 1.0f;
      sampling.repeat_penalty = 1.2f;
      sampling.logit_bias[tokenizer.encode(" the", false, false).front()] = -100.0f;
  }
  if (i % 5 == 1) request.params.top_logprobs = 3;
  if (i % 6 == 2) request.params.stop_strings = {"."};
  return request;
}

std::vector<Generation> alone(Engine& engine, const Request& request) {
  Scheduler scheduler(engine);
  return scheduler.submit(request)->wait();
}

void expect_same(const Generation& batched, const Generation& single, const std::string& what) {
  EXPECT_EQ(batched.tokens, single.tokens) << what;
  EXPECT_EQ(batched.text, single.text) << what;
  EXPECT_EQ(batched.finish, single.finish) << what;
  EXPECT_EQ(batched.stop_string, single.stop_string) << what;
  ASSERT_EQ(batched.logprobs.size(), single.logprobs.size()) << what;
  for (size_t t = 0; t < batched.logprobs.size(); ++t) {
    EXPECT_NEAR(batched.logprobs[t].chosen.logprob, single.logprobs[t].chosen.logprob, 1e-3) << what << ", token " << t;
    ASSERT_EQ(batched.logprobs[t].top.size(), single.logprobs[t].top.size()) << what;
  }
}

// A model and the device it runs on.
struct Placement {
  std::string model;
  Device device;
};

class SchedulerTest : public ::testing::TestWithParam<Placement> {
 protected:
  void SetUp() override {
    if (GetParam().device == Device::Gpu && !gpu_available()) GTEST_SKIP() << "no GPU";
  }
  std::string model() const { return test::shared_path(GetParam().model); }
  EngineOptions paged(int64_t context) const { return engine::paged(context, GetParam().device); }
};

TEST_P(SchedulerTest, SixtyFourConcurrentRequestsEqualEachAlone) {
  Engine engine(model(), paged(4096));
  std::vector<Request> requests;
  for (int i = 0; i < 64; ++i) requests.push_back(varied_request(engine.tokenizer(), i));

  std::vector<std::vector<Generation>> batched;
  {
    // One at a time, so that they join the running ones at different steps.
    Scheduler scheduler(engine);
    std::vector<std::shared_ptr<RequestHandle>> handles;
    for (const Request& request : requests) handles.push_back(scheduler.submit(request));
    for (auto& handle : handles) batched.push_back(handle->wait());
    const Scheduler::Stats stats = scheduler.stats();
    EXPECT_EQ(stats.preemptions, 0);
    EXPECT_EQ(stats.pool.used, 0);
    // Steps took many sequences at once: far fewer steps than tokens.
    EXPECT_LT(stats.steps, stats.decoded_tokens / 8);
  }
  int stopped = 0, with_logprobs = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_EQ(batched[i].size(), 1u);
    expect_same(batched[i][0], alone(engine, requests[i])[0], "request " + std::to_string(i));
    stopped += batched[i][0].finish == FinishReason::StopString;
    with_logprobs += !batched[i][0].logprobs.empty();
  }
  EXPECT_GT(stopped, 0);
  EXPECT_GT(with_logprobs, 0);
}

TEST_P(SchedulerTest, PreemptedRequestsGiveTheSameOutputs) {
  // 16 blocks for 24 requests of up to ~50 positions each: sequences are preempted and computed again.
  Engine engine(model(), paged(256));
  std::vector<Request> requests;
  for (int i = 0; i < 24; ++i) {
    requests.push_back(varied_request(engine.tokenizer(), i));
    requests.back().params.max_tokens = 30 + i % 9;
    requests.back().params.stop_strings.clear();
    requests.back().params.ignore_eos = true;
  }
  std::vector<Generation> batched;
  {
    Scheduler scheduler(engine, {.max_sequences = 16});
    for (const auto& handle : scheduler.submit(requests)) batched.push_back(handle->wait()[0]);
    const Scheduler::Stats stats = scheduler.stats();
    EXPECT_GT(stats.preemptions, 0);
    EXPECT_GT(stats.recomputed_tokens, 0);
    EXPECT_EQ(stats.pool.used, 0);
    EXPECT_EQ(stats.pool.free, stats.pool.blocks);
  }
  for (size_t i = 0; i < requests.size(); ++i)
    expect_same(batched[i], alone(engine, requests[i])[0], "request " + std::to_string(i));
}

TEST_P(SchedulerTest, SharedSystemPromptIsComputedOnce) {
  Engine engine(model(), paged(2048));
  const Tokenizer& tokenizer = engine.tokenizer();
  const std::vector<int32_t> system = tokenizer.encode(
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
      "friends. One day, she saw a big dog in the park. The dog was brown and had a long tail. Lily wanted to "
      "play with the dog, but her mom said it was time to go home. Lily was sad, but she said goodbye to the dog",
      true, false);
  std::vector<Request> requests;
  for (const char* question : {" and", " that", " who", " with", " under", " near", " but", " so"}) {
    Request request;
    request.prompt = system;
    const std::vector<int32_t> tail = tokenizer.encode(question, false, false);
    request.prompt.insert(request.prompt.end(), tail.begin(), tail.end());
    request.params = greedy(16);
    requests.push_back(request);
  }
  // The whole blocks that every prompt starts with (their tails may begin alike too).
  auto common = static_cast<int64_t>(system.size());
  for (const Request& request : requests)
    common = std::min<int64_t>(std::mismatch(request.prompt.begin(), request.prompt.end(), requests[0].prompt.begin(),
                                             requests[0].prompt.end()).first - request.prompt.begin(),
                               static_cast<int64_t>(request.prompt.size()) - 1);
  const int64_t shared_blocks = common / model::kKvBlockPositions;
  ASSERT_GE(shared_blocks, 2);

  std::vector<Generation> outputs;
  Scheduler::Stats first, stats;
  {
    Scheduler scheduler(engine);
    outputs.push_back(scheduler.submit(requests[0])->wait()[0]);
    first = scheduler.stats();
    for (const auto& handle : scheduler.submit(std::vector(requests.begin() + 1, requests.end())))
      outputs.push_back(handle->wait()[0]);
    stats = scheduler.stats();
  }

  const auto others = static_cast<int64_t>(requests.size() - 1);
  EXPECT_EQ(stats.pool.reused_blocks - first.pool.reused_blocks, others * shared_blocks);
  int64_t prompt_positions = 0;
  for (size_t i = 1; i < requests.size(); ++i) {
    prompt_positions += static_cast<int64_t>(requests[i].prompt.size());
    EXPECT_EQ(outputs[i].reused_tokens, shared_blocks * model::kKvBlockPositions);
  }
  EXPECT_EQ(stats.prompt_tokens - first.prompt_tokens,
            prompt_positions - others * shared_blocks * model::kKvBlockPositions);
  for (size_t i = 0; i < requests.size(); ++i)
    expect_same(outputs[i], alone(engine, requests[i])[0], "request " + std::to_string(i));
}

TEST_P(SchedulerTest, CancellingFreesEveryBlock) {
  Engine engine(model(), paged(1024));
  Scheduler scheduler(engine);
  std::atomic<int> steps = 0;
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (int i = 0; i < 4; ++i) {
    Request request = varied_request(engine.tokenizer(), i);
    request.params.max_tokens = 200;
    request.params.ignore_eos = true;
    request.params.stop_strings.clear();
    request.on_step = [&steps](int32_t, const Step&) { ++steps; };
    handles.push_back(scheduler.submit(request));
  }
  while (steps < 12) std::this_thread::yield();
  for (auto& handle : handles) handle->cancel();
  for (auto& handle : handles) {
    const Generation generation = handle->wait()[0];
    EXPECT_EQ(generation.finish, FinishReason::Cancelled);
    EXPECT_LT(generation.tokens.size(), 200u);
  }
  const Scheduler::Stats stats = scheduler.stats();
  EXPECT_EQ(stats.pool.used, 0);
  EXPECT_EQ(stats.pool.free, stats.pool.blocks);
  EXPECT_EQ(stats.running, 0);
}

TEST_P(SchedulerTest, StopStringSplitAcrossTokensStopsTheText) {
  Engine engine(model(), paged(1024));
  Request request;
  request.prompt = engine.tokenizer().encode("Once upon a time", true, false);
  request.params = greedy(40);
  request.params.ignore_eos = true;
  std::vector<std::string> pieces;
  request.on_step = [&pieces](int32_t, const Step& step) { pieces.push_back(step.text); };
  const Generation full = alone(engine, request)[0];
  // The end of one step's text and the start of the next: a stop string that no single token holds.
  size_t k = 1;
  while (k + 1 < pieces.size() && (pieces[k].size() < 2 || pieces[k + 1].size() < 2)) ++k;
  ASSERT_LT(k + 1, pieces.size());
  const std::string stop = pieces[k].substr(pieces[k].size() - 2) + pieces[k + 1].substr(0, 2);
  std::string before;
  for (size_t i = 0; i < k; ++i) before += pieces[i];
  before += pieces[k].substr(0, pieces[k].size() - 2);
  ASSERT_EQ(full.text.find(stop), before.size()) << "the stop string must first appear there";

  request.params.stop_strings = {"never appears", stop};
  request.on_step = nullptr;
  const Generation stopped = alone(engine, request)[0];
  EXPECT_EQ(stopped.text, before);
  EXPECT_EQ(stopped.finish, FinishReason::StopString);
  EXPECT_EQ(stopped.stop_string, 1u);
}

TEST_P(SchedulerTest, FourChoicesAreTheSeedsOfFourRequests) {
  Engine engine(model(), paged(2048));
  Request request;
  request.prompt = engine.tokenizer().encode("One day, a little girl named Lily", true, false);
  request.params.max_tokens = 24;
  request.params.sampling.temperature = 1.0f;
  request.params.sampling.seed = 7;
  request.params.top_logprobs = 2;
  request.choices = 4;
  std::vector<std::vector<int32_t>> streamed(4);
  request.on_step = [&streamed](int32_t choice, const Step& step) {
    if (step.token != kNoToken) streamed[static_cast<size_t>(choice)].push_back(step.token);
  };
  const std::vector<Generation> choices = alone(engine, request);
  ASSERT_EQ(choices.size(), 4u);
  int differing = 0;
  for (int32_t i = 0; i < 4; ++i) {
    Request single = request;
    single.choices = 1;
    single.on_step = nullptr;
    single.params.sampling.seed = 7 + static_cast<uint64_t>(i);
    expect_same(choices[static_cast<size_t>(i)], alone(engine, single)[0], "choice " + std::to_string(i));
    EXPECT_EQ(choices[static_cast<size_t>(i)].reused_tokens + choices[static_cast<size_t>(i)].prompt_tokens,
              static_cast<int64_t>(request.prompt.size()));
    EXPECT_EQ(streamed[static_cast<size_t>(i)], choices[static_cast<size_t>(i)].tokens);
    differing += choices[static_cast<size_t>(i)].tokens != choices[0].tokens;
  }
  EXPECT_GT(differing, 0);
}

TEST_P(SchedulerTest, LogprobsAreALogSoftmaxOfTheEvaluatedLogits) {
  Engine batched(model(), paged(1024));
  Request request;
  request.prompt = batched.tokenizer().encode("Tom and his dog", true, false);
  request.params = greedy(10);
  request.params.top_logprobs = 3;
  const Generation generation = alone(batched, request)[0];
  ASSERT_EQ(generation.logprobs.size(), generation.tokens.size());

  EngineOptions options = paged(1024);
  options.paged = false;
  Engine single(model(), options);
  std::vector<int32_t> tokens = request.prompt;
  for (size_t t = 0; t < generation.tokens.size(); ++t) {
    const std::span<const float> logits = single.evaluate(tokens);
    double sum = 0.0;
    const float top = *std::max_element(logits.begin(), logits.end());
    for (const float logit : logits) sum += std::exp(static_cast<double>(logit - top));
    const double expected = logits[static_cast<size_t>(generation.tokens[t])] - top - std::log(sum);
    EXPECT_NEAR(generation.logprobs[t].chosen.logprob, expected, 1e-4) << "token " << t;
    EXPECT_EQ(generation.logprobs[t].top.size(), 3u);
    tokens.push_back(generation.tokens[t]);
  }
}

TEST_P(SchedulerTest, GreedyRequestEqualsTheSingleSequenceEngine) {
  Engine batched(model(), paged(1024));
  EngineOptions options = paged(1024);
  options.paged = false;
  Engine single(model(), options);
  for (int i = 0; i < 8; i += 4) {
    const Request request = varied_request(batched.tokenizer(), i);
    const Generation expected = single.generate(request.prompt, request.params, [](const Step&) { return true; });
    expect_same(alone(batched, request)[0], expected, "request " + std::to_string(i));
  }
}

// Runs the requests at once; returns their first choices' generations, and counts in `steps` the steps that chose a
// token.
std::vector<Generation> run_counting_steps(Engine& engine, std::vector<Request> requests, Scheduler::Stats& stats,
                                           int64_t& steps) {
  std::atomic<int64_t> chosen = 0;
  for (Request& request : requests)
    request.on_step = [&chosen](int32_t, const Step& step) { chosen += step.token != kNoToken; };
  std::vector<Generation> generations;
  Scheduler scheduler(engine);
  for (const auto& handle : scheduler.submit(requests)) generations.push_back(handle->wait()[0]);
  stats = scheduler.stats();
  steps = chosen;
  return generations;
}

TEST_P(SchedulerTest, GreedyStepsTakeTheArgmaxOfTheForwardPass) {
  Engine engine(model(), paged(2048));
  std::vector<Request> greedy_requests;
  for (int i = 0; i < 8; ++i) {
    greedy_requests.push_back(varied_request(engine.tokenizer(), i));
    greedy_requests.back().params = greedy(12 + 3 * i);
  }
  Scheduler::Stats stats;
  int64_t steps = 0;
  const std::vector<Generation> from_argmax = run_counting_steps(engine, greedy_requests, stats, steps);
  EXPECT_GT(steps, 0);
  EXPECT_EQ(stats.argmax_rows, steps);

  // The chosen token's log-probability needs the row of logits: the same requests step from rows.
  std::vector<Request> with_logprobs = greedy_requests;
  for (Request& request : with_logprobs) request.params.top_logprobs = 0;
  const std::vector<Generation> from_rows = run_counting_steps(engine, with_logprobs, stats, steps);
  EXPECT_EQ(stats.argmax_rows, 0);
  for (size_t i = 0; i < greedy_requests.size(); ++i) {
    EXPECT_EQ(from_argmax[i].tokens, from_rows[i].tokens) << "request " << i;
    EXPECT_EQ(from_argmax[i].text, from_rows[i].text) << "request " << i;
    EXPECT_EQ(from_argmax[i].finish, from_rows[i].finish) << "request " << i;
  }

  // Choices fork from the prompt's row of logits; every later step of each takes the argmax.
  Request two_choices = greedy_requests[0];
  two_choices.choices = 2;
  int64_t choice_steps = 0;
  two_choices.on_step = [&choice_steps](int32_t, const Step& step) { choice_steps += step.token != kNoToken; };
  Scheduler scheduler(engine);
  const std::vector<Generation> choices = scheduler.submit(two_choices)->wait();
  ASSERT_EQ(choices.size(), 2u);
  for (const Generation& choice : choices) EXPECT_EQ(choice.tokens, from_argmax[0].tokens);
  EXPECT_EQ(scheduler.stats().argmax_rows, choice_steps - 2);
}

INSTANTIATE_TEST_SUITE_P(Models, SchedulerTest,
                         ::testing::Values(Placement{kStories, Device::Cpu}, Placement{kTinyStories, Device::Cpu},
                                           Placement{kStories, Device::Gpu}, Placement{kTinyStories, Device::Gpu}),
                         [](const ::testing::TestParamInfo<Placement>& param) {
                           return std::string(param.param.model == kStories ? "stories260K" : "TinyStories") +
                                  (param.param.device == Device::Gpu ? "_Gpu" : "_Cpu");
                         });

TEST(SchedulerErrorsTest, BadRequestsAreErrorsAtSubmit) {
  Engine engine(test::shared_path(kStories), paged(256));
  Scheduler scheduler(engine, {.max_sequences = 8});
  Request request;
  request.prompt.assign(300, 5);
  EXPECT_EQ(test::error_of([&] { scheduler.submit(request); }), "prompt of 300 tokens does not fit the context of 256");
  request.prompt = {1, 5};
  request.choices = 9;
  EXPECT_EQ(test::error_of([&] { scheduler.submit(request); }), "choices must be within 1..8, not 9");
  request.choices = 1;
  request.prompt = {1, 100000};
  EXPECT_NE(test::error_of([&] { scheduler.submit(request); }).find("token id 100000 is out of range"),
            std::string::npos);
  request.prompt = {};
  EXPECT_EQ(test::error_of([&] { scheduler.submit(request); }), "the prompt has no tokens");
  request.prompt = {1, 5};
  request.params.sampling.logit_bias[600] = 1.0f;
  EXPECT_NE(test::error_of([&] { scheduler.submit(request); }), "");
}

TEST(SchedulerErrorsTest, RequestForNoTokensFinishesAloneAfterItsPrompt) {
  Engine engine(test::shared_path(kStories), paged(256));
  Scheduler scheduler(engine);
  Request none;
  none.prompt = {1, 5, 6};
  none.params = greedy(0);
  Request some = none;
  some.params = greedy(4);
  const auto handles = scheduler.submit(std::vector{none, some});
  const Generation nothing = handles[0]->wait()[0];
  EXPECT_EQ(nothing.finish, FinishReason::Length);
  EXPECT_TRUE(nothing.tokens.empty());
  EXPECT_EQ(handles[1]->wait()[0].tokens.size(), 4u);
}

TEST(SchedulerErrorsTest, ExpiredDeadlineFinishesTheRequest) {
  Engine engine(test::shared_path(kStories), paged(256));
  Scheduler scheduler(engine);
  Request request;
  request.prompt = {1, 5, 6};
  request.deadline = std::chrono::steady_clock::now();
  const Generation generation = scheduler.submit(request)->wait()[0];
  EXPECT_EQ(generation.finish, FinishReason::Deadline);
  EXPECT_TRUE(generation.tokens.empty());
}

TEST(SchedulerErrorsTest, PagedEngineRefusesSingleSequenceCalls) {
  Engine engine(test::shared_path(kStories), paged(256));
  const std::vector<int32_t> prompt = {1, 5, 6};
  EXPECT_NE(test::error_of([&] { engine.evaluate(prompt); }).find("paged"), std::string::npos);
  EngineOptions options = paged(256);
  options.paged = false;
  Engine single(test::shared_path(kStories), options);
  EXPECT_NE(test::error_of([&] { Scheduler scheduler(single); }).find("paged"), std::string::npos);
}

}  // namespace
}  // namespace rf::engine
