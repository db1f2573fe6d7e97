#include "engine/scheduler.h"

#include <algorithm>

#include "util/error.h"

namespace rf::engine {
namespace {

// Threads that sample a step's sequences at most: a step of one sequence of the Llama-3 vocabulary (128256 logits)
// spent 0.18 ms sampling on an H200's host, most of it reading the row the GPU had just copied there.
constexpr int kMaxSamplingThreads = 16;

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point start, Clock::time_point end) {
  return std::chrono::duration<double>(end - start).count();
}

// The blocks of the engine's paged KV cache.
int64_t paged_blocks(Engine& engine) {
  const int64_t blocks = engine.forward_pass().kv_blocks();
  if (blocks == 0) fail("the scheduler needs an engine with a paged KV cache (EngineOptions::paged)");
  return blocks;
}

GenerationParams with_seed_offset(GenerationParams params, int32_t choice) {
  params.sampling.seed += static_cast<uint64_t>(choice);
  return params;
}

}  // namespace

void RequestHandle::cancel() {
  const std::lock_guard lock(mutex_);
  cancelled_ = true;
}

bool RequestHandle::cancelled() const {
  const std::lock_guard lock(mutex_);
  return cancelled_;
}

bool RequestHandle::finished() const {
  const std::lock_guard lock(mutex_);
  return running_ == 0;
}

std::vector<Generation> RequestHandle::wait() {
  std::unique_lock lock(mutex_);
  done_.wait(lock, [this] { return running_ == 0; });
  if (error_) std::rethrow_exception(error_);
  return generations_;
}

// What a request's choices share.
struct RequestState {
  Request request;
  std::shared_ptr<RequestHandle> handle;
  Clock::time_point submitted;
  int64_t reused_tokens = 0;  // prompt positions its first admission took from cached blocks
};

// One choice of a request: its Sequence, and the tokens whose keys and values it needs (the prompt, then the tokens
// generated), of which the pool holds the computed ones while it is admitted.
struct Scheduler::Running {
  Running(SequenceId id_, std::shared_ptr<RequestState> request_, int32_t choice_, Sequence sequence_,
          std::vector<int32_t> tokens_)
      : id(id_),
        request(std::move(request_)),
        choice(choice_),
        sequence(std::move(sequence_)),
        tokens(std::move(tokens_)) {}

  // Whether the request's other choices are still to be forked from its prompt's logits (choice 0 only).
  bool forks_pending() const { return choice == 0 && !forked && request->request.choices > 1; }

  SequenceId id;
  std::shared_ptr<RequestState> request;
  int32_t choice;
  Sequence sequence;
  std::vector<int32_t> tokens;
  bool admitted = false;
  bool forked = false;     // choice 0 only: whether the other choices exist
  int64_t high_water = 0;  // positions computed at most so far: computing below it again is recomputation
  bool done = false;       // finished: to be removed from running_ or waiting_
  Clock::time_point first_token;
  Generation generation;
};

// One step's batch: which sequences evaluate how many of their tokens, and the block copies before it.
struct Scheduler::Work {
  struct Chunk {
    Running* sequence;
    int64_t tokens;
    bool logits;  // the chunk ends with the sequence's newest token: its logits choose the next
  };
  std::vector<Chunk> chunks;
  std::vector<BlockCopy> copies;
  bool preempted = false;
};

