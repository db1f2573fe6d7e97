#include "engine/engine.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "backend/cpu/residency.h"
#include "util/error.h"

namespace rf::engine {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

uint64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page_size > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size) : 0;
}

}  // namespace

int64_t default_context(const model::ModelConfig& config) {
  // Keys and values, every layer, kv_dim halves each.
  const auto bytes_per_position = static_cast<uint64_t>(2 * config.n_layers * config.kv_dim() * 2);
  const uint64_t budget = physical_memory_bytes() / 4;
  const auto fitting = static_cast<int64_t>(budget / std::max<uint64_t>(bytes_per_position, 1));
  return std::max<int64_t>(1, std::min(config.context_length, fitting));
}

Engine::Engine(const std::string& model_path, const EngineOptions& options) {
  const Clock::time_point start = Clock::now();
  file_ = gguf::File::open(model_path);
  plan_ = std::make_unique<model::ExecutionPlan>(
      model::ExecutionPlan::build(file_, std::make_shared<cpu::MappedResidency>()));
  tokenizer_ = std::make_unique<Tokenizer>(*file_);
  open_ms_ = seconds_since(start) * 1e3;

  plan_->preload_all();
  cpu::TransformerOptions transformer_options;
  transformer_options.threads = options.threads;
  transformer_options.context = options.context > 0 ? options.context : default_context(plan_->config());
  transformer_ = std::make_unique<cpu::Transformer>(*plan_, transformer_options);
  ready_ms_ = seconds_since(start) * 1e3;
}

void Engine::require_fits(int64_t tokens) const {
  if (tokens > context()) fail("prompt of {} tokens does not fit the context of {}", tokens, context());
}

std::span<const float> Engine::extend(int64_t keep, std::span<const int32_t> tokens, cpu::Logits which) {
  require_fits(keep + static_cast<int64_t>(tokens.size()));
  // Forget what the pass overwrites before it runs, so that a failed pass leaves the record true.
  cached_.resize(static_cast<size_t>(keep));
  const std::span<const float> logits = transformer_->forward(tokens, keep, which);
  cached_.insert(cached_.end(), tokens.begin(), tokens.end());
  last_evaluated_ = static_cast<int64_t>(tokens.size());
  return logits;
}

std::span<const float> Engine::evaluate(std::span<const int32_t> tokens) {
  if (tokens.empty()) fail("nothing to evaluate: the prompt has no tokens");
  const auto mismatch = std::mismatch(cached_.begin(), cached_.end(), tokens.begin(), tokens.end());
  // The last token is evaluated again even when cached: its logits are what the caller wants.
  const auto common = std::min<int64_t>(mismatch.first - cached_.begin(), static_cast<int64_t>(tokens.size()) - 1);
  return extend(common, tokens.subspan(static_cast<size_t>(common)), cpu::Logits::Last);
}

std::span<const float> Engine::evaluate_all(std::span<const int32_t> tokens) {
  if (tokens.empty()) fail("nothing to evaluate: no tokens");
  return extend(0, tokens, cpu::Logits::All);
}

std::span<const float> Engine::append(int32_t token) {
  return extend(static_cast<int64_t>(cached_.size()), {&token, 1}, cpu::Logits::Last);
}

void Engine::reset() {
  transformer_->truncate(0);
  cached_.clear();
}

Generation Engine::generate(std::span<const int32_t> prompt, const GenerationParams& params,
                            const TokenCallback& on_token) {
  Generation result;
  const Clock::time_point prompt_start = Clock::now();
  std::span<const float> logits = evaluate(prompt);
  result.prompt_seconds = seconds_since(prompt_start);
  result.prompt_tokens = last_evaluated_;
  result.reused_tokens = static_cast<int64_t>(prompt.size()) - last_evaluated_;
  if (params.max_tokens == 0) return result;

  sampling::Sampler sampler(params.sampling);
  for (const int32_t token : prompt) sampler.accept(token);
  while (true) {
    const int32_t token = sampler.sample(logits);
    sampler.accept(token);
    if (!params.ignore_eos && tokenizer_->is_end_of_generation(token)) {
      result.stop = StopReason::EndOfGeneration;
      break;
    }
    result.tokens.push_back(token);
    if (!on_token(token)) {
      result.stop = StopReason::Callback;
      break;
    }
    if (params.max_tokens >= 0 && static_cast<int64_t>(result.tokens.size()) >= params.max_tokens) {
      result.stop = StopReason::TokenLimit;
      break;
    }
    if (static_cast<int64_t>(cached_.size()) >= context()) {
      result.stop = StopReason::ContextFull;
      break;
    }
    const Clock::time_point decode_start = Clock::now();
    logits = append(token);
    result.decode_seconds += seconds_since(decode_start);
    ++result.decoded_tokens;
  }
  return result;
}

}  // namespace rf::engine
