// A progress bar on stderr for jobs that take seconds to minutes (quantize, gen-model). It is drawn only when
// stderr is a terminal, so logs, pipes and tests see nothing of it. add() may be called from any thread;
// the bar is redrawn at most ten times a second.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace rf {

class Progress {
 public:
  Progress(std::string label, uint64_t total);
  // Draws the final state and ends the line, unless nothing was ever added.
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void add(uint64_t amount);

 private:
  using Clock = std::chrono::steady_clock;
  void draw(uint64_t done);

  const std::string label_;
  const uint64_t total_;
  const bool visible_;
  const Clock::time_point start_ = Clock::now();
  std::atomic<uint64_t> done_{0};
  std::atomic<int64_t> next_draw_ns_{0};  // since start_
  std::mutex draw_mutex_;
};

}  // namespace rf
