// A fixed set of worker threads for data-parallel kernels. Threads are created once; a parallel_for wakes
// them, shares out chunks of an index range through an atomic counter (so a core busy with something else
// takes fewer chunks) and returns when every chunk is done. The calling thread works as thread 0.
#pragma once
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace rf::cpu {

// Physical cores this process may run on (hyper-threads share a core's vector units, so matrix products
// gain nothing from them); at least 1.
int physical_core_count();

class ThreadPool {
 public:
  // `threads` in all, the caller included; 0 means physical_core_count(). Threads the system cannot start
  // are an rf::Error.
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end, thread) for chunks of [0, n) of at least `grain` items; thread is in [0, size()).
  // One parallel_for runs at a time. The first exception a chunk throws is rethrown here once all stop.
  template <typename Fn>
  void parallel_for(int64_t n, int64_t grain, Fn&& fn) {
    using F = std::remove_reference_t<Fn>;
    run(
        n, grain, [](void* f, int64_t begin, int64_t end, int thread) { (*static_cast<F*>(f))(begin, end, thread); },
        &fn);
  }

 private:
  using Trampoline = void (*)(void* fn, int64_t begin, int64_t end, int thread);

  void run(int64_t n, int64_t grain, Trampoline trampoline, void* fn);
  void work_on_chunks(int thread);
  void worker_loop(int thread);
  // Wakes every worker to return and joins it.
  void stop_workers();

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;  // one parallel_for at a time

  // The job being run; written before generation_ is bumped, read by workers after they see the bump.
  Trampoline trampoline_ = nullptr;
  void* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 1;
  std::atomic<int64_t> next_{0};
  std::exception_ptr error_;
  std::mutex error_mutex_;

  std::atomic<uint32_t> generation_{0};  // bumped once per job; workers wait on it (a futex word)
  std::atomic<int> busy_workers_{0};     // the caller waits on it to drop to 0
  std::atomic<bool> stopping_{false};
};

}  // namespace rf::cpu
