// rocmforge eval -m MODEL -p PROMPT -n N --out PREFIX [--device cpu|gpu|auto]: evaluates a prompt and N
// greedy tokens and writes what ../shared/reference holds for llama.cpp: PREFIX.json (the tokens) and
// PREFIX.logits.f32 (one row of logits per prompt position, then per generated token the row that chose it),
// so the two compare row by row. It runs on the CPU unless told otherwise: a comparison names the backend it
// checks, and the CPU's output is the one the tests hold to the reference.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "engine/engine.h"
#include "gguf/gguf.h"
#include "model/config.h"
#include "tokenizer/tokenizer.h"
#include "util/argmax.h"
#include "util/error.h"

namespace rf::cli {
namespace {

struct EvalOptions {
  std::string model_path;
  std::string prompt;
  int64_t n_tokens = 16;
  std::string out_prefix;
  engine::EngineOptions engine{.device = engine::Device::Cpu};
};

void write_file(const std::string& path, const void* data, size_t bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail("{}: cannot create: {}", path, std::strerror(errno));
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  if (!out.flush()) fail("{}: cannot write: {}", path, std::strerror(errno));
}

void eval(const EvalOptions& options) {
  std::shared_ptr<const gguf::File> file = gguf::File::open(options.model_path);
  const Tokenizer tokenizer(*file);
  const std::vector<int32_t> prompt_tokens = tokenizer.encode(options.prompt, true, false);
  if (prompt_tokens.empty()) fail("the prompt is empty and the model adds no BOS token: nothing to evaluate");
  const int64_t context = static_cast<int64_t>(prompt_tokens.size()) + options.n_tokens;
  check_context(*file, context, fmt::format("{} prompt tokens + {} generated", prompt_tokens.size(), options.n_tokens));
  engine::EngineOptions engine_options = options.engine;
  engine_options.context = context;
  engine::Engine engine(file, engine_options);
  fmt::print(stderr, "backend: {}\n", backend_text(engine));

  // One row per prompt position; then the row that chose each generated token: the last prompt row for the
  // first, the logits after feeding the previous token for the others. Generation does not stop at EOS.
  const auto n_vocab = static_cast<size_t>(engine.config().vocab_size);
  const std::span<const float> prompt_logits = engine.evaluate_all(prompt_tokens);
  std::vector<float> rows(prompt_logits.begin(), prompt_logits.end());
  std::vector<int32_t> greedy_tokens;
  std::span<const float> chooser = prompt_logits.last(n_vocab);
  for (int64_t i = 0; i < options.n_tokens; ++i) {
    if (i > 0) chooser = engine.append(greedy_tokens.back());
    rows.insert(rows.end(), chooser.begin(), chooser.end());
    greedy_tokens.push_back(index_of_largest(chooser));
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
      "Evaluate a prompt and greedy tokens (on the CPU unless --device says otherwise); write their tokens and "
      "logits for comparison");
  command->add_option("-m,--model", options->model_path, "GGUF model")->required();
  command->add_option("-p,--prompt", options->prompt, "Prompt text (BOS is added as the model's tokenizer says)")
      ->required();
  // At most 2^31 - 1, as no model's context is longer: the sum with the prompt's tokens cannot overflow.
  command->add_option("-n,--tokens", options->n_tokens, "Greedy tokens to generate")
      ->transform(integer_in<int64_t>(1, std::numeric_limits<int32_t>::max()))
      ->capture_default_str();
  command->add_option("--out", options->out_prefix, "Output prefix: writes PREFIX.json and PREFIX.logits.f32")
      ->required();
  add_threads_option(*command, options->engine.threads, "one per physical core");
  add_device_options(*command, options->engine);
  command->callback([options] { eval(*options); });
}

}  // namespace rf::cli
