// rocmforge bench -m MODEL [-p 512] [-n 128] [-r 3] [--json] [--device cpu|gpu|auto]: prompt processing (ppN:
// N random tokens in one batch) and text generation (tgN: N tokens one at a time) speeds as llama-bench
// measures them, plus how long the model takes to load and the memory bandwidth decoding achieves on the
// weights.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/file_type.h"
#include "cli/options.h"
#include "engine/engine.h"
#if ROCMFORGE_HAVE_GPU
#include "backend/gpu/runtime.h"
#endif

namespace rf::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchOptions {
  std::string model;
  int64_t prompt_tokens = 512;
  int64_t generated_tokens = 128;
  int repetitions = 3;
  bool json = false;
  // On the CPU unless told otherwise, so that a table says which backend it measures by what was asked.
  engine::EngineOptions engine{.device = engine::Device::Cpu};
};

struct TestResult {
  std::string name;           // "pp512", "tg128"
  double tokens_per_s = 0.0;  // mean over repetitions
  double std = 0.0;           // sample standard deviation over repetitions
  double gbps = 0.0;          // weight bytes read per second while decoding (tg only)
  bool generation = false;
};

// Milliseconds from process start until the model was open, ready and had computed its first token, and
// how fast its weights came from the file (GPU: to the device; 0 where they are mapped on first use).
struct LoadTimes {
  double open_ms = 0.0;
  double ready_ms = 0.0;
  double first_token_ms = 0.0;
  double gb_per_s = 0.0;
};

// Process start as this file's static initialization sees it: after the dynamic loader, a few milliseconds
// after exec.
const std::chrono::steady_clock::time_point process_start = std::chrono::steady_clock::now();

double milliseconds_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Bytes of weights one decoded token reads: every layer's matrices and norms, the final norm, the output
// matrix, and a single row of the embedding table (the whole table when it doubles as the output matrix).
uint64_t weight_bytes_per_token(const model::ExecutionPlan& plan) {
  uint64_t bytes = plan.output_norm().bytes() + plan.output().bytes();
  if (!plan.config().tied_embeddings) bytes += plan.token_embd().row_bytes();
  for (const model::LayerPlan& layer : plan.layers())
    for (const model::LazyTensor* tensor : layer.tensors()) bytes += tensor->bytes();
  return bytes;
}

// Random tokens as llama-bench draws them: BOS first when the model adds one.
class TokenSource {
 public:
  explicit TokenSource(const Tokenizer& tokenizer) : tokenizer_(tokenizer), pick_(0, tokenizer.n_vocab() - 1) {}
  int32_t first() { return tokenizer_.add_bos() ? tokenizer_.bos() : next(); }
  int32_t next() { return pick_(rng_); }

 private:
  const Tokenizer& tokenizer_;
  std::mt19937 rng_{1};
  std::uniform_int_distribution<int32_t> pick_;
};

// Seconds to evaluate n random tokens as one batch from an empty cache.
double time_prompt(engine::Engine& engine, TokenSource& source, int64_t n) {
  std::vector<int32_t> tokens{source.first()};
  while (static_cast<int64_t>(tokens.size()) < n) tokens.push_back(source.next());
  engine.reset();
  const Clock::time_point start = Clock::now();
  engine.evaluate(tokens);
  return milliseconds_since(start) / 1e3;
}

// Seconds to decode n random tokens one at a time from an empty cache.
double time_generation(engine::Engine& engine, TokenSource& source, int64_t n) {
  engine.reset();
  int32_t token = source.first();
  const Clock::time_point start = Clock::now();
  for (int64_t i = 0; i < n; ++i) {
    engine.append(token);
    token = source.next();
  }
  return milliseconds_since(start) / 1e3;
}

// One warm-up run, then `repetitions` timed runs; speeds are tokens per second of each run.
template <typename TimeRun>
TestResult run_test(std::string name, int64_t tokens, int repetitions, TimeRun time_run) {
  time_run();
  std::vector<double> speeds;
  for (int r = 0; r < repetitions; ++r) speeds.push_back(static_cast<double>(tokens) / time_run());
  TestResult result{std::move(name)};
  for (const double speed : speeds) result.tokens_per_s += speed / repetitions;
  if (repetitions > 1) {
    double squares = 0.0;
    for (const double speed : speeds) squares += (speed - result.tokens_per_s) * (speed - result.tokens_per_s);
    result.std = std::sqrt(squares / (repetitions - 1));
  }
  return result;
}

