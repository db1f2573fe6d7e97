// rocmforge perplexity -m MODEL -f TEXT -c CTX [--chunks N] [--device auto|cpu|gpu]: how well a model
// predicts a text, by llama.cpp's method (tools/perplexity), so the numbers compare with llama-perplexity's.
// The whole text is tokenized once (with BOS when the model adds one) and cut into chunks of CTX tokens; each
// chunk is evaluated from an empty cache in one pass with its first token replaced by BOS, and only the
// second half of each chunk is scored, so every scored token has at least CTX/2 tokens of context.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/options.h"
#include "engine/engine.h"
#include "util/error.h"

namespace rf::cli {
namespace {

struct PerplexityOptions {
  std::string model;
  std::string file;
  int64_t chunks = -1;  // -1: all
  engine::EngineOptions engine{.context = 512};  // tokens per chunk
};

// -log softmax(logits)[token], with llama.cpp's rounding: exponentials in float, their sum in double.
double negative_log_likelihood(std::span<const float> logits, int32_t token) {
  float max_logit = logits[0];
  for (const float logit : logits) max_logit = std::max(max_logit, logit);
  double sum = 0.0;
  for (const float logit : logits) sum += std::exp(logit - max_logit);
  return -(logits[static_cast<size_t>(token)] - max_logit - std::log(sum));
}

void perplexity(const PerplexityOptions& options) {
  const int64_t n_ctx = options.engine.context;
  engine::Engine engine(open_model(options.model, options.engine), options.engine);
  const Tokenizer& tokenizer = engine.tokenizer();

  // As llama.cpp's -f: the file without one trailing newline.
  std::string text = read_text_file(options.file);
  if (!text.empty() && text.back() == '\n') text.pop_back();
  const std::vector<int32_t> tokens = tokenizer.encode(text, true, false);

  const auto n_tokens = static_cast<int64_t>(tokens.size());
  if (n_tokens < 2 * n_ctx)
    fail("'{}' gives {} tokens; a context of {} needs at least {}", options.file, n_tokens, n_ctx, 2 * n_ctx);
  const int64_t n_chunks = options.chunks < 0 ? n_tokens / n_ctx : std::min(options.chunks, n_tokens / n_ctx);
  const int64_t first = n_ctx / 2;
  const int64_t n_vocab = engine.config().vocab_size;
  fmt::print(stderr, "perplexity: {} tokens, {} chunks of {}, {}\n", n_tokens, n_chunks, n_ctx, backend_text(engine));

  double nll = 0.0;   // sum of negative log-likelihoods
  double nll2 = 0.0;  // sum of their squares
  int64_t count = 0;
  const auto start = std::chrono::steady_clock::now();
  std::vector<int32_t> chunk(static_cast<size_t>(n_ctx));
  for (int64_t c = 0; c < n_chunks; ++c) {
    const auto chunk_begin = tokens.begin() + c * n_ctx;
    chunk.assign(chunk_begin, chunk_begin + n_ctx);
    if (tokenizer.add_bos()) chunk[0] = tokenizer.bos();
    const std::span<const float> logits = engine.evaluate_all(chunk);
    // The logits at position j predict the token at j + 1 (the original text's, never the BOS put in).
    for (int64_t j = first; j < n_ctx - 1; ++j) {
      const double v = negative_log_likelihood(logits.subspan(static_cast<size_t>(j * n_vocab), static_cast<size_t>(n_vocab)),
                                               chunk_begin[j + 1]);
      nll += v;
      nll2 += v * v;
      ++count;
    }
    fmt::print("[{}]{:.4f},", c + 1, std::exp(nll / count));
    std::fflush(stdout);
  }
  fmt::print("\n");

  // llama.cpp's uncertainty: the standard error of the mean NLL, carried to the PPL by d(e^x) = e^x dx.
  const double mean = nll / count;
  const double variance = nll2 / count - mean * mean;
  const double ppl = std::exp(mean);
  const double error = variance > 0 && count > 1 ? std::sqrt(variance / (count - 1)) * ppl : 0.0;
  fmt::print("Final estimate: PPL = {:.4f} +/- {:.5f}\n", ppl, error);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print(stderr, "perplexity: {:.2f} s, {:.1f} tokens/s\n", seconds, n_chunks * n_ctx / seconds);
}

}  // namespace

void add_perplexity_command(CLI::App& app) {
  auto options = std::make_shared<PerplexityOptions>();
  CLI::App* command = app.add_subcommand("perplexity", "Perplexity of a model over a text file (llama.cpp's method)");
  command->add_option("-m,--model", options->model, "GGUF model file")->required();
  command->add_option("-f,--file", options->file, "Text file (e.g. wiki.test.raw)")->required();
  // At least 4 tokens, so that a chunk's scored second half is not empty; at most the model's context (open_model).
  command->add_option("-c,--ctx", options->engine.context, "Tokens per chunk, at most the model's context")
      ->transform(integer_in<int64_t>(4))
      ->capture_default_str();
  // 0 chunks would score nothing and report a perplexity of NaN.
  command->add_option("--chunks", options->chunks, "Chunks to evaluate at most (-1: all)")
      ->transform(integer_option<int64_t>([](int64_t chunks) { return chunks == -1 || chunks >= 1; },
                                          "-1 (all) or an integer >= 1"))
      ->capture_default_str();
  add_threads_option(*command, options->engine.threads, "one per physical core");
  add_device_options(*command, options->engine);
  command->callback([options] { perplexity(*options); });
}

}  // namespace rf::cli
