// The server's measurements in the Prometheus text format. Counters and histograms are updated as requests come
// and go, from any thread (the step callbacks run on the scheduler's); gauges are read when /metrics is scraped:
// the scheduler's sequences and KV blocks, and the weights the engine has loaded.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/scheduler.h"

namespace rf::server {

// A Prometheus histogram: observations counted per bucket of upper bounds, with their sum.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  // The _bucket (cumulative, up to +Inf), _sum and _count lines of metric `name`.
  void write(std::string& out, std::string_view name) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, the last for values above every bound
  double sum_ = 0.0;
};

// What the engine has loaded when /metrics is scraped.
struct LoadState {
  uint64_t weight_bytes_loaded = 0;
  uint64_t weight_bytes = 0;  // the file's tensor bytes
};

class Metrics {
 public:
  Metrics();

  // A response sent: `route` is the route's pattern (so that ids and unknown paths do not each make a series).
  void count_request(std::string_view route, int status);
  void add_prompt_tokens(int64_t tokens);
  void add_generated_tokens(int64_t tokens);
  void observe_time_to_first_token(double seconds);
  void observe_time_per_output_token(double seconds);

  // Every metric in the Prometheus text format (version 0.0.4).
  std::string text(const engine::Scheduler::Stats& scheduler, const LoadState& load) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  uint64_t prompt_tokens_ = 0;
  uint64_t generated_tokens_ = 0;
  Histogram time_to_first_token_;
  Histogram time_per_output_token_;
};

}  // namespace rf::server
