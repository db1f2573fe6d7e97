#include "server/metrics.h"

#include <algorithm>

#include <fmt/format.h>

namespace rf::server {
namespace {

void header(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

template <typename T>
void single(std::string& out, std::string_view name, std::string_view type, std::string_view help, T value) {
  header(out, name, type, help);
  out += fmt::format("{} {}\n", name, value);
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const auto bucket = std::ranges::lower_bound(bounds_, value) - bounds_.begin();
  ++counts_[static_cast<size_t>(bucket)];
  sum_ += value;
}

void Histogram::write(std::string& out, std::string_view name) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cumulative);
  }
  cumulative += counts_.back();
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, cumulative, name, sum_, name,
                     cumulative);
}

Metrics::Metrics()
    : time_to_first_token_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      time_per_output_token_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5}) {}

void Metrics::count_request(std::string_view route, int status) {
  const std::lock_guard lock(mutex_);
  ++requests_[{std::string(route), status}];
}

void Metrics::add_prompt_tokens(int64_t tokens) {
  const std::lock_guard lock(mutex_);
  prompt_tokens_ += static_cast<uint64_t>(tokens);
}

void Metrics::add_generated_tokens(int64_t tokens) {
  const std::lock_guard lock(mutex_);
  generated_tokens_ += static_cast<uint64_t>(tokens);
}

void Metrics::observe_time_to_first_token(double seconds) {
  const std::lock_guard lock(mutex_);
  time_to_first_token_.observe(seconds);
}

void Metrics::observe_time_per_output_token(double seconds) {
  const std::lock_guard lock(mutex_);
  time_per_output_token_.observe(seconds);
}

std::string Metrics::text(const engine::Scheduler::Stats& scheduler, const LoadState& load) const {
  std::string out;
  const std::lock_guard lock(mutex_);
  header(out, "rocmforge_http_requests_total", "counter", "HTTP requests answered, by route and status.");
  for (const auto& [key, count] : requests_)
    out +=
        fmt::format("rocmforge_http_requests_total{{route=\"{}\",status=\"{}\"}} {}\n", key.first, key.second, count);
  single(out, "rocmforge_prompt_tokens_total", "counter", "Prompt tokens of the generation requests accepted.",
         prompt_tokens_);
  single(out, "rocmforge_generation_tokens_total", "counter", "Tokens generated.", generated_tokens_);
  header(out, "rocmforge_time_to_first_token_seconds", "histogram",
         "Seconds from a request's submission to its first generated token.");
  time_to_first_token_.write(out, "rocmforge_time_to_first_token_seconds");
  header(out, "rocmforge_time_per_output_token_seconds", "histogram",
         "Seconds per generated token after the first, per choice that generated two or more.");
  time_per_output_token_.write(out, "rocmforge_time_per_output_token_seconds");
  single(out, "rocmforge_sequences_running", "gauge", "Sequences the scheduler runs.", scheduler.running);
  single(out, "rocmforge_sequences_waiting", "gauge", "Sequences waiting to run (queued or preempted).",
         scheduler.waiting);
  single(out, "rocmforge_kv_blocks_used", "gauge", "KV cache blocks held by sequences.", scheduler.pool.used);
  single(out, "rocmforge_kv_blocks_total", "gauge", "KV cache blocks in the pool.", scheduler.pool.blocks);
  single(out, "rocmforge_kv_blocks_cached", "gauge", "Free KV cache blocks still holding a cached prefix.",
         scheduler.pool.evictable);
  single(out, "rocmforge_prefix_cache_hits_total", "counter", "Cached KV blocks that starting sequences took.",
         scheduler.pool.reused_blocks);
  single(out, "rocmforge_prefix_cache_hit_tokens_total", "counter", "Prompt positions taken from cached KV blocks.",
         scheduler.pool.reused_positions);
  single(out, "rocmforge_preemptions_total", "counter", "Sequences preempted for lack of KV blocks.",
         scheduler.preemptions);
  single(out, "rocmforge_weight_bytes_loaded", "gauge", "Weight bytes the engine has loaded.",
         load.weight_bytes_loaded);
  single(out, "rocmforge_weight_bytes", "gauge", "Weight bytes of the model file.", load.weight_bytes);
  const double progress =
      load.weight_bytes > 0 ? std::min(1.0, static_cast<double>(load.weight_bytes_loaded) / load.weight_bytes) : 1.0;
  single(out, "rocmforge_load_progress", "gauge", "Fraction of the weights loaded, from 0 to 1.", progress);
  return out;
}

}  // namespace rf::server
