// The forward pass on the CPU, in the spirit of llama2.c's run.c: one function, forward_batch(), reads top to
// bottom as the model computes, for every family of model/architecture.h. A batch of tokens (a prompt, or the
// tokens of many sequences) is one pass of matrix-matrix products; a single token (decoding) is the same pass with
// one row. Keys and values stay in a per-layer cache, so evaluation continues where it stopped: one sequence's,
// which can be truncated to reuse a common prefix (chat), or a paged one that the sequences of batches share.
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
  // Blocks of model::kKvBlockPositions positions in a paged KV cache, for batches of sequences (forward(batch,
  // copies)) instead of one sequence; 0: one sequence's cache of `context` positions.
  int64_t kv_blocks = 0;
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

  std::span<const float> forward(std::span<const model::BatchSequence> batch,
                                 std::span<const model::BlockCopy> copies) override;
  std::span<const int32_t> argmax() const override { return argmax_; }

  int64_t cached() const override { return cache_.size(); }
  void truncate(int64_t positions) override;
  int64_t context() const override { return cache_.capacity(); }
  int64_t kv_blocks() const override { return kv_blocks_; }
  int64_t max_batch() const override { return max_batch_; }
  const model::ModelConfig& config() const { return config_; }
  ThreadPool& pool() { return pool_; }

 private:
  // A row of a pass: its token, its position, and the block table of its sequence.
  struct Row {
    int32_t token;
    int64_t position;
    std::span<const model::BlockId> blocks;
  };

  void check_contiguous() const;   // an rf::Error where the cache is paged
  void check_every_layer() const;  // an rf::Error where only the first layers run here (no logits)
  // The sequence of a single-sequence call, after its checks, with the cache truncated to `position`.
  model::BatchSequence continue_at(std::span<const int32_t> tokens, int64_t position, Logits which);
  // The logits `batch` asks for, in logits_, and the argmax of its Argmax sequences, in argmax_, from its passes.
  std::span<const float> logits_of(std::span<const model::BatchSequence> batch);
  // Runs a pass (at most max_batch tokens) through the layers; then writes the logits rows that its parts ask for
  // (Argmax parts' too) to `logits`, and returns their count.
  int64_t forward_batch(std::span<const model::BatchSequence> pass, float* logits);
  // The block's norm (RMSNorm or LayerNorm, as the architecture says) of `rows` rows of n_embd values.
  void normalize(float* out, const float* in, const model::LazyTensor& weight, const model::LazyTensor& bias,
                 int64_t rows) const;
  // out = input x weight (+ bias), for the rows that input_ holds.
  void project(const model::LazyTensor& weight, const model::LazyTensor& bias, float* out);
  // Queries, keys and values of xb_, rotated, into the cache; attention; the output projection into delta_.
  void attention_block(int64_t layer, int64_t n_tokens);
  void attention(int64_t layer, int64_t n_tokens);
  // The feed-forward network of xb_ into delta_.
  void ffn_block(const model::LayerPlan& layer, int64_t n_tokens);
  void reserve_batch(int64_t n_tokens);

  const model::ExecutionPlan& plan_;
  const model::ModelConfig& config_;
  int64_t max_batch_;
  int64_t layers_;
  int64_t kv_blocks_;
  ThreadPool pool_;
  KvCache cache_;
  // The rotary frequencies of full-context layers [0] and of sliding-window layers [1] (used where those rotate
  // apart: ModelConfig::sliding_layers_rotate_apart).
  std::vector<double> inverse_frequencies_[2];

  std::vector<model::BatchSequence> pass_;  // the parts of sequences in a pass

  // Activations of the batch, one row per token (llama2.c's RunState).
  int64_t batch_capacity_ = 0;
  std::vector<Row> rows_;        // the tokens [n]
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
  std::vector<int32_t> argmax_;  // of the last batch's Argmax sequences
  std::vector<float> hidden_;    // forward_hidden's result [n, n_embd]
  // The cache rows that token t attends to in a layer: ranges_[range_starts_[t]] up to ranges_[range_starts_[t + 1]].
  std::vector<RowRange> ranges_;
  std::vector<size_t> range_starts_;
  QuantizedRows input_;
};

}  // namespace rf::cpu
