// What a forward pass runs, layer by layer: the model's configuration and a lazy handle for every weight in
// execution order. Building a plan checks every tensor's name, shape and type against the configuration but
// reads no tensor byte; each weight is materialized by the backend's Residency the first time it is used, or
// ahead of use by preload_layers() (a GPU backend's background loader streams layers in execution order).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "gguf/gguf.h"
#include "model/config.h"
#include "model/lazy_tensor.h"

namespace rf::model {

// One transformer block. Matrices are stored as GGUF stores them: one row per output, ne[0] = inputs.
struct LayerPlan {
  LazyTensor attn_norm;    // [n_embd] F32
  LazyTensor attn_q;       // n_embd -> n_heads * head_dim
  LazyTensor attn_k;       // n_embd -> n_kv_heads * head_dim
  LazyTensor attn_v;       // n_embd -> n_kv_heads * head_dim
  LazyTensor attn_output;  // n_heads * head_dim -> n_embd
  LazyTensor ffn_norm;     // [n_embd] F32
  LazyTensor ffn_gate;     // n_embd -> n_ff
  LazyTensor ffn_up;       // n_embd -> n_ff
  LazyTensor ffn_down;     // n_ff -> n_embd

  // In the order the forward pass uses them.
  std::vector<const LazyTensor*> tensors() const {
    return {&attn_norm, &attn_q, &attn_k, &attn_v, &attn_output, &ffn_norm, &ffn_gate, &ffn_up, &ffn_down};
  }
};

class ExecutionPlan {
 public:
  // Reads the configuration, checks every tensor against it (a missing, misshapen, mistyped or unknown
  // tensor is an rf::Error naming it) and creates the handles. Touches no tensor byte.
  static ExecutionPlan build(std::shared_ptr<const gguf::File> file, std::shared_ptr<Residency> residency);

  const ModelConfig& config() const { return config_; }
  const gguf::File& file() const { return *file_; }
  const std::shared_ptr<const gguf::File>& file_handle() const { return file_; }

  const LazyTensor& token_embd() const { return token_embd_; }  // [n_embd] x vocab rows
  const std::vector<LayerPlan>& layers() const { return layers_; }
  const LayerPlan& layer(int64_t index) const { return layers_.at(static_cast<size_t>(index)); }
  const LazyTensor& output_norm() const { return output_norm_; }  // [n_embd] F32
  const LazyTensor& output() const { return output_; }            // n_embd -> vocab; token_embd when tied
  const LazyTensor& rope_freqs() const { return rope_freqs_; }    // [rope_dims / 2] F32; empty unless Llama3

  // The residency the plan was built with.
  Residency& residency() const { return *residency_; }

  // Materializes layers first..last (inclusive) now, in execution order.
  void preload_layers(int64_t first, int64_t last) const;
  // Materializes every weight: embeddings, all layers, output.
  void preload_all() const;
  bool is_layer_loaded(int64_t layer) const;
  LoadingStats loading_stats() const;

 private:
  std::shared_ptr<const gguf::File> file_;
  ModelConfig config_;
  std::shared_ptr<Residency> residency_;
  std::shared_ptr<LoadingCounters> counters_;
  LazyTensor token_embd_;
  std::vector<LayerPlan> layers_;
  LazyTensor output_norm_;
  LazyTensor output_;
  LazyTensor rope_freqs_;
};

}  // namespace rf::model
