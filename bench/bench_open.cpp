// Opening a full-size model: a Llama 3 8B file with its 128256-token vocabulary, written sparse (header,
// key/values and tensor infos, then a hole of 4.6 GiB where the tensor data would be), so this runs anywhere.
// Measures rf::gguf::File::open in process, and `rocmforge inspect` as a child: its wall time and peak RSS.
// Targets: open under 50 ms; the whole inspect process under 64 MiB of RSS.
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "gguf/gguf.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;

std::string g_model_path;

struct ChildResult {
  int status;
  double seconds;
  double max_rss_mib;
};

// Runs `argv` with stdout sent to /dev/null; its own peak RSS comes from wait4.
ChildResult run_child(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  const auto start = std::chrono::steady_clock::now();
  pid_t pid = 0;
  const int spawn_error = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawn_error != 0) return {-1, 0, 0};
  int status = 0;
  rusage usage{};
  wait4(pid, &status, 0, &usage);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, seconds, usage.ru_maxrss / 1024.0};  // ru_maxrss is KiB
}

// rocmforge is built next to this benchmark, in the build's bin/.
std::string cli_path() { return (fs::read_symlink("/proc/self/exe").parent_path() / "rocmforge").string(); }

void BM_OpenLlama3_8B(benchmark::State& state) {
  for (auto _ : state) {
    auto file = rf::gguf::File::open(g_model_path);
    benchmark::DoNotOptimize(file->tensors().size());
  }
  state.SetLabel("target: under 50 ms");
}
BENCHMARK(BM_OpenLlama3_8B)->Unit(benchmark::kMillisecond)->UseRealTime();

void inspect_process(benchmark::State& state, const std::vector<std::string>& extra_args) {
  std::vector<std::string> args = {cli_path(), "inspect", g_model_path};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  double max_rss_mib = 0;
  for (auto _ : state) {
    const ChildResult result = run_child(args);
    if (result.status != 0) {
      state.SkipWithError("rocmforge inspect failed");
      return;
    }
    state.SetIterationTime(result.seconds);
    max_rss_mib = std::max(max_rss_mib, result.max_rss_mib);
  }
  state.counters["max_rss_MiB"] = max_rss_mib;
}

void BM_InspectProcess(benchmark::State& state) {
  inspect_process(state, {});
  state.SetLabel("target: max RSS under 64 MiB");
}
BENCHMARK(BM_InspectProcess)->Unit(benchmark::kMillisecond)->UseManualTime()->Iterations(5);

void BM_InspectJsonProcess(benchmark::State& state) { inspect_process(state, {"--json"}); }
BENCHMARK(BM_InspectJsonProcess)->Unit(benchmark::kMillisecond)->UseManualTime()->Iterations(3);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  g_model_path = (fs::temp_directory_path() / ("rocmforge_bench_open_" + std::to_string(getpid()) + ".gguf")).string();
  const ChildResult created = run_child({cli_path(), "gen-model", "--shape", "llama3-8b", "--type", "Q4_K_M", "--vocab",
                                         ROCMFORGE_SHARED_DIR "/vocab/ggml-vocab-llama-bpe.gguf", "--sparse",
                                         g_model_path});
  if (created.status != 0) {
    std::fprintf(stderr, "error: could not create %s with %s gen-model\n", g_model_path.c_str(), cli_path().c_str());
    return 1;
  }
  std::printf("model: %s, %.2f GiB sparse (llama3-8b Q4_K_M, 128256-token vocabulary)\n", g_model_path.c_str(),
              static_cast<double>(fs::file_size(g_model_path)) / (1 << 30));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  fs::remove(g_model_path);
  return 0;
}
