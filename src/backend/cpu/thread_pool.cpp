#include "backend/cpu/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <string>
#include <utility>

#include "util/error.h"

namespace rf::cpu {
namespace {

// Jobs come in bursts (a decoding step runs a hundred small ones back to back), so a waiting thread spins
// this many times (about 100 microseconds) before it sleeps: a sleeping thread takes far longer to wake.
constexpr int kSpinsBeforeSleep = 1 << 12;

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Waits until `value` differs from `old`: spinning first, then sleeping on the futex.
template <typename T>
void wait_for_change(const std::atomic<T>& value, T old) {
  for (int spin = 0; spin < kSpinsBeforeSleep; ++spin) {
    if (value.load(std::memory_order_acquire) != old) return;
    cpu_relax();
  }
  value.wait(old, std::memory_order_acquire);
}

int read_topology_number(int cpu, const char* field) {
  std::ifstream in("/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/" + field);
  int value = -1;
  in >> value;
  return in ? value : -1;
}

}  // namespace

int physical_core_count() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0)
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  std::set<std::pair<int, int>> cores;  // (package, core)
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    const int package = read_topology_number(cpu, "physical_package_id");
    const int core = read_topology_number(cpu, "core_id");
    if (package < 0 || core < 0) return std::max(1, CPU_COUNT(&allowed));  // no topology: count CPUs
    cores.emplace(package, core);
  }
  return std::max(1, static_cast<int>(cores.size()));
}

ThreadPool::ThreadPool(int threads) {
  const int total = threads > 0 ? threads : physical_core_count();
  try {
    workers_.reserve(static_cast<size_t>(total - 1));
    for (int thread = 1; thread < total; ++thread) workers_.emplace_back([this, thread] { worker_loop(thread); });
  } catch (const std::exception& e) {
    // The system's limits on threads or memory: the workers already started must be joined, or destroying them
    // would terminate the process.
    stop_workers();
    fail("cannot start {} threads: {} (the system allowed {})", total, e.what(), size());
  }
}

ThreadPool::~ThreadPool() { stop_workers(); }

void ThreadPool::stop_workers() {
  stopping_.store(true);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void ThreadPool::run(int64_t n, int64_t grain, Trampoline trampoline, void* fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  if (workers_.empty() || n <= grain) {
    trampoline(fn, 0, n, 0);
    return;
  }
  std::lock_guard lock(run_mutex_);
  trampoline_ = trampoline;
  fn_ = fn;
  n_ = n;
  // A few chunks per thread balance the load when a core is shared; fewer would leave it idle at the end.
  chunk_ = std::max(grain, (n + 4 * size() - 1) / (4 * size()));
  next_.store(0, std::memory_order_relaxed);
  error_ = nullptr;
  busy_workers_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();

  work_on_chunks(0);
  for (int busy = busy_workers_.load(std::memory_order_acquire); busy != 0;
       busy = busy_workers_.load(std::memory_order_acquire))
    wait_for_change(busy_workers_, busy);
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void ThreadPool::work_on_chunks(int thread) {
  for (int64_t begin = next_.fetch_add(chunk_, std::memory_order_relaxed); begin < n_;
       begin = next_.fetch_add(chunk_, std::memory_order_relaxed)) {
    try {
      trampoline_(fn_, begin, std::min(n_, begin + chunk_), thread);
    } catch (...) {
      std::lock_guard lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }
}

void ThreadPool::worker_loop(int thread) {
  uint32_t seen = 0;
  while (true) {
    wait_for_change(generation_, seen);
    seen = generation_.load(std::memory_order_acquire);
    if (stopping_.load()) return;
    work_on_chunks(thread);
    if (busy_workers_.fetch_sub(1, std::memory_order_acq_rel) == 1) busy_workers_.notify_one();
  }
}

}  // namespace rf::cpu
