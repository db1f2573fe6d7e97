// A model ready to generate text: the GGUF file, its execution plan, the forward pass with its KV cache on
// the CPU or the GPU, and the tokenizer. The engine remembers which tokens its KV cache holds, so a prompt
// that starts like the previous one (the next turn of a chat, a prompt continued) evaluates only the tokens
// that differ. Everything above the forward pass (prefix reuse, generation, context checks) is the same code
// for both backends.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/sequence.h"
#include "gguf/gguf.h"
#include "model/execution_plan.h"
#include "model/forward_pass.h"
#include "sampling/logprobs.h"
#include "tokenizer/tokenizer.h"

namespace rf::engine {

// Where the forward pass runs.
enum class Device {
  Auto,  // the GPU when the build has a GPU backend and a device is present, else the CPU
  Cpu,
  Gpu,
};

struct EngineOptions {
  Device device = Device::Auto;
  int threads = 0;      // CPU threads; 0: physical cores
  int64_t context = 0;  // positions the KV cache holds; 0: default_context() on the CPU, the GPU backend's default
  // On the GPU: how many of the last layers run there, with the output; the layers before them run on the CPU
  // (for a model larger than device memory). < 0 or at least the model's layers: all; 0: none (the CPU).
  int64_t gpu_layers = -1;
  // Products take activations in floating point instead of 8-bit blocks, as llama.cpp computes on an F32 copy
  // of the weights: for comparisons with such references (cpu::TransformerOptions::float_activations); slower.
  bool float_activations = false;
  // The KV cache is a pool of `context` positions in blocks (model::kKvBlockPositions) that a Scheduler shares
  // among many sequences; the single-sequence calls (evaluate, generate, ...) are then rf::Errors. CPU only so far.
  bool paged = false;
};

// What Engine::generate did: the sequence's output, why it finished, and the timings.
struct Generation {
  std::vector<int32_t> tokens;  // generated, without the end-of-generation token
  std::string text;             // every step's text (Step::text): without any stop string
  std::vector<sampling::Logprobs> logprobs;  // one per token, where GenerationParams::top_logprobs asked for them
  FinishReason finish = FinishReason::Length;
  std::optional<size_t> stop_string;  // the index in GenerationParams::stop_strings of the one that ended the text
  int64_t prompt_tokens = 0;    // prompt tokens evaluated now
  int64_t reused_tokens = 0;    // prompt tokens whose keys and values the cache already held
  double prompt_seconds = 0.0;
  int64_t decoded_tokens = 0;   // generated tokens evaluated (the last one is not, unless generation goes on)
  double decode_seconds = 0.0;
  double prompt_tokens_per_second() const { return prompt_seconds > 0 ? prompt_tokens / prompt_seconds : 0.0; }
  double decode_tokens_per_second() const { return decode_seconds > 0 ? decoded_tokens / decode_seconds : 0.0; }
};

// Called with each step as it is taken, the finishing one too (streaming its text); returning false cancels the
// generation (FinishReason::Cancelled) and the callback is not called again.
using StepCallback = std::function<bool(const Step& step)>;

// The model's context length, capped so that an F16 KV cache takes at most a quarter of physical memory.
int64_t default_context(const model::ModelConfig& config);

// Whether this build has a GPU backend and a GPU is present (what Device::Auto picks the GPU on).
bool gpu_available();

class Engine {
 public:
  // Opens the file and checks everything a forward pass needs (an unsupported architecture or tensor type, a
  // missing tensor, a vocabulary-only file are rf::Errors naming what is wrong), then maps every weight (CPU)
  // or starts streaming them to the device (GPU; a model that does not fit device memory is an rf::Error).
  // Device::Gpu where there is none is an rf::Error saying why.
  explicit Engine(const std::string& model_path, const EngineOptions& options = {});
  // The same on a file already open.
  explicit Engine(std::shared_ptr<const gguf::File> file, const EngineOptions& options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const model::ModelConfig& config() const { return plan_->config(); }
  const model::ExecutionPlan& plan() const { return *plan_; }
  const gguf::File& file() const { return *file_; }
  int64_t context() const;
  // The forward pass, for a Scheduler: one thread at a time may use it.
  model::ForwardPass& forward_pass() { return *forward_pass_; }
  // Where the forward pass runs (Cpu or Gpu, never Auto), and its name: "CPU" or the GPU's, e.g. "NVIDIA H200"
  // (with "+ CPU" where the first layers run on the CPU).
  Device device() const { return device_; }
  const std::string& device_name() const { return device_name_; }
  // Layers that run on the GPU (the last ones): 0 on the CPU.
  int64_t gpu_layers() const { return gpu_layers_; }
  // CPU threads running the forward pass; 1 where it all runs on the GPU (the thread that launches its kernels).
  int threads() const { return threads_; }
  // Milliseconds from the start of the constructor until the file was parsed and checked (open) and until
  // the forward pass could start (ready): on the CPU every weight mapped and the KV cache allocated; on the
  // GPU the model checked to fit and the KV cache allocated, with the weights still streaming in (the forward
  // pass waits for each layer's). A file passed in open was parsed before: its time is not counted.
  double open_ms() const { return open_ms_; }
  double ready_ms() const { return ready_ms_; }

  // An rf::Error "prompt of N tokens does not fit the context of M" when `tokens` positions do not fit.
  void require_fits(int64_t tokens) const;

  // Evaluates `tokens` as one sequence from position 0, reusing the cached keys and values of the longest
  // prefix it shares with the cached tokens (where the KV cache keeps them: model::ForwardPass::truncate); returns
  // the logits of the last token (vocab_size floats, valid until the next evaluation). A sequence longer than the
  // context is an rf::Error.
  std::span<const float> evaluate(std::span<const int32_t> tokens);
  // Evaluates `tokens` from position 0 without reusing anything and returns the logits of every token, row
  // after row (perplexity).
  std::span<const float> evaluate_all(std::span<const int32_t> tokens);
  // Evaluates one more token after the cached ones and returns its logits (the next step of decoding).
  std::span<const float> append(int32_t token);
  // Forgets every cached position.
  void reset();
  // Tokens whose keys and values the KV cache holds, in order, and how many the last evaluation computed.
  const std::vector<int32_t>& cached_tokens() const { return cached_; }
  int64_t last_evaluated() const { return last_evaluated_; }

  // Evaluates the prompt (reusing the cached prefix) and runs one Sequence over it until it finishes: an
  // end-of-generation token (unless params.ignore_eos), a stop string, params.max_tokens, a full context, or
  // on_step returning false. Parameters the Sequence refuses are an rf::Error before anything is evaluated; a
  // prompt longer than the context is an rf::Error "prompt of N tokens does not fit the context of M".
  Generation generate(std::span<const int32_t> prompt, const GenerationParams& params, const StepCallback& on_step);

 private:
  // Builds the plan on the device's residency, the tokenizer and the forward pass; `start`: when construction
  // began, for open_ms() and ready_ms().
  void load(const EngineOptions& options, std::chrono::steady_clock::time_point start);
  // Drops every cached position from `keep` on (keep <= cached), then evaluates `tokens` at positions keep,
  // keep + 1, ..., after the cached tokens before `keep` that the forward pass did not keep (last_evaluated()
  // counts them). A total longer than the context is an rf::Error.
  // `all_logits`: the logits of every token, else of the last.
  std::span<const float> extend(int64_t keep, std::span<const int32_t> tokens, bool all_logits);

  Device device_;
  std::string device_name_;
  int64_t gpu_layers_ = 0;
  int threads_ = 1;
  std::shared_ptr<const gguf::File> file_;
  std::unique_ptr<model::ExecutionPlan> plan_;      // the GPU's where it runs layers, else the CPU's
  std::unique_ptr<model::ExecutionPlan> cpu_plan_;  // the first layers' where the GPU runs only the last ones
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<model::ForwardPass> forward_pass_;  // the CPU's, the GPU's, or the two in turn
  std::vector<int32_t> cached_;
  int64_t last_evaluated_ = 0;
  double open_ms_ = 0.0;
  double ready_ms_ = 0.0;
};

}  // namespace rf::engine