Scheduler::Scheduler(Engine& engine, const SchedulerOptions& options)
    : engine_(engine),
      options_(options),
      sequence_context_(std::min(engine.config().context_length, paged_blocks(engine) * model::kKvBlockPositions)),
      pool_(paged_blocks(engine)),
      sampling_threads_(std::min(cpu::physical_core_count(), kMaxSamplingThreads)) {
  if (options_.max_sequences < 1) fail("max_sequences must be at least 1, not {}", options_.max_sequences);
  if (options_.token_budget == 0) options_.token_budget = engine.forward_pass().max_batch();
  if (options_.token_budget < options_.max_sequences)
    fail("a token budget of {} cannot step {} sequences at once", options_.token_budget, options_.max_sequences);
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

std::unique_ptr<Scheduler::Running> Scheduler::prepare(Request request) const {
  const auto prompt = static_cast<int64_t>(request.prompt.size());
  if (prompt == 0) fail("the prompt has no tokens");
  if (prompt > sequence_context_) fail("prompt of {} tokens does not fit the context of {}", prompt, sequence_context_);
  if (request.choices < 1 || request.choices > options_.max_sequences)
    fail("choices must be within 1..{}, not {}", options_.max_sequences, request.choices);
  model::check_tokens(engine_.config(), request.prompt);

  auto state = std::make_shared<RequestState>();
  state->handle = std::make_shared<RequestHandle>();
  state->handle->running_ = request.choices;
  state->handle->generations_.resize(static_cast<size_t>(request.choices));
  state->submitted = Clock::now();
  // Choice 0's Sequence checks the parameters now; the others differ from it only by their seed.
  auto first = std::make_unique<Running>(0, state, 0, Sequence(request.prompt, request.params, engine_.tokenizer()),
                                         request.prompt);
  state->request = std::move(request);
  return first;
}

std::shared_ptr<RequestHandle> Scheduler::submit(Request request) { return submit(std::vector{std::move(request)})[0]; }

std::vector<std::shared_ptr<RequestHandle>> Scheduler::submit(std::vector<Request> requests) {
  std::vector<std::unique_ptr<Running>> prepared;
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (Request& request : requests) {
    prepared.push_back(prepare(std::move(request)));
    handles.push_back(prepared.back()->request->handle);
  }
  {
    const std::lock_guard lock(mutex_);
    for (std::unique_ptr<Running>& first : prepared) {
      first->id = next_id_++;
      queue_.push_back(std::move(first));
    }
  }
  wake_.notify_one();
  return handles;
}

Scheduler::Stats Scheduler::stats() const {
  const std::lock_guard lock(mutex_);
  return stats_;
}

void Scheduler::loop() {
  while (collect()) {
    Work work;
    schedule(work);
    try {
      if (!work.chunks.empty()) run(work);
    } catch (...) {
      fail_all(std::current_exception());
    }
    publish();
  }
  for_each_sequence([this](Running& sequence) { end(sequence, FinishReason::Cancelled); });
  publish();
}

bool Scheduler::collect() {
  {
    std::unique_lock lock(mutex_);
    wake_.wait(lock, [this] { return stopping_ || !queue_.empty() || !running_.empty() || !waiting_.empty(); });
    for (; !queue_.empty(); queue_.pop_front()) waiting_.push_back(std::move(queue_.front()));
    if (stopping_) return false;
  }
  const Clock::time_point now = Clock::now();
  for_each_sequence([&](Running& sequence) {
    const RequestState& state = *sequence.request;
    if (state.request.deadline && now >= *state.request.deadline)
      end(sequence, FinishReason::Deadline);
    else if (state.handle->cancelled())
      end(sequence, FinishReason::Cancelled);
  });
  publish();
  return true;
}

void Scheduler::publish() {
  {
    const std::lock_guard lock(mutex_);
    const auto unfinished = [](const auto& list) {
      return std::count_if(list.begin(), list.end(), [](const auto& sequence) { return !sequence->done; });
    };
    stats_.pool = pool_.stats();
    stats_.running = unfinished(running_);
    stats_.waiting = unfinished(waiting_) + static_cast<int64_t>(queue_.size());
  }
  sweep();
}

void Scheduler::schedule(Work& work) {
  const auto pending = [this](const Running& sequence) {
    return static_cast<int64_t>(sequence.tokens.size()) - pool_.computed(sequence.id);
  };
  // Every decoding sequence takes one token of the budget; prompts share the rest, oldest first.
  const auto decoding =
      std::count_if(running_.begin(), running_.end(), [&](const auto& s) { return pending(*s) == 1; });
  int64_t prompt_budget = std::max<int64_t>(0, options_.token_budget - decoding);
  for (size_t i = 0; i < running_.size(); ++i) {
    Running& sequence = *running_[i];
    const int64_t left = pending(sequence);
    const int64_t n = left == 1 ? 1 : std::min(left, prompt_budget);
    if (n == 0) continue;
    // Blocks run out: the newest sequence gives its up, until this one fits or is the newest itself.
    std::optional<std::vector<BlockCopy>> copies;
    while (!(copies = pool_.reserve(sequence.id, n)) && running_.back().get() != &sequence) preempt(work);
    if (!copies) {
      preempt(work);
      break;
    }
    if (left > 1) prompt_budget -= n;
    work.copies.insert(work.copies.end(), copies->begin(), copies->end());
    work.chunks.push_back({&sequence, n, n == left});
  }
  // New sequences join while blocks and budget allow, unless this step had to preempt (they would only thrash).
  while (!work.preempted && !waiting_.empty() && prompt_budget > 0) {
    Running& sequence = *waiting_.front();
    const int32_t choices = sequence.forked ? 1 : sequence.request->request.choices;
    if (static_cast<int64_t>(running_.size()) + choices > options_.max_sequences) break;
    const int64_t reused = pool_.start(sequence.id, sequence.tokens);
    const int64_t n = std::min(static_cast<int64_t>(sequence.tokens.size()) - reused, prompt_budget);
    std::optional<std::vector<BlockCopy>> copies = pool_.reserve(sequence.id, n);
    if (!copies) {
      // It retries on a later step; the pool counts its prefix's reuse only once a reservation succeeds.
      pool_.release(sequence.id);
      break;
    }
    if (sequence.high_water == 0 && sequence.choice == 0) sequence.request->reused_tokens = reused;
    sequence.high_water = std::max(sequence.high_water, reused);
    sequence.admitted = true;
    prompt_budget -= n;
    work.copies.insert(work.copies.end(), copies->begin(), copies->end());
    work.chunks.push_back({&sequence, n, reused + n == static_cast<int64_t>(sequence.tokens.size())});
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

void Scheduler::preempt(Work& work) {
  std::unique_ptr<Running> victim = std::move(running_.back());
  running_.pop_back();
  pool_.release(victim->id);
  victim->admitted = false;
  work.preempted = true;
  {
    const std::lock_guard lock(mutex_);
    ++stats_.preemptions;
  }
  waiting_.push_front(std::move(victim));
}

model::Logits Scheduler::newest_logits(const Running& sequence) {
  // The other choices sample the prompt's logits with seeds of their own.
  return sequence.sequence.steps_from_argmax() && !sequence.forks_pending() ? model::Logits::Argmax
                                                                            : model::Logits::Last;
}

void Scheduler::run(Work& work) {
  std::vector<model::BatchSequence> batch;
  batch.reserve(work.chunks.size());
  for (const Work::Chunk& chunk : work.chunks) {
    const Running& sequence = *chunk.sequence;
    const int64_t computed = pool_.computed(sequence.id);
    batch.push_back(
        {.tokens = std::span(sequence.tokens).subspan(static_cast<size_t>(computed), static_cast<size_t>(chunk.tokens)),
         .position = computed,
         .blocks = pool_.table(sequence.id),
         .logits = chunk.logits ? newest_logits(sequence) : model::Logits::None});
  }
  const Clock::time_point step_start = Clock::now();
  const std::span<const float> logits = engine_.forward_pass().forward(batch, work.copies);
  const std::span<const int32_t> argmax = engine_.forward_pass().argmax();
  const Clock::time_point forwarded = Clock::now();

  const auto vocab = static_cast<size_t>(engine_.config().vocab_size);
  size_t row = 0;
  size_t argmax_row = 0;
  int64_t prompt = 0, decoded = 0, recomputed = 0;
  std::vector<Stepping> stepping;
  for (size_t i = 0; i < work.chunks.size(); ++i) {
    const Work::Chunk& chunk = work.chunks[i];
    Running& sequence = *chunk.sequence;
    const int64_t start = pool_.computed(sequence.id);
    const int64_t end = start + chunk.tokens;
    pool_.mark_computed(sequence.id, chunk.tokens);
    const auto prompt_size = static_cast<int64_t>(sequence.request->request.prompt.size());
    const int64_t fresh_start = std::max(start, sequence.high_water);
    recomputed += std::max<int64_t>(0, std::min(end, sequence.high_water) - start);
    prompt += std::max<int64_t>(0, std::min(end, prompt_size) - fresh_start);
    decoded += std::max<int64_t>(0, end - std::max(fresh_start, prompt_size));
    sequence.high_water = std::max(sequence.high_water, end);
    if (batch[i].logits == model::Logits::Argmax) {
      stepping.push_back({&sequence, {}, argmax[argmax_row++], std::nullopt});
    } else if (chunk.logits) {
      const std::span<const float> row_logits = logits.subspan(vocab * row++, vocab);
      fork(sequence, row_logits, stepping);
      stepping.push_back({&sequence, row_logits, kNoToken, std::nullopt});
    }
  }
  // Sampling, detokenizing and matching stop strings are each sequence's own work: they run in parallel.
  sampling_threads_.parallel_for(static_cast<int64_t>(stepping.size()), 1, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i)
      stepping[static_cast<size_t>(i)].step = sample(stepping[static_cast<size_t>(i)]);
  });
  {
    const std::lock_guard lock(mutex_);
    ++stats_.steps;
    stats_.prompt_tokens += prompt;
    stats_.decoded_tokens += decoded;
    stats_.recomputed_tokens += recomputed;
    stats_.argmax_rows += static_cast<int64_t>(argmax_row);
    stats_.forward_seconds += seconds_between(step_start, forwarded);
    stats_.sampling_seconds += seconds_between(forwarded, Clock::now());
  }
  for (const Stepping& next : stepping) take(*next.sequence, next.step);
}

void Scheduler::fork(Running& sequence, std::span<const float> logits, std::vector<Stepping>& stepping) {
  if (!sequence.forks_pending()) return;
  sequence.forked = true;
  RequestState& state = *sequence.request;
  for (int32_t choice = 1; choice < state.request.choices; ++choice) {
    SequenceId id = 0;
    {
      const std::lock_guard lock(mutex_);
      id = next_id_++;
    }
    auto child = std::make_unique<Running>(
        id, sequence.request, choice,
        Sequence(state.request.prompt, with_seed_offset(state.request.params, choice), engine_.tokenizer()),
        sequence.tokens);
    child->admitted = true;
    child->forked = true;
    child->high_water = sequence.high_water;
    pool_.fork(sequence.id, child->id);
    stepping.push_back({running_.emplace_back(std::move(child)).get(), logits, kNoToken, std::nullopt});
  }
}

std::optional<Step> Scheduler::sample(const Stepping& next) const {
  Running& sequence = *next.sequence;
  if (sequence.generation.tokens.empty() && sequence.sequence.tokens().empty()) {
    sequence.first_token = Clock::now();
    sequence.generation.prompt_seconds = seconds_between(sequence.request->submitted, sequence.first_token);
  }
  // A request for no tokens (max_tokens 0) has finished before its first step: its prompt is evaluated (and cached).
  if (sequence.sequence.finished()) return std::nullopt;
  // The token chosen now would be evaluated at position tokens.size().
  const bool context_full = static_cast<int64_t>(sequence.tokens.size()) >= sequence_context_;
  if (next.logits.empty()) return sequence.sequence.step(next.token, context_full);
  return sequence.sequence.step(next.logits, context_full);
}

void Scheduler::take(Running& sequence, const std::optional<Step>& step) {
  if (!step) {
    complete(sequence);
    return;
  }
  record(sequence, *step);
  if (sequence.sequence.finished()) {
    complete(sequence);
    return;
  }
  sequence.tokens.push_back(step->token);
  pool_.append(sequence.id, {&step->token, 1});
}

void Scheduler::record(Running& sequence, const Step& step) {
  sequence.generation.text += step.text;
  if (step.logprobs) sequence.generation.logprobs.push_back(*step.logprobs);
  if (sequence.request->request.on_step) sequence.request->request.on_step(sequence.choice, step);
}

void Scheduler::end(Running& sequence, FinishReason reason) {
  if (sequence.done) return;
  record(sequence, sequence.sequence.cancel(reason));
  complete(sequence);
}

void Scheduler::complete(Running& sequence) {
  if (sequence.admitted) pool_.release(sequence.id);
  sequence.admitted = false;
  sequence.done = true;
  RequestState& state = *sequence.request;
  Generation& generation = sequence.generation;
  generation.tokens = sequence.sequence.tokens();
  generation.finish = *sequence.sequence.finish_reason();
  generation.stop_string = sequence.sequence.stop_string();
  const auto prompt = static_cast<int64_t>(state.request.prompt.size());
  generation.reused_tokens = state.reused_tokens;
  generation.prompt_tokens = prompt - state.reused_tokens;
  generation.decoded_tokens = std::max<int64_t>(0, sequence.high_water - prompt);
  if (!generation.tokens.empty()) generation.decode_seconds = seconds_between(sequence.first_token, Clock::now());
  // Choices that never started (the request ended before its prompt's logits) finish with it.
  const int32_t unstarted = sequence.choice == 0 && !sequence.forked ? state.request.choices - 1 : 0;
  for (int32_t choice = 1; choice <= unstarted; ++choice) {
    Step step;
    step.finish = generation.finish;
    if (state.request.on_step) state.request.on_step(choice, step);
  }
  const std::lock_guard lock(state.handle->mutex_);
  state.handle->generations_[static_cast<size_t>(sequence.choice)] = std::move(generation);
  for (int32_t choice = 1; choice <= unstarted; ++choice)
    state.handle->generations_[static_cast<size_t>(choice)].finish = state.handle->generations_[0].finish;
  state.handle->finished_ += 1 + unstarted;
}

void Scheduler::fail_all(std::exception_ptr error) {
  for_each_sequence([&](Running& sequence) {
    {
      const std::lock_guard lock(sequence.request->handle->mutex_);
      sequence.request->handle->error_ = error;
    }
    end(sequence, FinishReason::Cancelled);
  });
}

template <typename Visit>
void Scheduler::for_each_sequence(const Visit& visit) {
  for (auto& sequence : running_) visit(*sequence);
  for (auto& sequence : waiting_) visit(*sequence);
}

void Scheduler::sweep() {
  const auto drop = [](const std::unique_ptr<Running>& sequence) {
    if (!sequence->done) return false;
    // The request learns that its choice finished once the pool and the stats show it.
    RequestHandle& handle = *sequence->request->handle;
    const std::lock_guard lock(handle.mutex_);
    handle.running_ -= handle.finished_;
    handle.finished_ = 0;
    if (handle.running_ == 0) handle.done_.notify_all();
    return true;
  };
  std::erase_if(running_, drop);
  std::erase_if(waiting_, drop);
}

}  // namespace rf::engine
