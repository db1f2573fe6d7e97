// rocmforge bench -m MODEL [-p 512] [-n 128] [-r 3] [--json] [--device cpu|gpu|auto]: prompt processing (ppN:
// N random tokens in one batch) and text generation (tgN: N tokens one at a time) speeds as llama-bench
// measures them, plus how long the model takes to load and the memory bandwidth decoding achieves on the
// weights.
// rocmforge bench -m MODEL --parallel 1,8,32,64 [-p 128] [-n 128] [-r 3] [--ctx N] [--json]: llama-batched-bench's
// measurement on the scheduler: for each B, B sequences of p random prompt tokens evaluated as one batch, then
// n tokens each decoded together; the prompt (S_PP), generation (S_TG) and overall (S) tokens/s of all B.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
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
#include "engine/scheduler.h"
#if ROCMFORGE_HAVE_GPU
#include "backend/gpu/runtime.h"
#endif

namespace rf::cli {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kMaxParallel = 1024;          // sequences a --parallel row runs at most
constexpr int64_t kParallelPromptTokens = 128;  // -p with --parallel unless given, as llama-batched-bench's -npp

struct BenchOptions {
  std::string model;
  int64_t prompt_tokens = 512;
  int64_t generated_tokens = 128;
  int repetitions = 3;
  bool json = false;
  std::vector<int64_t> parallel;  // the batched test's sequence counts; empty: llama-bench's tests
  // On the CPU unless told otherwise, so that a table says which backend it measures by what was asked. With
  // --parallel, `context` is --ctx: the positions of the paged KV cache (0: enough for every sequence at once).
  engine::EngineOptions engine{.device = engine::Device::Cpu};
};

// The mean of repeated measurements and their sample standard deviation (0 for one).
struct Spread {
  double mean = 0.0;
  double std = 0.0;
};

Spread spread_of(const std::vector<double>& values) {
  const auto n = static_cast<double>(values.size());
  Spread spread;
  for (const double value : values) spread.mean += value / n;
  if (values.size() > 1) {
    double squares = 0.0;
    for (const double value : values) squares += (value - spread.mean) * (value - spread.mean);
    spread.std = std::sqrt(squares / (n - 1));
  }
  return spread;
}

std::string spread_text(const Spread& spread) { return fmt::format("{:.2f} ± {:.2f}", spread.mean, spread.std); }

struct TestResult {
  std::string name;   // "pp512", "tg128"
  Spread speed;       // tokens per second over repetitions
  double gbps = 0.0;  // weight bytes read per second while decoding (tg only)
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

double seconds_between(Clock::time_point start, Clock::time_point end) {
  return std::chrono::duration<double>(end - start).count();
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
  // n >= 1 tokens: first(), then next() ones.
  std::vector<int32_t> tokens(int64_t n) {
    std::vector<int32_t> tokens{first()};
    while (static_cast<int64_t>(tokens.size()) < n) tokens.push_back(next());
    return tokens;
  }

 private:
  const Tokenizer& tokenizer_;
  std::mt19937 rng_{1};
  std::uniform_int_distribution<int32_t> pick_;
};

// Seconds to evaluate n random tokens as one batch from an empty cache.
double time_prompt(engine::Engine& engine, TokenSource& source, int64_t n) {
  const std::vector<int32_t> tokens = source.tokens(n);
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
  return {std::move(name), spread_of(speeds)};
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

void print_table(const engine::Engine& engine, const std::vector<TestResult>& results, const LoadTimes& load,
                 uint64_t bytes_per_token, double copy_gbps) {
  const gguf::File& file = engine.file();
  const std::string& backend = engine.device_name();
  // The backend column is as wide as its name ("CPU", "NVIDIA H200", ...).
  const size_t backend_width = std::max<size_t>(7, backend.size());
  fmt::print("| {:<24} | {:>10} | {:>10} | {:<{}} | {:>7} | {:>6} | {:>16} | {:>6} |\n", "model", "size", "params",
             "backend", backend_width, "threads", "test", "t/s", "GB/s");
  fmt::print("| {:-<24} | {:->9}: | {:->9}: | {:-<{}} | {:->6}: | {:->5}: | {:->15}: | {:->5}: |\n", "", "", "", "",
             backend_width, "", "", "", "");
  for (const TestResult& r : results)
    fmt::print("| {:<24} | {:>10} | {:>10} | {:<{}} | {:>7} | {:>6} | {:>16} | {:>6} |\n", model_description(file),
               size_text(file.tensor_bytes()), count_text(file.parameter_count()), backend, backend_width,
               engine.threads(), r.name, spread_text(r.speed), r.generation ? fmt::format("{:.2f}", r.gbps) : "");
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

// The fields every JSON object of bench starts with: the model, its size and parameters, the backend, its threads.
nlohmann::json engine_json(const engine::Engine& engine) {
  const gguf::File& file = engine.file();
  return {{"model", model_description(file)},
          {"size_bytes", file.tensor_bytes()},
          {"params", file.parameter_count()},
          {"backend", engine.device_name()},
          {"threads", engine.threads()}};
}

void print_json(const engine::Engine& engine, const std::vector<TestResult>& results, const LoadTimes& load,
                double copy_gbps) {
  nlohmann::json tests = nlohmann::json::array();
  for (const TestResult& r : results) {
    nlohmann::json test = {{"test", r.name}, {"tokens_per_s", r.speed.mean}, {"std", r.speed.std}};
    if (r.generation) test["gbps"] = r.gbps;
    if (r.generation && copy_gbps > 0) test["fraction_of_copy_bandwidth"] = r.gbps / copy_gbps;
    tests.push_back(test);
  }
  nlohmann::json out = engine_json(engine);
  out["tests"] = tests;
  out["load"] = {{"open_ms", load.open_ms},
                 {"ready_ms", load.ready_ms},
                 {"first_token_ms", load.first_token_ms},
                 {"gb_per_s", load.gb_per_s}};
  if (copy_gbps > 0) out["copy_gbps"] = copy_gbps;
  fmt::print("{}\n", out.dump(2));
}

// Both tests start from an empty cache, so the context only needs the longer of them.
int64_t bench_context(const BenchOptions& options) {
  return std::max<int64_t>({options.prompt_tokens, options.generated_tokens, 1});
}

// `start`: when the engine's construction began, for the load times.
void run_benchmarks(engine::Engine& engine, const BenchOptions& options, Clock::time_point start) {
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
    tg.gbps = static_cast<double>(bytes_per_token) * tg.speed.mean / 1e9;
    results.push_back(tg);
  }

  // On a GPU, the bound decoding approaches: streaming the weights once per token at the device's copy bandwidth.
  double copy_gbps = 0.0;
#if ROCMFORGE_HAVE_GPU
  if (engine.device() == engine::Device::Gpu) copy_gbps = gpu::measure_copy_bandwidth();
#endif

  if (options.json)
    print_json(engine, results, load, copy_gbps);
  else
    print_table(engine, results, load, bytes_per_token, copy_gbps);
}

// Seconds of one batched run: from submitting its prompts until every sequence had its first token (t_pp), and from
// then until every sequence had finished (t_tg).
struct BatchTimes {
  double prompt_seconds = 0.0;
  double generation_seconds = 0.0;
  // The decoding steps: how many, and their seconds in the forward pass and in sampling (the scheduler's stats).
  int64_t steps = 0;
  double forward_seconds = 0.0;
  double sampling_seconds = 0.0;
};

// A scheduler for batched runs of up to `sequences` sequences of `prompt_tokens` prompt tokens, with a token budget
// that takes all their prompts in one step, and the times its step callbacks record.
class BatchRunner {
 public:
  BatchRunner(engine::Engine& engine, int64_t sequences, int64_t prompt_tokens)
      : prompt_tokens_(prompt_tokens),
        scheduler_(engine, {.max_sequences = sequences, .token_budget = sequences * prompt_tokens}) {}

  // Runs `sequences` sequences, each with its own random prompt (a prefix they shared would be computed once),
  // greedy, each evaluating `generated_tokens` tokens as llama-batched-bench counts them: it chooses one more, as the
  // first comes from its prompt's logits and the last is never evaluated.
  BatchTimes run(TokenSource& source, int64_t sequences, int64_t generated_tokens) {
    started_.assign(static_cast<size_t>(sequences), false);
    std::vector<engine::Request> requests(static_cast<size_t>(sequences));
    for (size_t i = 0; i < requests.size(); ++i) {
      engine::Request& request = requests[i];
      request.prompt = source.tokens(prompt_tokens_);
      request.params.max_tokens = generated_tokens + 1;
      request.params.ignore_eos = true;
      request.params.sampling.temperature = 0.0f;
      request.on_step = [this, i](int32_t, const engine::Step& step) {
        const Clock::time_point now = Clock::now();
        if (!started_[i]) {
          started_[i] = true;
          all_started_ = now;
          decoding_from_ = scheduler_.stats();
        }
        if (step.finish) all_finished_ = now;
      };
    }
    const Clock::time_point start = Clock::now();
    for (const std::shared_ptr<engine::RequestHandle>& handle : scheduler_.submit(std::move(requests))) handle->wait();
    const engine::Scheduler::Stats end = scheduler_.stats();
    return {seconds_between(start, all_started_), seconds_between(all_started_, all_finished_),
            end.steps - decoding_from_.steps, end.forward_seconds - decoding_from_.forward_seconds,
            end.sampling_seconds - decoding_from_.sampling_seconds};
  }

 private:
  int64_t prompt_tokens_;
  // Written by the step callbacks on the scheduler's thread, read once every request has finished.
  std::vector<bool> started_;       // per sequence of the run: whether it has its first token
  Clock::time_point all_started_;   // when the last sequence had its first token
  Clock::time_point all_finished_;  // when the last sequence finished
  engine::Scheduler::Stats decoding_from_;  // the stats when the last sequence had its first token
  engine::Scheduler scheduler_;     // last: its thread calls back into the members above until it is gone
};

// Tokens per second; 0 for no tokens (-n 0), which took no time.
double tokens_per_second(int64_t tokens, double seconds) { return tokens > 0 ? tokens / seconds : 0.0; }

// One row of the batched test: B sequences, the mean seconds of its two phases, and the speeds of its runs.
struct ParallelResult {
  int64_t sequences = 0;
  double prompt_seconds = 0.0;      // T_PP
  double generation_seconds = 0.0;  // T_TG
  Spread prompt_speed;              // S_PP: B * p / T_PP
  Spread generation_speed;          // S_TG: B * n / T_TG
  Spread speed;                     // S: B * (p + n) / (T_PP + T_TG)
  // Milliseconds a decoding step: in all, in the forward pass, in sampling.
  double step_ms = 0.0;
  double forward_ms = 0.0;
  double sampling_ms = 0.0;
};

// `repetitions` timed runs of B sequences on a fresh scheduler.
ParallelResult run_parallel(engine::Engine& engine, TokenSource& source, int64_t sequences,
                            const BenchOptions& options) {
  const int64_t p = options.prompt_tokens, n = options.generated_tokens;
  BatchRunner runner(engine, sequences, p);
  std::vector<double> prompt_seconds, generation_seconds, prompt_speeds, generation_speeds, speeds;
  BatchTimes decoding;  // summed over the runs
  for (int r = 0; r < options.repetitions; ++r) {
    const BatchTimes times = runner.run(source, sequences, n);
    prompt_seconds.push_back(times.prompt_seconds);
    generation_seconds.push_back(times.generation_seconds);
    prompt_speeds.push_back(tokens_per_second(sequences * p, times.prompt_seconds));
    generation_speeds.push_back(tokens_per_second(sequences * n, times.generation_seconds));
    speeds.push_back(tokens_per_second(sequences * (p + n), times.prompt_seconds + times.generation_seconds));
    decoding.generation_seconds += times.generation_seconds;
    decoding.steps += times.steps;
    decoding.forward_seconds += times.forward_seconds;
    decoding.sampling_seconds += times.sampling_seconds;
  }
  const auto per_step_ms = [&](double seconds) {
    return decoding.steps > 0 ? 1e3 * seconds / static_cast<double>(decoding.steps) : 0.0;
  };
  return {sequences,
          spread_of(prompt_seconds).mean,
          spread_of(generation_seconds).mean,
          spread_of(prompt_speeds),
          spread_of(generation_speeds),
          spread_of(speeds),
          per_step_ms(decoding.generation_seconds),
          per_step_ms(decoding.forward_seconds),
          per_step_ms(decoding.sampling_seconds)};
}

void print_parallel_table(const engine::Engine& engine, const BenchOptions& options, int64_t kv_positions,
                          const std::vector<ParallelResult>& results) {
  const gguf::File& file = engine.file();
  fmt::print("{} ({}, {} params), {}, {} threads, KV cache of {} positions\n\n", model_description(file),
             size_text(file.tensor_bytes()), count_text(file.parameter_count()), engine.device_name(),
             engine.threads(), kv_positions);
  fmt::print("| {:>6} | {:>6} | {:>4} | {:>6} | {:>8} | {:>18} | {:>8} | {:>18} | {:>8} | {:>18} |\n", "PP", "TG", "B",
             "N_KV", "T_PP s", "S_PP t/s", "T_TG s", "S_TG t/s", "T s", "S t/s");
  fmt::print("| {:->5}: | {:->5}: | {:->3}: | {:->5}: | {:->7}: | {:->17}: | {:->7}: | {:->17}: | {:->7}: | {:->17}: "
             "|\n", "", "", "", "", "", "", "", "", "", "");
  const int64_t p = options.prompt_tokens, n = options.generated_tokens;
  for (const ParallelResult& r : results)
    fmt::print("| {:>6} | {:>6} | {:>4} | {:>6} | {:>8.3f} | {:>18} | {:>8.3f} | {:>18} | {:>8.3f} | {:>18} |\n", p, n,
               r.sequences, r.sequences * (p + n), r.prompt_seconds, spread_text(r.prompt_speed), r.generation_seconds,
               spread_text(r.generation_speed), r.prompt_seconds + r.generation_seconds, spread_text(r.speed));
  fmt::print("\nA decoding step, in ms: all of it (the forward pass, sampling)\n");
  for (const ParallelResult& r : results)
    fmt::print("  B {:>4}: {:.3f} ({:.3f}, {:.3f})\n", r.sequences, r.step_ms, r.forward_ms, r.sampling_ms);
}

// Rows under llama-batched-bench's JSON names (pl: B), each speed with its standard deviation.
void print_parallel_json(const engine::Engine& engine, const BenchOptions& options, int64_t kv_positions,
                         const std::vector<ParallelResult>& results) {
  const int64_t p = options.prompt_tokens, n = options.generated_tokens;
  nlohmann::json rows = nlohmann::json::array();
  for (const ParallelResult& r : results)
    rows.push_back({{"pp", p},
                    {"tg", n},
                    {"pl", r.sequences},
                    {"n_kv", r.sequences * (p + n)},
                    {"t_pp", r.prompt_seconds},
                    {"speed_pp", r.prompt_speed.mean},
                    {"speed_pp_std", r.prompt_speed.std},
                    {"t_tg", r.generation_seconds},
                    {"speed_tg", r.generation_speed.mean},
                    {"speed_tg_std", r.generation_speed.std},
                    {"t", r.prompt_seconds + r.generation_seconds},
                    {"speed", r.speed.mean},
                    {"speed_std", r.speed.std},
                    {"step_ms", r.step_ms},
                    {"forward_ms", r.forward_ms},
                    {"sampling_ms", r.sampling_ms}});
  nlohmann::json out = engine_json(engine);
  out["kv_positions"] = kv_positions;
  out["parallel"] = rows;
  fmt::print("{}\n", out.dump(2));
}

void bench_parallel(const BenchOptions& options) {
  const int64_t p = options.prompt_tokens, n = options.generated_tokens;
  if (p == 0) fail("--parallel needs prompts of at least one token, not -p 0");
  const std::shared_ptr<const gguf::File> file = gguf::File::open(options.model);
  // Each alone first, so that their sum cannot overflow.
  check_context(*file, std::max(p, n), fmt::format("the longer of -p {} and -n {}", p, n));
  check_context(*file, p + n, fmt::format("a sequence of -p {} + -n {} positions", p, n));
  // Every sequence of the largest row at once, in whole blocks, so that none is preempted.
  const int64_t most_sequences = std::ranges::max(options.parallel);
  const int64_t blocks = most_sequences * model::kv_blocks_for(p + n);
  engine::EngineOptions engine_options = options.engine;
  engine_options.paged = true;
  if (engine_options.context == 0) {
    engine_options.context = blocks * model::kKvBlockPositions;
  } else if (engine_options.context < p + n) {
    fail("--ctx {} cannot hold a sequence of -p {} + -n {} positions", engine_options.context, p, n);
  } else if (model::kv_blocks_for(engine_options.context) < blocks) {
    fmt::print(stderr, "bench: --ctx {} holds fewer than the {} positions of {} sequences at once: some are "
               "preempted and computed again\n", engine_options.context, blocks * model::kKvBlockPositions,
               most_sequences);
  }
  engine::Engine engine(file, engine_options);
  TokenSource source(engine.tokenizer());
  // One prompt evaluated first, untimed, as llama-batched-bench warms up: weights mapped in, threads started.
  BatchRunner(engine, 1, p).run(source, 1, 0);
  std::vector<ParallelResult> results;
  for (const int64_t sequences : options.parallel) results.push_back(run_parallel(engine, source, sequences, options));
  const int64_t kv_positions = engine.forward_pass().kv_blocks() * model::kKvBlockPositions;
  if (options.json)
    print_parallel_json(engine, options, kv_positions, results);
  else
    print_parallel_table(engine, options, kv_positions, results);
}

void bench(const BenchOptions& options) {
  if (!options.parallel.empty()) return bench_parallel(options);
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
  CLI::App* command = app.add_subcommand(
      "bench", "Measure prompt and generation speed (like llama-bench; llama-batched-bench with --parallel)");
  command->add_option("-m,--model", options->model, "GGUF model file")->required();
  // -p and -n are checked against the model's context when it is open.
  CLI::Option* prompt = command
                            ->add_option("-p,--n-prompt", options->prompt_tokens,
                                         fmt::format("Prompt tokens per ppN run (0: skip); per sequence with "
                                                     "--parallel (default there: {})",
                                                     kParallelPromptTokens))
                            ->transform(integer_in<int64_t>(0))
                            ->capture_default_str();
  command->add_option("-n,--n-gen", options->generated_tokens,
                      "Generated tokens per tgN run (0: skip); per sequence with --parallel")
      ->transform(integer_in<int64_t>(0))
      ->capture_default_str();
  command->add_option("-r,--repetitions", options->repetitions, "Timed runs per test")
      ->transform(integer_in(1))
      ->capture_default_str();
  CLI::Option* parallel =
      command
          ->add_option("--parallel", options->parallel,
                       "Instead of ppN and tgN, llama-batched-bench's test for each B of this comma-separated list: B "
                       "sequences' prompts as one batch, then their tokens decoded together")
          ->delimiter(',')
          ->transform(integer_in<int64_t>(1, kMaxParallel));
  command
      ->add_option("-c,--ctx", options->engine.context,
                   "KV cache positions the --parallel sequences share (default: every sequence of the largest B "
                   "at once; fewer preempt some)")
      ->transform(integer_in<int64_t>(1))
      ->needs(parallel);
  add_threads_option(*command, options->engine.threads, "one per physical core");
  command->add_flag("--json", options->json, "Print one JSON object instead of the table");
  add_device_options(*command, options->engine);
  command->callback([options, prompt] {
    if (!options->parallel.empty() && prompt->count() == 0) options->prompt_tokens = kParallelPromptTokens;
    bench(*options);
  });
}

}  // namespace rf::cli
