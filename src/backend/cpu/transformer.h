// The forward pass on the CPU, in the spirit of llama2.c's run.c: one function, forward_batch(), reads top to
// bottom as the model computes, for every family of model/architecture.h. A batch of tokens (a prompt) is one pass
// of matrix-matrix products; a single token (decoding) is the same pass with one row. Keys and values stay in a
// per-layer cache, so evaluation continues where it stopped, and the cache can be truncated to reuse a common prefix
// (chat).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "backend/cpu/kv_cache.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/thread_pool.h"
#include "model/execution_plan.h"
#include "model/forward_pass.h"

namespace rf::cpu {

struct TransformerOptions {
  int threads = 0;                       // 0: physical cores
  int64_t context = 0;                   // positions the KV cache holds; 0: the model's context length
  TensorType kv_type = TensorType::F16;  // F16 or F32
  int64_t max_batch = 512;               // tokens per pass; a longer batch runs as several passes
  int64_t layers = 0;                    // layers run here, from the first (0: all); see forward_hidden()
  // Products take f32 activations, quantized weights dequantized row by row, instead of 8-bit blocks: what
  // llama.cpp computes on an F32 copy of the weights (../shared/arch/reference), several times slower.
  bool float_activations = false;
};

using model::Logits;

class Transformer final : public model::ForwardPass {
 public:
  // The plan's tensors must live on the CPU (cpu::MappedResidency); they materialize as layers first run.
  // The plan must outlive the transformer. One thread at a time uses a transformer.
  explicit Transformer(const model::ExecutionPlan& plan, const TransformerOptions& options = {});

  std::span<const float> forward(std::span<const int32_t> tokens, int64_t position,
                                 Logits which = Logits::Last) override;
  // For a transformer that runs the first layers only (TransformerOptions::layers), the later ones running on a
  // GPU: the same evaluation through its layers, returning the residual stream after the last of them (n_embd
  // floats per token, every token), which gpu::Transformer::forward takes.
  std::span<const float> forward_hidden(std::span<const int32_t> tokens, int64_t position);

  int64_t cached() const override { return cache_.size(); }
  void truncate(int64_t positions) override { cache_.truncate(positions); }
  int64_t context() const override { return cache_.capacity(); }
  const model::ModelConfig& config() const { return config_; }
  ThreadPool& pool() { return pool_; }

 private:
  // Checks the tokens and positions, drops cached positions from `position` on, and calls
  // batch(start, count) for each pass of at most max_batch tokens.
  template <typename Batch>
  void run(std::span<const int32_t> tokens, int64_t position, const Batch& batch);
  // Runs at most max_batch tokens through the layers; then, where `logits` is not null, writes the logits of
  // the last token or all tokens there.
  void forward_batch(std::span<const int32_t> tokens, int64_t position, Logits which, float* logits);
  // The block's norm (RMSNorm or LayerNorm, as the architecture says) of `rows` rows of n_embd values.
  void normalize(float* out, const float* in, const model::LazyTensor& weight, const model::LazyTensor& bias,
                 int64_t rows) const;
  // out = input x weight (+ bias), for the rows that input_ holds.
  void project(const model::LazyTensor& weight, const model::LazyTensor& bias, float* out);
  // Queries, keys and values of xb_, rotated, into the cache; attention; the output projection into delta_.
  void attention_block(int64_t layer, int64_t n_tokens, int64_t position);
  void attention(int64_t layer, int64_t n_tokens, int64_t position);
  // The feed-forward network of xb_ into delta_.
  void ffn_block(const model::LayerPlan& layer, int64_t n_tokens);
  void reserve_batch(int64_t n_tokens);

  const model::ExecutionPlan& plan_;
  const model::ModelConfig& config_;
  int64_t max_batch_;
  int64_t layers_;
  ThreadPool pool_;
  KvCache cache_;
  // The rotary frequencies of full-context layers [0] and of sliding-window layers [1] (used where those rotate
  // apart: ModelConfig::sliding_layers_rotate_apart).
  std::vector<double> inverse_frequencies_[2];

  // Activations of the batch, one row per token (llama2.c's RunState).
  int64_t batch_capacity_ = 0;
  std::vector<float> x_;         // residual stream [n, n_embd]
  std::vector<float> xb_;        // normalized input of a block [n, n_embd]
  std::vector<float> q_;         // queries [n, q_dim]
  std::vector<float> k_;         // keys [n, kv_dim]
  std::vector<float> v_;         // values [n, kv_dim]
  std::vector<float> attn_out_;  // attention output [n, q_dim]
  std::vector<float> hb_;        // feed-forward gate, then silu(gate) * up [n, n_ff]
  std::vector<float> hb2_;       // feed-forward up [n, n_ff]
  std::vector<float> delta_;     // a block's output before it joins the residual stream [n, n_embd]
  std::vector<float> rope_[2];   // (cos, sin) per dimension pair [n, rope_dims], of each kind of layer
  std::vector<float> scores_;    // attention scores, one context-sized row per thread
  std::vector<float> logits_;
  std::vector<float> hidden_;    // forward_hidden's result [n, n_embd]
  QuantizedRows input_;
};

}  // namespace rf::cpu
