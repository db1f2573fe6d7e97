#include "backend/cpu/thread_pool.h"

#include <sys/resource.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <vector>

#include "util/error.h"

namespace rf {
namespace {

TEST(ThreadPoolTest, DefaultsToPhysicalCores) {
  EXPECT_GE(cpu::physical_core_count(), 1);
  EXPECT_EQ(cpu::ThreadPool().size(), cpu::physical_core_count());
}

TEST(ThreadPoolTest, EveryIndexRunsExactlyOnce) {
  cpu::ThreadPool pool(4);
  for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{12345}}) {
    for (const int64_t grain : {int64_t{1}, int64_t{16}, int64_t{5000}}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::atomic<int> bad_thread{0};
      pool.parallel_for(n, grain, [&](int64_t begin, int64_t end, int thread) {
        if (thread < 0 || thread >= pool.size()) bad_thread.fetch_add(1);
        for (int64_t i = begin; i < end; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
      });
      for (const auto& h : hits) ASSERT_EQ(h.load(), 1) << "n " << n << " grain " << grain;
      EXPECT_EQ(bad_thread.load(), 0);
    }
  }
}

TEST(ThreadPoolTest, ManySmallJobsInARow) {
  cpu::ThreadPool pool(3);
  int64_t total = 0;
  for (int round = 0; round < 2000; ++round) {
    std::atomic<int64_t> sum{0};
    pool.parallel_for(64, 1, [&](int64_t begin, int64_t end, int) {
      for (int64_t i = begin; i < end; ++i) sum.fetch_add(i);
    });
    total += sum.load();
  }
  EXPECT_EQ(total, 2000 * (63 * 64 / 2));
}

TEST(ThreadPoolTest, ExceptionReachesTheCaller) {
  cpu::ThreadPool pool(2);
  EXPECT_THROW(pool.parallel_for(100, 1,
                                 [](int64_t begin, int64_t, int) {
                                   if (begin == 0) throw std::runtime_error("chunk failed");
                                 }),
               std::runtime_error);
  std::atomic<int64_t> count{0};
  pool.parallel_for(100, 1, [&](int64_t begin, int64_t end, int) { count.fetch_add(end - begin); });
  EXPECT_EQ(count.load(), 100);
}

// Threads the system cannot start are an rf::Error naming the count, not std::terminate (which a std::thread
// still running in the vector being destroyed would call). A child process caps its address space a little above
// what it maps, so that the threads' stacks run out after a few.
TEST(ThreadPoolDeathTest, ThreadsTheSystemCannotStartAreAnError) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers' own allocations fail first in a capped address space";
#endif
  const auto start_too_many = [] {
    long mapped_pages = 0;
    std::ifstream("/proc/self/statm") >> mapped_pages;
    const rlim_t cap = static_cast<rlim_t>(mapped_pages * sysconf(_SC_PAGESIZE)) + (64 << 20);
    const rlimit limit{cap, cap};
    if (setrlimit(RLIMIT_AS, &limit) != 0) std::_Exit(2);
    try {
      cpu::ThreadPool pool(1000);
    } catch (const Error& e) {
      std::fprintf(stderr, "%s\n", e.what());
      std::_Exit(0);
    }
    std::_Exit(1);
  };
  EXPECT_EXIT(start_too_many(), ::testing::ExitedWithCode(0), "cannot start 1000 threads: .* \\(the system allowed");
}

}  // namespace
}  // namespace rf
