// rocmforge run -m MODEL -p PROMPT [-n N] [--device auto|cpu|gpu] [sampling options]: continues a prompt,
// streaming the text to stdout as it is generated; the backend, load time and prompt and decode speeds go to
// stderr.
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/options.h"
#include "engine/engine.h"

namespace rf::cli {
namespace {

struct RunOptions {
  std::string model;
  std::string prompt;
  engine::EngineOptions engine;
  engine::GenerationParams generation;
};

void print_text(const std::string& text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

void run(const RunOptions& options) {
  engine::Engine engine(open_model(options.model, options.engine), options.engine);
  const Tokenizer& tokenizer = engine.tokenizer();
  const std::vector<int32_t> prompt = tokenizer.encode(options.prompt, true, false);
  engine.require_fits(static_cast<int64_t>(prompt.size()));

  fmt::print(stderr, "backend: {}\n", backend_text(engine));
  print_text(options.prompt);
  const engine::Generation generation = engine.generate(prompt, options.generation, [](const engine::Step& step) {
    print_text(step.text);
    return true;
  });
  print_text("\n");

  if (generation.finish == engine::FinishReason::ContextFull)
    fmt::print(stderr, "context full: stopped after {} tokens at the context of {}\n", generation.tokens.size(),
               engine.context());
  fmt::print(stderr, "load: {:.1f} ms\n", engine.ready_ms());
  fmt::print(stderr, "prompt: {} tokens in {:.1f} ms, {:.1f} tokens/s\n", generation.prompt_tokens,
             generation.prompt_seconds * 1e3, generation.prompt_tokens_per_second());
  fmt::print(stderr, "decode: {} tokens in {:.1f} ms, {:.1f} tokens/s\n", generation.decoded_tokens,
             generation.decode_seconds * 1e3, generation.decode_tokens_per_second());
}

}  // namespace

void add_device_options(CLI::App& command, engine::EngineOptions& engine) {
  engine::Device& device = engine.device;
  static const std::map<std::string, engine::Device> kDevices = {
      {"auto", engine::Device::Auto}, {"cpu", engine::Device::Cpu}, {"gpu", engine::Device::Gpu}};
  std::string default_name;
  for (const auto& [name, value] : kDevices)
    if (value == device) default_name = name;
  CLI::Option* option =
      command
          .add_option_function<std::string>(
              "--device", [&device](const std::string& name) { device = kDevices.at(name); },
              "Where the model runs: auto (the GPU when there is one), cpu or gpu")
          ->transform(CLI::IsMember(kDevices, CLI::ignore_case).description(""))
          ->type_name("auto|cpu|gpu")
          ->default_str(default_name);
  command.add_flag_callback("--gpu", [&device] { device = engine::Device::Gpu; }, "Same as --device gpu")
      ->excludes(option);
  command
      .add_option("--gpu-layers,--n-gpu-layers", engine.gpu_layers,
                  "On the GPU: run only the last N layers and the output there, the layers before on the CPU (a "
                  "model larger than device memory; default: all)")
      ->transform(integer_in<int64_t>(0))
      ->type_name("N");
  command.add_flag("--float-activations", engine.float_activations,
                   "Multiply quantized weights with float activations instead of 8-bit ones, as llama.cpp computes on "
                   "an F32 copy of the weights (for comparisons with such references; slower)");
}

std::string backend_text(const engine::Engine& engine) {
  if (engine.device() == engine::Device::Gpu && engine.gpu_layers() < engine.config().n_layers)
    return fmt::format("GPU ({}; layers {}..{} on the GPU, the others on {} CPU threads)", engine.device_name(),
                       engine.config().n_layers - engine.gpu_layers(), engine.config().n_layers - 1, engine.threads());
  if (engine.device() == engine::Device::Gpu) return fmt::format("GPU ({})", engine.device_name());
  return fmt::format("CPU ({} threads)", engine.threads());
}

void add_generation_options(CLI::App& command, engine::EngineOptions& engine, engine::GenerationParams& generation) {
  sampling::SamplingParams& sampling = generation.sampling;
  // A random seed unless one is given, as llama.cpp; --seed makes a run repeatable.
  sampling.seed = std::random_device{}();
  add_device_options(command, engine);
  command
      .add_option("-n,--n-predict", generation.max_tokens, "Tokens to generate at most (-1: until the context is full)")
      ->transform(integer_in<int64_t>(-1))
      ->capture_default_str();
  command
      .add_option("-c,--ctx", engine.context,
                  "Context size in tokens, at most the model's (0: the model's, capped to a quarter of RAM)")
      ->transform(integer_in<int64_t>(0));
  add_threads_option(command, engine.threads, "one per physical core");
  command.add_flag("--ignore-eos", generation.ignore_eos, "Keep generating past the model's end-of-generation tokens");
  // Each sampling option's range is the sampler's own (sampling::check_params).
  using sampling::SamplingParams;
  command.add_option("--temp", sampling.temperature, "Temperature, >= 0 (0: greedy)")
      ->transform(sampling_option(&SamplingParams::temperature))
      ->capture_default_str();
  command.add_option("--top-k", sampling.top_k, "Keep the K most likely tokens (0: off)")
      ->transform(sampling_option(&SamplingParams::top_k))
      ->capture_default_str();
  command
      .add_option("--top-p", sampling.top_p,
                  "Keep the most likely tokens up to this total probability, in (0, 1] (1: off)")
      ->transform(sampling_option(&SamplingParams::top_p))
      ->capture_default_str();
  command
      .add_option("--min-p", sampling.min_p,
                  "Drop tokens less likely than this fraction of the best, in [0, 1] (0: off)")
      ->transform(sampling_option(&SamplingParams::min_p))
      ->capture_default_str();
  command.add_option("--repeat-penalty", sampling.repeat_penalty, "Penalty for repeated tokens, > 0 (1: off)")
      ->transform(sampling_option(&SamplingParams::repeat_penalty))
      ->capture_default_str();
  command
      .add_option("--repeat-last-n", sampling.penalty_last_n, "Tokens the penalties look back over (-1: all, 0: off)")
      ->transform(sampling_option(&SamplingParams::penalty_last_n))
      ->capture_default_str();
  const std::string penalty_range = fmt::format("in [-{}, {}]", sampling::kMaxPenalty, sampling::kMaxPenalty);
  command
      .add_option("--frequency-penalty", sampling.frequency_penalty,
                  fmt::format("Subtracted once per earlier occurrence, {}", penalty_range))
      ->transform(sampling_option(&SamplingParams::frequency_penalty))
      ->capture_default_str();
  command
      .add_option("--presence-penalty", sampling.presence_penalty,
                  fmt::format("Subtracted from every earlier token, {}", penalty_range))
      ->transform(sampling_option(&SamplingParams::presence_penalty))
      ->capture_default_str();
  command.add_option("-s,--seed", sampling.seed, "Random seed (default: random)")->transform(integer_in<uint64_t>(0));
}

void add_run_command(CLI::App& app) {
  auto options = std::make_shared<RunOptions>();
  CLI::App* command = app.add_subcommand("run", "Continue a prompt, streaming the text as it is generated");
  command->add_option("-m,--model", options->model, "GGUF model file")->required();
  command->add_option("-p,--prompt", options->prompt, "Text to continue")->required();
  add_generation_options(*command, options->engine, options->generation);
  command->callback([options] { run(*options); });
}

}  // namespace rf::cli
