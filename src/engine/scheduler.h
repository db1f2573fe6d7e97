// Many sequences at once over one model, as vLLM's and SGLang's schedulers run them. One scheduler thread owns the
// forward pass and a KvBlockPool over its paged KV cache. Each step runs one batch: the next token of every running
// sequence, then chunks of prompts within a token budget, so a long prompt delays running streams by one chunk at
// most (chunked prefill). Requests join and leave between steps (continuous batching). A prompt starts from the
// longest prefix of whole blocks the pool has cached (prefix sharing); the n choices of a request share its prompt's
// blocks. When blocks run out, the most recently admitted sequence is preempted: its blocks are freed and it is
// computed again later from its prompt and the tokens it had generated, which changes none of its results.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "backend/cpu/thread_pool.h"
#include "engine/engine.h"
#include "engine/kv_block_pool.h"
#include "engine/sequence.h"

namespace rf::engine {

struct SchedulerOptions {
  int64_t max_sequences = 64;  // sequences running at once; more wait
  int64_t token_budget = 0;    // tokens a step evaluates at most; 0: the forward pass's max_batch()
};

// Called on the scheduler thread with each step of choice `choice` as it is taken, the finishing one too. It
// should return quickly (hand the step to another thread): every sequence waits for it.
using ChoiceStepCallback = std::function<void(int32_t choice, const Step& step)>;

struct Request {
  std::vector<int32_t> prompt;
  GenerationParams params;
  // Choices generated from the prompt, sharing its blocks; choice i samples with seed params.sampling.seed + i.
  int32_t choices = 1;
  // When it passes, the request finishes (FinishReason::Deadline).
  std::optional<std::chrono::steady_clock::time_point> deadline;
  ChoiceStepCallback on_step;  // may be empty
};

// A submitted request: its results when it has finished, and cancellation at any time.
class RequestHandle {
 public:
  // Finishes every choice before its next step (FinishReason::Cancelled) and frees its blocks; nothing after a
  // request has finished.
  void cancel();
  bool cancelled() const;
  bool finished() const;
  // Waits until every choice has finished and returns them in order (their timings are those of the request: the
  // prompt's evaluation, then the steps). An rf::Error the forward pass raised is rethrown here.
  std::vector<Generation> wait();

 private:
  friend class Scheduler;
  mutable std::mutex mutex_;
  std::condition_variable done_;
  bool cancelled_ = false;
  int32_t running_ = 0;   // choices not finished
  int32_t finished_ = 0;  // choices finished in the scheduler's current step, which are running_ until it ends
  std::vector<Generation> generations_;
  std::exception_ptr error_;
};

class Scheduler {
 public:
  struct Stats {
    KvBlockPool::Stats pool;
    int64_t steps = 0;              // batches evaluated
    double forward_seconds = 0.0;   // in the forward pass (the logits on the host)
    double sampling_seconds = 0.0;  // sampling the sequences' next tokens
    int64_t prompt_tokens = 0;      // prompt positions computed (not those taken from cached blocks)
    int64_t decoded_tokens = 0;     // generated tokens evaluated
    int64_t recomputed_tokens = 0;  // positions computed again after a preemption
    // Rows of logits that the forward pass reduced to the index of their largest (model::Logits::Argmax) instead of
    // returning them: the newest positions of greedy sequences.
    int64_t argmax_rows = 0;
    int64_t preemptions = 0;
    int64_t running = 0;
    int64_t waiting = 0;
  };

  // `engine` must have been opened with EngineOptions::paged and outlive the scheduler, which starts its thread and
  // owns the engine's forward pass until it is destroyed: one scheduler at a time over an engine.
  explicit Scheduler(Engine& engine, const SchedulerOptions& options = {});
  // Cancels every request and joins the thread.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Checks the request (its parameters as Sequence does, its prompt's tokens, a prompt that no sequence's
  // context or the pool can hold, choices outside 1..max_sequences: each an rf::Error naming what is wrong) and
  // queues it; returns at once.
  std::shared_ptr<RequestHandle> submit(Request request);
  // The same for several requests at once, all checked before any is queued: the next step sees all of them.
  std::vector<std::shared_ptr<RequestHandle>> submit(std::vector<Request> requests);
  Stats stats() const;
  // Positions one sequence may reach: the model's context length, or the pool's positions where that is less.
  int64_t sequence_context() const { return sequence_context_; }

 private:
  struct Running;
  struct Work;
  // A request checked, as the first choice's sequence.
  std::unique_ptr<Running> prepare(Request request) const;
  void loop();
  // Waits for work; takes the queued requests and ends the cancelled and expired ones. False when stopping.
  bool collect();
  // Chooses the chunks of the next batch, running sequences first, and reserves their blocks.
  void schedule(Work& work);
  // Frees the newest running sequence's blocks and queues it first among the waiting.
  void preempt(Work& work);
  // A sequence to step with the logits of its newest position, or (logits empty) with the token that the forward pass
  // chose from them as their argmax, and the step it takes (none: it had finished).
  struct Stepping {
    Running* sequence;
    std::span<const float> logits;
    int32_t token = kNoToken;
    std::optional<Step> step;
  };
  // What a chunk that ends with its sequence's newest token asks for: the argmax of its logits where that is all the
  // sequence's step needs and no choices are still to be forked from them, else its logits.
  static model::Logits newest_logits(const Running& sequence);
  // Evaluates the batch and steps each sequence whose newest position it computed.
  void run(Work& work);
  // At the prompt's logits of a request's first choice, starts its other choices from the same blocks and lists
  // them to step.
  void fork(Running& sequence, std::span<const float> logits, std::vector<Stepping>& stepping);
  // Samples the next token; touches nothing but the sequence, so that sequences sample in parallel.
  std::optional<Step> sample(const Stepping& next) const;
  // Hands the step to the request and appends its token, or completes the sequence.
  void take(Running& sequence, const std::optional<Step>& step);
  void record(Running& sequence, const Step& step);
  // Finishes a sequence between steps for `reason`.
  void end(Running& sequence, FinishReason reason);
  // Frees a finished sequence's blocks and hands its generation to the request.
  void complete(Running& sequence);
  void fail_all(std::exception_ptr error);
  // Updates the stats, then drops the finished sequences from running_ and waiting_ and tells their requests (so
  // that a request that has finished finds the stats showing it).
  void publish();
  void sweep();
  template <typename Visit>
  void for_each_sequence(const Visit& visit);

  Engine& engine_;
  SchedulerOptions options_;
  int64_t sequence_context_;
  KvBlockPool pool_;

  mutable std::mutex mutex_;  // guards queue_, stopping_, stats_, next_id_
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Running>> queue_;  // submitted, not yet seen by the scheduler thread
  bool stopping_ = false;
  Stats stats_;
  SequenceId next_id_ = 0;

  // Scheduler thread only.
  std::deque<std::unique_ptr<Running>> running_;  // admitted, in admission order
  std::deque<std::unique_ptr<Running>> waiting_;  // preempted first, then new, in order
  cpu::ThreadPool sampling_threads_;
  std::thread thread_;  // last: starts once everything above exists
};

}  // namespace rf::engine
