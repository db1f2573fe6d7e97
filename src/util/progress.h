// A progress bar on stderr for jobs that take seconds to minutes (quantize, gen-model, loading a model onto
// the GPU). It is drawn only when stderr is a terminal, so logs, pipes and tests see nothing of it, and not
// before `delay` has passed, so a job that is over in a moment leaves no bar. add() may be called from any
// thread; the bar is redrawn at most ten times a second.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace rf {

class Progress {
 public:
  Progress(std::string label, uint64_t total, std::chrono::milliseconds delay = {});
  // Draws the final state and ends the line, if the bar was ever drawn.
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
  std::atomic<int64_t> next_draw_ns_;  // since start_
  std::atomic<bool> drawn_{false};
  std::mutex draw_mutex_;
};

}  // namespace rf
