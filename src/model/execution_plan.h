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

// One transformer block, as architecture.h describes it. Matrices are stored as GGUF stores them: one row per
// output, ne[0] = inputs. A weight the file does not have is an empty handle (a bias, a q/k norm, a post-norm,
// the gate of a plain GELU network); where the file fuses q, k and v (attn_qkv) or gate and up (ffn_up of
// 2 * n_ff rows), attn_q/k/v and ffn_gate/up are slices of the one stored tensor, so the forward pass is the
// same for both layouts.
struct LayerPlan {
  LazyTensor attn_norm, attn_norm_bias;  // [n_embd] F32
  LazyTensor attn_q, attn_q_bias;        // n_embd -> n_heads * head_dim
  LazyTensor attn_k, attn_k_bias;        // n_embd -> n_kv_heads * head_dim
  LazyTensor attn_v, attn_v_bias;        // n_embd -> n_kv_heads * head_dim
  LazyTensor attn_q_norm, attn_k_norm;   // [head_dim] F32: RMSNorm of each head before rotation
  LazyTensor attn_output, attn_output_bias;  // n_heads * head_dim -> n_embd
  LazyTensor attn_post_norm;                 // [n_embd] F32: RMSNorm of the attention's output
  LazyTensor ffn_norm, ffn_norm_bias;        // [n_embd] F32; empty where attention and FFN run in parallel
  LazyTensor ffn_gate, ffn_gate_bias;        // n_embd -> n_ff; empty for FfnKind::Gelu
  LazyTensor ffn_up, ffn_up_bias;            // n_embd -> n_ff
  LazyTensor ffn_down, ffn_down_bias;        // n_ff -> n_embd
  LazyTensor ffn_post_norm;                  // [n_embd] F32: RMSNorm of the feed-forward's output
  std::vector<LazyTensor> stored;            // the file's tensors this layer uses, each once, in execution order

  // The stored tensors, in the order the forward pass uses them (what a loader reads for this layer).
  std::vector<const LazyTensor*> tensors() const {
    std::vector<const LazyTensor*> list;
    for (const LazyTensor& tensor : stored) list.push_back(&tensor);
    return list;
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

  const LazyTensor& token_embd() const { return token_embd_; }        // [n_embd] x vocab rows
  const LazyTensor& position_embd() const { return position_embd_; }  // [n_embd] x context rows (Learned); or empty
  const std::vector<LayerPlan>& layers() const { return layers_; }
  const LayerPlan& layer(int64_t index) const { return layers_.at(static_cast<size_t>(index)); }
  const LazyTensor& output_norm() const { return output_norm_; }  // [n_embd] F32
  const LazyTensor& output_norm_bias() const { return output_norm_bias_; }
  const LazyTensor& output() const { return output_; }            // n_embd -> vocab; token_embd when tied
  const LazyTensor& output_bias() const { return output_bias_; }  // [vocab] F32, or empty
  const LazyTensor& rope_freqs() const { return rope_freqs_; }    // [rope_dims / 2] F32; empty unless Llama3
  // The output norm (and its bias), the output matrix (and its bias): those the file has, in execution order.
  std::vector<const LazyTensor*> output_tensors() const;

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
  LazyTensor position_embd_;
  std::vector<LayerPlan> layers_;
  LazyTensor output_norm_;
  LazyTensor output_norm_bias_;
  LazyTensor output_;
  LazyTensor output_bias_;
  LazyTensor rope_freqs_;
};

}  // namespace rf::model
