#include "engine/engine.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>
#include <vector>

#include "backend/cpu/residency.h"
#include "backend/cpu/transformer.h"
#include "util/error.h"
#if ROCMFORGE_HAVE_GPU
#include "backend/gpu/runtime.h"
#include "backend/gpu/transformer.h"
#endif

namespace rf::engine {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

uint64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page_size > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size) : 0;
}

#if ROCMFORGE_HAVE_GPU
// The first layers on the CPU, the later ones and the output on the GPU (a model larger than device memory):
// each pass hands the residual stream (n_embd floats a token) from the one to the other once.
class SplitForwardPass final : public model::ForwardPass {
 public:
  // `cpu_options` get the GPU part's context, so that both caches hold the same positions.
  SplitForwardPass(const model::ExecutionPlan& cpu_plan, cpu::TransformerOptions cpu_options,
                   const model::ExecutionPlan& gpu_plan, const gpu::TransformerOptions& gpu_options)
      : gpu_(gpu_plan, gpu_options), cpu_(cpu_plan, with_context(cpu_options, gpu_.context())) {}
  std::span<const float> forward(std::span<const int32_t> tokens, int64_t position, model::Logits which) override {
    const std::span<const float> hidden = cpu_.forward_hidden(tokens, position);
    return gpu_.forward(hidden, position, which);
  }
  int64_t cached() const override { return gpu_.cached(); }
  // Each part keeps what its own rings allow (ForwardPass::truncate), so both keep the fewer of the two.
  void truncate(int64_t positions) override {
    cpu_.truncate(positions);
    gpu_.truncate(positions);
    const int64_t kept = std::min(cpu_.cached(), gpu_.cached());
    cpu_.truncate(kept);
    gpu_.truncate(kept);
  }
  int64_t context() const override { return gpu_.context(); }
  int64_t max_batch() const override { return gpu_.max_batch(); }
  int threads() { return cpu_.pool().size(); }

 private:
  static cpu::TransformerOptions with_context(cpu::TransformerOptions options, int64_t context) {
    options.context = context;
    return options;
  }

  gpu::Transformer gpu_;  // before cpu_, whose context is gpu_'s
  cpu::Transformer cpu_;
};
#endif

// Cpu or Gpu: what `asked` means on this build and machine.
Device resolve_device(Device asked) {
  if (asked == Device::Cpu) return Device::Cpu;
  if (gpu_available()) return Device::Gpu;
  if (asked == Device::Auto) return Device::Cpu;
#if ROCMFORGE_HAVE_GPU
  fail("the GPU was asked for, but none is available (no device or no driver)");
#else
  fail("the GPU was asked for, but this build has no GPU backend (configure with ROCMFORGE_GPU=cuda or hip)");
#endif
}

// Where the plan's weights live: mapped from the file for the CPU, uploaded to device memory for the GPU (from
// layer first_gpu_layer on).
std::shared_ptr<model::Residency> residency_for(Device device, int64_t first_gpu_layer) {
#if ROCMFORGE_HAVE_GPU
  if (device == Device::Gpu) return gpu::make_residency(first_gpu_layer);
#else
  (void)first_gpu_layer;
#endif
  return std::make_shared<cpu::MappedResidency>();
}

// The CPU part's options: `layers` layers from the first (0: all).
cpu::TransformerOptions cpu_options(const EngineOptions& options, int64_t context, int64_t layers) {
  cpu::TransformerOptions transformer_options;
  transformer_options.threads = options.threads;
  transformer_options.context = context;
  if (options.paged) transformer_options.kv_blocks = model::kv_blocks_for(context);
  transformer_options.layers = layers;
  transformer_options.float_activations = options.float_activations;
  return transformer_options;
}

}  // namespace

int64_t default_context(const model::ModelConfig& config) {
  // Keys and values, every layer, kv_dim halves each.
  const auto bytes_per_position = static_cast<uint64_t>(2 * config.n_layers * config.kv_dim() * 2);
  const uint64_t budget = physical_memory_bytes() / 4;
  const auto fitting = static_cast<int64_t>(budget / std::max<uint64_t>(bytes_per_position, 1));
  return std::max<int64_t>(1, std::min(config.context_length, fitting));
}

bool gpu_available() {
#if ROCMFORGE_HAVE_GPU
  return gpu::device_available();
#else
  return false;
#endif
}

Engine::Engine(const std::string& model_path, const EngineOptions& options)
    : device_(resolve_device(options.device)) {
  const Clock::time_point start = Clock::now();
  file_ = gguf::File::open(model_path);
  load(options, start);
}

Engine::Engine(std::shared_ptr<const gguf::File> file, const EngineOptions& options)
    : device_(resolve_device(options.device)), file_(std::move(file)) {
  load(options, Clock::now());
}

Engine::~Engine() = default;

