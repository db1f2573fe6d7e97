// rocmforge eval -m MODEL -p PROMPT -n N --out PREFIX [--gpu]: evaluates a prompt and N greedy tokens on the
// CPU (or the GPU) and writes what ../shared/reference holds for llama.cpp: PREFIX.json (the tokens) and
// PREFIX.logits.f32 (one row of logits per prompt position, then per generated token the row that chose it),
// so the two compare row by row.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "backend/cpu/residency.h"
#include "backend/cpu/transformer.h"
#if ROCMFORGE_HAVE_GPU
#include "backend/gpu/transformer.h"
#endif
#include "cli/commands.h"
#include "gguf/gguf.h"
#include "model/execution_plan.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace rf::cli {
namespace {

struct EvalOptions {
  std::string model_path;
  std::string prompt;
  int64_t n_tokens = 16;
  std::string out_prefix;
  int threads = 0;
  bool gpu = false;
};

int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

void write_file(const std::string& path, const void* data, size_t bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail("{}: cannot create: {}", path, std::strerror(errno));
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  if (!out.flush()) fail("{}: cannot write: {}", path, std::strerror(errno));
}

void eval(const EvalOptions& options) {
  if (options.n_tokens < 1) fail("-n must be at least 1, got {}", options.n_tokens);
  std::shared_ptr<const gguf::File> file = gguf::File::open(options.model_path);
  const Tokenizer tokenizer(*file);
  const std::vector<int32_t> prompt_tokens = tokenizer.encode(options.prompt, true, false);
  if (prompt_tokens.empty()) fail("the prompt is empty and the model adds no BOS token: nothing to evaluate");
  const int64_t context = static_cast<int64_t>(prompt_tokens.size()) + options.n_tokens;
  const auto check_context = [&](const model::ExecutionPlan& plan) {
    if (context > plan.config().context_length)
      fail("{} prompt tokens + {} generated exceed the model's context of {} positions", prompt_tokens.size(),
           options.n_tokens, plan.config().context_length);
  };

  // One row per prompt position; then the row that chose each generated token: the last prompt row for the
  // first, the logits after feeding the previous token for the others. Generation does not stop at EOS.
  // `transformer` is a cpu::Transformer or a gpu::Transformer, `all` its Logits::All.
  size_t n_vocab = 0;
  std::vector<float> rows;
  std::vector<int32_t> greedy_tokens;
  const auto evaluate = [&](auto& transformer, auto all) {
    const std::span<const float> prompt_logits = transformer.forward(prompt_tokens, 0, all);
    n_vocab = static_cast<size_t>(transformer.config().vocab_size);
    rows.assign(prompt_logits.begin(), prompt_logits.end());
    std::span<const float> chooser = prompt_logits.last(n_vocab);
    for (int64_t i = 0; i < options.n_tokens; ++i) {
      if (i > 0) chooser = transformer.forward({&greedy_tokens.back(), 1}, transformer.cached());
      rows.insert(rows.end(), chooser.begin(), chooser.end());
      greedy_tokens.push_back(argmax(chooser));
    }
  };
  if (options.gpu) {
#if ROCMFORGE_HAVE_GPU
    const model::ExecutionPlan plan = model::ExecutionPlan::build(file, gpu::make_residency());
    check_context(plan);
    gpu::Transformer transformer(plan, gpu::TransformerOptions{.context = context});
    evaluate(transformer, gpu::Logits::All);
#else
    fail("--gpu: this build has no GPU backend (configure with ROCMFORGE_GPU=cuda or hip)");
#endif
  } else {
    const model::ExecutionPlan plan = model::ExecutionPlan::build(file, std::make_shared<cpu::MappedResidency>());
    check_context(plan);
    cpu::TransformerOptions transformer_options;
    transformer_options.threads = options.threads;
    transformer_options.context = context;
    cpu::Transformer transformer(plan, transformer_options);
    evaluate(transformer, cpu::Logits::All);
  }

  const std::string logits_path = options.out_prefix + ".logits.f32";
  write_file(logits_path, rows.data(), rows.size() * sizeof(float));
  nlohmann::ordered_json json;
  json["model"] = std::filesystem::path(options.model_path).filename().string();
  json["prompt"] = options.prompt;
  json["add_bos"] = tokenizer.add_bos();
  json["n_vocab"] = n_vocab;
  json["prompt_tokens"] = prompt_tokens;
  json["greedy_tokens"] = greedy_tokens;
  json["logits_file"] = std::filesystem::path(logits_path).filename().string();
  json["logits_rows"] = rows.size() / n_vocab;
  // Indented by one space and ASCII-escaped, as the reference files are written.
  const std::string text = json.dump(1, ' ', true);
  write_file(options.out_prefix + ".json", text.data(), text.size());
  fmt::print("{}: {} prompt tokens, {} generated: {}\n", options.out_prefix, prompt_tokens.size(), greedy_tokens.size(),
             tokenizer.decode(greedy_tokens));
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto options = std::make_shared<EvalOptions>();
  CLI::App* command = app.add_subcommand(
      "eval",
      "Evaluate a prompt and greedy tokens on the CPU (or GPU); write their tokens and logits for comparison");
  command->add_option("-m,--model", options->model_path, "GGUF model")->required();
  command->add_option("-p,--prompt", options->prompt, "Prompt text (BOS is added as the model's tokenizer says)")
      ->required();
  command->add_option("-n,--tokens", options->n_tokens, "Greedy tokens to generate")->capture_default_str();
  command->add_option("--out", options->out_prefix, "Output prefix: writes PREFIX.json and PREFIX.logits.f32")
      ->required();
  command->add_option("-t,--threads", options->threads, "CPU threads (0: physical cores)")->capture_default_str();
  command->add_flag("--gpu", options->gpu, "Run on the GPU backend");
  command->callback([options] { eval(*options); });
}

}  // namespace rf::cli
