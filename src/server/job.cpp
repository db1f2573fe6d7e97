#include "server/job.h"

#include <algorithm>

#include <fmt/format.h>

#include "server/responses.h"

namespace rf::server {
namespace {

// How long /status still knows a finished request.
constexpr auto kRetention = std::chrono::minutes(10);

double seconds_between(Job::Clock::time_point start, Job::Clock::time_point end) {
  return std::chrono::duration<double>(end - start).count();
}

int64_t prompt_tokens_of(const GenerationRequest& request) {
  int64_t tokens = 0;
  for (const engine::Request& prompt : request.requests) tokens += static_cast<int64_t>(prompt.prompt.size());
  return tokens;
}

}  // namespace

Job::Job(std::string id, const GenerationRequest& request, bool keep_events, std::shared_ptr<Metrics> metrics)
    : id_(std::move(id)),
      created_(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
                   .count()),
      submitted_(Clock::now()),
      choices_per_prompt_(request.choices),
      prompt_tokens_(prompt_tokens_of(request)),
      keep_events_(keep_events),
      metrics_(std::move(metrics)),
      choices_(static_cast<size_t>(request.sequences())) {}

void Job::attach(std::vector<engine::Request>& requests) {
  for (size_t prompt = 0; prompt < requests.size(); ++prompt) {
    const int32_t first = static_cast<int32_t>(prompt) * choices_per_prompt_;
    // The scheduler keeps the callback, and with it the job, until the request has finished.
    requests[prompt].on_step = [job = shared_from_this(), first](int32_t choice, const engine::Step& step) {
      job->on_step(first + choice, step);
    };
  }
}

void Job::start(std::vector<std::shared_ptr<engine::RequestHandle>> handles) {
  metrics_->add_prompt_tokens(prompt_tokens_);
  const std::lock_guard lock(mutex_);
  handles_ = std::move(handles);
  if (cancelled_)
    for (const auto& handle : handles_) handle->cancel();
}

void Job::cancel() {
  const std::lock_guard lock(mutex_);
  if (all_finished()) return;
  cancelled_ = true;
  for (const auto& handle : handles_) handle->cancel();
}

bool Job::finished() const {
  const std::lock_guard lock(mutex_);
  return all_finished();
}

void Job::on_step(int32_t index, const engine::Step& step) {
  const Clock::time_point now = Clock::now();
  {
    const std::lock_guard lock(mutex_);
    Choice& choice = choices_[static_cast<size_t>(index)];
    const bool first = choice.tokens == 0 && !choice.finish;
    if (first) {
      choice.first_step = now;
      // The choices of a prompt share its evaluation: its first choice measures it.
      if (index % choices_per_prompt_ == 0) metrics_->observe_time_to_first_token(seconds_between(submitted_, now));
    }
    if (step.token != kNoToken && step.finish != engine::FinishReason::EndOfGeneration) {
      ++choice.tokens;
      metrics_->add_generated_tokens(1);
    }
    if (step.finish) {
      choice.finish = step.finish;
      if (choice.tokens > 1)
        metrics_->observe_time_per_output_token(seconds_between(choice.first_step, now) / (choice.tokens - 1));
      ++finished_choices_;
      if (all_finished()) finished_at_ = now;
    }
    if (keep_events_) events_.push_back({index, step});
  }
  changed_.notify_all();
}

Job::Events Job::take_events(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  changed_.wait_for(lock, timeout, [this] { return !events_.empty() || all_finished(); });
  Events taken{{std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end())}, all_finished()};
  events_.clear();
  return taken;
}

bool Job::wait_finished(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, timeout, [this] { return all_finished(); });
}

std::vector<engine::Generation> Job::results() {
  std::vector<std::shared_ptr<engine::RequestHandle>> handles;
  {
    const std::lock_guard lock(mutex_);
    handles.swap(handles_);
  }
  std::vector<engine::Generation> generations;
  for (const auto& handle : handles) {
    std::vector<engine::Generation> prompt_generations = handle->wait();
    std::ranges::move(prompt_generations, std::back_inserter(generations));
  }
  return generations;
}

nlohmann::json Job::status() const {
  const std::lock_guard lock(mutex_);
  nlohmann::json choices = nlohmann::json::array();
  bool started = false;
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& choice = choices_[i];
    started = started || choice.tokens > 0 || choice.finish;
    choices.push_back({{"index", i},
                       {"completion_tokens", choice.tokens},
                       {"finish_reason", choice.finish ? nlohmann::json(finish_name(*choice.finish)) : nullptr}});
  }
  const char* state = finished_at_ ? "finished" : started ? "running" : "waiting";
  return {{"id", id_},
          {"state", state},
          {"cancelled", cancelled_},
          {"created", created_},
          {"prompt_tokens", prompt_tokens_},
          {"choices", choices}};
}

std::optional<Job::Clock::time_point> Job::finished_at() const {
  const std::lock_guard lock(mutex_);
  return finished_at_;
}

std::string JobRegistry::new_id(std::string_view prefix) {
  const std::lock_guard lock(mutex_);
  return fmt::format("{}{:016x}{:08x}", prefix, random_(), static_cast<uint32_t>(random_()));
}

void JobRegistry::add(std::shared_ptr<Job> job) {
  const Job::Clock::time_point now = Job::Clock::now();
  const std::lock_guard lock(mutex_);
  prune(now);
  jobs_[job->id()] = std::move(job);
}

std::shared_ptr<Job> JobRegistry::find(const std::string& id) {
  const std::lock_guard lock(mutex_);
  const auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<Job>> JobRegistry::unfinished() const {
  const std::lock_guard lock(mutex_);
  std::vector<std::shared_ptr<Job>> jobs;
  for (const auto& [id, job] : jobs_)
    if (!job->finished()) jobs.push_back(job);
  return jobs;
}

void JobRegistry::prune(Job::Clock::time_point now) {
  if (now - pruned_ < std::chrono::seconds(1)) return;
  pruned_ = now;
  std::erase_if(jobs_, [&](const auto& entry) {
    const std::optional<Job::Clock::time_point> finished = entry.second->finished_at();
    return finished && now - *finished > kRetention;
  });
}

}  // namespace rf::server
