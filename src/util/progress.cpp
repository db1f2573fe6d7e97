#include "util/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

namespace rf {
namespace {

constexpr int kBarWidth = 30;
constexpr int64_t kRedrawIntervalNs = 100'000'000;

std::string format_seconds(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  return s < 60 ? fmt::format("{}s", s) : fmt::format("{}m{:02}s", s / 60, s % 60);
}

}  // namespace

Progress::Progress(std::string label, uint64_t total, std::chrono::milliseconds delay)
    : label_(std::move(label)),
      total_(total),
      visible_(::isatty(STDERR_FILENO) == 1),
      next_draw_ns_(std::chrono::duration_cast<std::chrono::nanoseconds>(delay).count()) {}

Progress::~Progress() {
  if (!drawn_) return;  // a job that was over before its delay, or not on a terminal, leaves no bar
  std::lock_guard lock(draw_mutex_);
  draw(done_.load());
  std::fputc('\n', stderr);
}

void Progress::add(uint64_t amount) {
  const uint64_t done = done_.fetch_add(amount) + amount;
  if (!visible_) return;
  const int64_t now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start_).count();
  int64_t next = next_draw_ns_.load();
  // One thread wins the right to draw this interval; the others go back to work at once.
  if (now_ns < next || !next_draw_ns_.compare_exchange_strong(next, now_ns + kRedrawIntervalNs)) return;
  std::unique_lock lock(draw_mutex_, std::try_to_lock);
  if (lock.owns_lock()) draw(done);
}

void Progress::draw(uint64_t done) {
  drawn_ = true;
  const double fraction = total_ == 0 ? 1.0 : std::min(1.0, static_cast<double>(done) / static_cast<double>(total_));
  const int filled = static_cast<int>(fraction * kBarWidth);
  const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
  std::string line = fmt::format("\r{} [{}{}] {:3.0f}%  {}", label_, std::string(filled, '#'),
                                 std::string(kBarWidth - filled, '.'), fraction * 100, format_seconds(elapsed));
  if (fraction > 0 && fraction < 1) line += fmt::format("  eta {}", format_seconds(elapsed / fraction - elapsed));
  line += "\x1b[K";  // clears what a longer previous line left
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
}

}  // namespace rf