std::string size_text(uint64_t bytes) {
  return bytes >= (1ull << 30) ? fmt::format("{:.2f} GiB", bytes / double(1ull << 30))
                               : fmt::format("{:.2f} MiB", bytes / double(1ull << 20));
}

std::string count_text(uint64_t count) {
  if (count >= 1'000'000'000) return fmt::format("{:.2f} B", count / 1e9);
  if (count >= 1'000'000) return fmt::format("{:.2f} M", count / 1e6);
  return fmt::format("{:.2f} K", count / 1e3);
}

// "llama Q4_K_M": the architecture and the file type without llama.cpp's MOSTLY_ prefix.
std::string model_description(const gguf::File& file) {
  std::string type = "unknown type";
  if (const gguf::Value* value = file.find("general.file_type"); value && value->is_integer()) {
    const std::string_view name = file_type_name(static_cast<uint32_t>(value->to_int()));
    if (!name.empty()) type = std::string(name.starts_with("MOSTLY_") ? name.substr(7) : name);
  }
  return fmt::format("{} {}", file.architecture(), type);
}

void print_table(const std::string& model, uint64_t size, uint64_t params, const std::string& backend, int threads,
                 const std::vector<TestResult>& results, const LoadTimes& load, uint64_t bytes_per_token,
                 double copy_gbps) {
  // The backend column is as wide as its name ("CPU", "NVIDIA H200", ...).
  const size_t backend_width = std::max<size_t>(7, backend.size());
  fmt::print("| {:<24} | {:>10} | {:>10} | {:<{}} | {:>7} | {:>6} | {:>16} | {:>6} |\n", "model", "size", "params",
             "backend", backend_width, "threads", "test", "t/s", "GB/s");
  fmt::print("| {:-<24} | {:->9}: | {:->9}: | {:-<{}} | {:->6}: | {:->5}: | {:->15}: | {:->5}: |\n", "", "", "", "",
             backend_width, "", "", "", "");
  for (const TestResult& r : results)
    fmt::print("| {:<24} | {:>10} | {:>10} | {:<{}} | {:>7} | {:>6} | {:>16} | {:>6} |\n", model, size_text(size),
               count_text(params), backend, backend_width, threads, r.name,
               fmt::format("{:.2f} ± {:.2f}", r.tokens_per_s, r.std), r.generation ? fmt::format("{:.2f}", r.gbps) : "");
  fmt::print("\nfrom process start: open {:.1f} ms, ready {:.1f} ms, first token {:.1f} ms\n", load.open_ms,
             load.ready_ms, load.first_token_ms);
  if (load.gb_per_s > 0) fmt::print("weights loaded at {:.1f} GB/s (file to device)\n", load.gb_per_s);
  fmt::print("decode reads {} of weights per token\n", size_text(bytes_per_token));
  if (copy_gbps > 0) {
    fmt::print("device-to-device copy bandwidth {:.0f} GB/s (the bound for decoding)\n", copy_gbps);
    for (const TestResult& r : results)
      if (r.generation) fmt::print("{} reads weights at {:.1f}% of it\n", r.name, 100 * r.gbps / copy_gbps);
  }
}

void print_json(const std::string& model, uint64_t size, uint64_t params, const std::string& backend, int threads,
                const std::vector<TestResult>& results, const LoadTimes& load, double copy_gbps) {
  nlohmann::json tests = nlohmann::json::array();
  for (const TestResult& r : results) {
    nlohmann::json test = {{"test", r.name}, {"tokens_per_s", r.tokens_per_s}, {"std", r.std}};
    if (r.generation) test["gbps"] = r.gbps;
    if (r.generation && copy_gbps > 0) test["fraction_of_copy_bandwidth"] = r.gbps / copy_gbps;
    tests.push_back(test);
  }
  nlohmann::json out = {
      {"model", model},
      {"size_bytes", size},
      {"params", params},
      {"backend", backend},
      {"threads", threads},
      {"tests", tests},
      {"load",
       {{"open_ms", load.open_ms},
        {"ready_ms", load.ready_ms},
        {"first_token_ms", load.first_token_ms},
        {"gb_per_s", load.gb_per_s}}},
  };
  if (copy_gbps > 0) out["copy_gbps"] = copy_gbps;
  fmt::print("{}\n", out.dump(2));
}

// Both tests start from an empty cache, so the context only needs the longer of them.
int64_t bench_context(const BenchOptions& options) {
  return std::max<int64_t>({options.prompt_tokens, options.generated_tokens, 1});
}

// `start`: when the engine's construction began, for the load times.
void run_benchmarks(engine::Engine& engine, const BenchOptions& options, Clock::time_point start) {
  const std::string& backend = engine.device_name();
  const int threads = engine.threads();
  const double start_ms = std::chrono::duration<double, std::milli>(start - process_start).count();
  LoadTimes load{start_ms + engine.open_ms(), start_ms + engine.ready_ms()};
  TokenSource source(engine.tokenizer());
  engine.append(source.first());
  load.first_token_ms = milliseconds_since(process_start);
  load.gb_per_s = engine.plan().loading_stats().gb_per_second();

  std::vector<TestResult> results;
  if (options.prompt_tokens > 0)
    results.push_back(run_test(fmt::format("pp{}", options.prompt_tokens), options.prompt_tokens, options.repetitions,
                               [&] { return time_prompt(engine, source, options.prompt_tokens); }));
  const uint64_t bytes_per_token = weight_bytes_per_token(engine.plan());
  if (options.generated_tokens > 0) {
    TestResult tg = run_test(fmt::format("tg{}", options.generated_tokens), options.generated_tokens,
                             options.repetitions, [&] { return time_generation(engine, source, options.generated_tokens); });
    tg.generation = true;
    tg.gbps = static_cast<double>(bytes_per_token) * tg.tokens_per_s / 1e9;
    results.push_back(tg);
  }

  // On a GPU, the bound decoding approaches: streaming the weights once per token at the device's copy bandwidth.
  double copy_gbps = 0.0;
#if ROCMFORGE_HAVE_GPU
  if (engine.device() == engine::Device::Gpu) copy_gbps = gpu::measure_copy_bandwidth();
#endif

  const gguf::File& file = engine.file();
  const std::string model = model_description(file);
  if (options.json)
    print_json(model, file.tensor_bytes(), file.parameter_count(), backend, threads, results, load, copy_gbps);
  else
    print_table(model, file.tensor_bytes(), file.parameter_count(), backend, threads, results, load, bytes_per_token,
                copy_gbps);
}

void bench(const BenchOptions& options) {
  engine::EngineOptions engine_options = options.engine;
  engine_options.context = bench_context(options);
  const std::shared_ptr<const gguf::File> file = gguf::File::open(options.model);
  check_context(*file, engine_options.context,
                fmt::format("the longer of -p {} and -n {}", options.prompt_tokens, options.generated_tokens));
  // The engine's open time leaves out the parsing of a file passed in open; counted from process start, the load
  // times include it all the same.
  const Clock::time_point start = Clock::now();
  engine::Engine engine(file, engine_options);
  run_benchmarks(engine, options, start);
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto options = std::make_shared<BenchOptions>();
  CLI::App* command = app.add_subcommand("bench", "Measure prompt and generation speed (like llama-bench)");
  command->add_option("-m,--model", options->model, "GGUF model file")->required();
  // -p and -n are checked against the model's context when it is open.
  command->add_option("-p,--n-prompt", options->prompt_tokens, "Prompt tokens per ppN run (0: skip)")
      ->transform(integer_in<int64_t>(0))
      ->capture_default_str();
  command->add_option("-n,--n-gen", options->generated_tokens, "Generated tokens per tgN run (0: skip)")
      ->transform(integer_in<int64_t>(0))
      ->capture_default_str();
  command->add_option("-r,--repetitions", options->repetitions, "Timed runs per test")
      ->transform(integer_in(1))
      ->capture_default_str();
  add_threads_option(*command, options->engine.threads, "one per physical core");
  command->add_flag("--json", options->json, "Print one JSON object instead of the table");
  add_device_options(*command, options->engine);
  command->callback([options] { bench(*options); });
}

}  // namespace rf::cli