void Engine::load(const EngineOptions& options, Clock::time_point start) {
  const int64_t layers = model::read_config(*file_).n_layers;
  if (device_ == Device::Gpu)
    gpu_layers_ = options.gpu_layers < 0 ? layers : std::min(options.gpu_layers, layers);
  if (gpu_layers_ == 0) device_ = Device::Cpu;
  const int64_t first_gpu_layer = layers - gpu_layers_;
  plan_ = std::make_unique<model::ExecutionPlan>(
      model::ExecutionPlan::build(file_, residency_for(device_, first_gpu_layer)));
  tokenizer_ = std::make_unique<Tokenizer>(*file_);
  open_ms_ = seconds_since(start) * 1e3;

#if ROCMFORGE_HAVE_GPU
  // The GPU transformer checks that weights, KV cache and activations fit before anything is uploaded, then
  // streams the weights in while the first tokens are computed (each layer waits for its own).
  if (device_ == Device::Gpu) {
    if (options.paged && first_gpu_layer > 0) fail("paged runs need every layer on the GPU: leave --gpu-layers out");
    const int64_t context = options.context > 0 ? options.context
                                                : std::min(plan_->config().context_length, gpu::kDefaultContext);
    const gpu::TransformerOptions gpu_options{
        .context = options.context,
        .float_activations = options.float_activations,
        .kv_blocks = options.paged ? model::kv_blocks_for(context) : 0};
    device_name_ = gpu::device_info().name;
    if (first_gpu_layer == 0) {
      forward_pass_ = std::make_unique<gpu::Transformer>(*plan_, gpu_options);
    } else {
      cpu_plan_ = std::make_unique<model::ExecutionPlan>(
          model::ExecutionPlan::build(file_, std::make_shared<cpu::MappedResidency>()));
      cpu_plan_->token_embd().data();
      cpu_plan_->preload_layers(0, first_gpu_layer - 1);
      auto split = std::make_unique<SplitForwardPass>(*cpu_plan_, cpu_options(options, 0, first_gpu_layer), *plan_,
                                                      gpu_options);
      threads_ = split->threads();
      forward_pass_ = std::move(split);
      device_name_ += " + CPU";
    }
  }
#endif
  if (device_ == Device::Cpu) {
    plan_->preload_all();
    const int64_t context = options.context > 0 ? options.context : default_context(plan_->config());
    auto cpu_transformer = std::make_unique<cpu::Transformer>(*plan_, cpu_options(options, context, 0));
    threads_ = cpu_transformer->pool().size();
    forward_pass_ = std::move(cpu_transformer);
    device_name_ = "CPU";
  }
  ready_ms_ = seconds_since(start) * 1e3;
}

int64_t Engine::context() const { return forward_pass_->context(); }

void Engine::require_fits(int64_t tokens) const {
  if (tokens > context()) fail("prompt of {} tokens does not fit the context of {}", tokens, context());
}

std::span<const float> Engine::extend(int64_t keep, std::span<const int32_t> tokens, bool all_logits) {
  require_fits(keep + static_cast<int64_t>(tokens.size()));
  // The forward pass may keep fewer positions than asked (ForwardPass::truncate: a sliding-window layer's ring has
  // lost keys): the cached tokens from what it kept on are evaluated again, before `tokens`.
  forward_pass_->truncate(keep);
  const int64_t kept = forward_pass_->cached();
  std::vector<int32_t> redone;
  if (kept < keep) {
    redone.assign(cached_.begin() + kept, cached_.begin() + keep);
    redone.insert(redone.end(), tokens.begin(), tokens.end());
    tokens = redone;
  }
  // Forget what the pass overwrites before it runs, so that a failed pass leaves the record true.
  cached_.resize(static_cast<size_t>(kept));
  const std::span<const float> logits =
      forward_pass_->forward(tokens, kept, all_logits ? model::Logits::All : model::Logits::Last);
  cached_.insert(cached_.end(), tokens.begin(), tokens.end());
  last_evaluated_ = static_cast<int64_t>(tokens.size());
  // With all_logits, the rows of the tokens asked for, not of those evaluated again before them.
  return all_logits ? logits.subspan(static_cast<size_t>((keep - kept) * config().vocab_size)) : logits;
}

std::span<const float> Engine::evaluate(std::span<const int32_t> tokens) {
  if (tokens.empty()) fail("nothing to evaluate: the prompt has no tokens");
  const auto mismatch = std::mismatch(cached_.begin(), cached_.end(), tokens.begin(), tokens.end());
  // The last token is evaluated again even when cached: its logits are what the caller wants.
  const auto common = std::min<int64_t>(mismatch.first - cached_.begin(), static_cast<int64_t>(tokens.size()) - 1);
  return extend(common, tokens.subspan(static_cast<size_t>(common)), false);
}

std::span<const float> Engine::evaluate_all(std::span<const int32_t> tokens) {
  if (tokens.empty()) fail("nothing to evaluate: no tokens");
  return extend(0, tokens, true);
}

std::span<const float> Engine::append(int32_t token) {
  return extend(static_cast<int64_t>(cached_.size()), {&token, 1}, false);
}

void Engine::reset() {
  forward_pass_->truncate(0);
  cached_.clear();
}

Generation Engine::generate(std::span<const int32_t> prompt, const GenerationParams& params,
                            const StepCallback& on_step) {
  Sequence sequence(prompt, params, *tokenizer_);
  Generation result;
  const auto record = [&result](const Step& step) {
    result.text += step.text;
    if (step.logprobs) result.logprobs.push_back(*step.logprobs);
  };
  const Clock::time_point prompt_start = Clock::now();
  std::span<const float> logits = evaluate(prompt);
  result.prompt_seconds = seconds_since(prompt_start);
  result.prompt_tokens = last_evaluated_;
  result.reused_tokens = static_cast<int64_t>(prompt.size()) - last_evaluated_;

  while (!sequence.finished()) {
    // The token chosen now would be evaluated at position cached_.size().
    const bool context_full = static_cast<int64_t>(cached_.size()) >= context();
    const Step step = sequence.step(logits, context_full);
    record(step);
    if (!on_step(step)) record(sequence.cancel());
    if (sequence.finished()) break;
    const Clock::time_point decode_start = Clock::now();
    logits = append(step.token);
    result.decode_seconds += seconds_since(decode_start);
    ++result.decoded_tokens;
  }
  result.tokens = sequence.tokens();
  result.finish = *sequence.finish_reason();
  result.stop_string = sequence.stop_string();
  return result;
}

}  // namespace rf::engine
