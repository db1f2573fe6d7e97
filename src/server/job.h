// One HTTP request's generation, while it runs and for a while after: the scheduler requests it submitted (one per
// prompt, each with its choices), their steps as they arrive for a stream to send, and the state /status reports.
// Steps arrive on the scheduler's thread; the HTTP thread serving the request takes them, or waits for the end.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/scheduler.h"
#include "server/generation_request.h"
#include "server/metrics.h"

namespace rf::server {

class Job : public std::enable_shared_from_this<Job> {
 public:
  using Clock = std::chrono::steady_clock;
  struct Event {
    int32_t choice;  // the prompt's index * choices per prompt + the choice of that prompt
    engine::Step step;
  };

  // `keep_events`: the steps are kept for take_events (a stream); else only counted.
  Job(std::string id, const GenerationRequest& request, bool keep_events, std::shared_ptr<Metrics> metrics);

  const std::string& id() const { return id_; }
  int64_t created() const { return created_; }  // Unix seconds

  // Points each scheduler request's step callback at this job; before they are submitted.
  void attach(std::vector<engine::Request>& requests);
  // The handles of the submitted requests, in prompt order; counts the prompts' tokens in the metrics.
  void start(std::vector<std::shared_ptr<engine::RequestHandle>> handles);
  // Cancels every choice (the scheduler finishes them before their next step); nothing once they have finished.
  void cancel();
  // Whether every choice has taken its finishing step.
  bool finished() const;
  // Steps taken from the job, in order; `last`: the job has finished and these are its last.
  struct Events {
    std::vector<Event> events;
    bool last = false;
  };
  // Waits up to `timeout` for steps, or for the end, and takes the steps that came.
  Events take_events(std::chrono::milliseconds timeout);
  // Waits up to `timeout` for every choice to finish; returns whether they have.
  bool wait_finished(std::chrono::milliseconds timeout);
  // Every choice's generation, in order, once they have all finished (waits for that); an rf::Error the engine
  // raised is rethrown. Once only: the job then lets go of them.
  std::vector<engine::Generation> results();
  // What GET /status/{id} answers.
  nlohmann::json status() const;
  // When the last choice finished; none while some run.
  std::optional<Clock::time_point> finished_at() const;

 private:
  struct Choice {
    int64_t tokens = 0;
    std::optional<engine::FinishReason> finish;
    Clock::time_point first_step;
  };
  void on_step(int32_t choice, const engine::Step& step);
  bool all_finished() const { return finished_choices_ == choices_.size(); }  // with mutex_ held

  const std::string id_;
  const int64_t created_;
  const Clock::time_point submitted_;
  const int32_t choices_per_prompt_;
  const int64_t prompt_tokens_;
  const bool keep_events_;
  const std::shared_ptr<Metrics> metrics_;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<std::shared_ptr<engine::RequestHandle>> handles_;
  std::deque<Event> events_;
  std::vector<Choice> choices_;
  size_t finished_choices_ = 0;
  bool cancelled_ = false;
  std::optional<Clock::time_point> finished_at_;
};

// The jobs that /status and /cancel find by id: running ones, and finished ones for a while after.
class JobRegistry {
 public:
  // A fresh id: `prefix` and 24 random hex digits ("chatcmpl-...").
  std::string new_id(std::string_view prefix);
  void add(std::shared_ptr<Job> job);
  // The job of `id`, or nullptr.
  std::shared_ptr<Job> find(const std::string& id);
  std::vector<std::shared_ptr<Job>> unfinished() const;

 private:
  // Drops the jobs that finished more than the retention ago; at most once a second.
  void prune(Job::Clock::time_point now);

  mutable std::mutex mutex_;
  std::mt19937_64 random_{std::random_device{}()};
  std::unordered_map<std::string, std::shared_ptr<Job>> jobs_;
  Job::Clock::time_point pruned_;
};

}  // namespace rf::server
