// The hyperparameters of a decoder-only transformer, read from a GGUF file's `<arch>.*` keys for one of the
// families of architecture.h and checked against the tensors it holds.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf.h"
#include "model/architecture.h"

namespace rf::model {

// How rotary frequencies are stretched for contexts longer than the training context.
enum class RopeScaling {
  None,
  Linear,  // every angle divided by rope_scale_factor (rope.scaling.type = linear)
  Llama3,  // per-frequency divisors precomputed into the tensor rope_freqs.weight
};

std::string_view rope_style_name(RopeStyle style);
std::string_view rope_scaling_name(RopeScaling scaling);

struct ModelConfig {
  std::string architecture;            // general.architecture
  const Architecture* arch = nullptr;  // its entry in architectures(): how a block is built
  int64_t n_embd = 0;                  // width of the residual stream
  int64_t n_layers = 0;
  int64_t n_heads = 0;     // query heads
  int64_t n_kv_heads = 0;  // key/value heads; n_heads / n_kv_heads query heads share each (GQA)
  int64_t head_dim = 0;
  int64_t n_ff = 0;  // hidden width of the feed-forward network
  int64_t vocab_size = 0;
  int64_t context_length = 0;  // positions the model was trained for
  float norm_eps = 0.0f;       // of every RMSNorm or LayerNorm
  float rope_base = 10000.0f;
  float rope_base_sliding = 10000.0f;  // of sliding-window layers (rope.freq_base_swa; else rope_base)
  int64_t rope_dims = 0;               // leading dimensions of each head that rotate; the rest pass through (0: none)
  RopeStyle rope_style = RopeStyle::Normal;
  RopeScaling rope_scaling = RopeScaling::None;  // of the layers that attend to the whole context
  float rope_scale_factor = 1.0f;                // the divisor of RopeScaling::Linear
  float attention_scale = 0.0f;                  // multiplies q . k before the softmax
  float attention_cap = 0.0f;                    // scores become cap * tanh(score / cap); 0: not capped
  float logits_cap = 0.0f;                       // the same for the final logits
  float embedding_scale = 1.0f;                  // multiplies each token's embedding row
  int64_t sliding_window = 0;   // positions a sliding-window layer's query sees, itself included; 0: none
  int64_t sliding_pattern = 0;  // layer l slides when l % pattern < pattern - 1 (0: every layer)
  bool tied_embeddings = false;  // no output.weight: logits reuse token_embd.weight

  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  int64_t heads_per_kv_head() const { return n_heads / n_kv_heads; }
  bool rotary() const { return rope_dims > 0; }
  // Whether layer l attends to the last sliding_window positions only.
  bool sliding(int64_t layer) const {
    return sliding_window > 0 && (sliding_pattern == 0 || layer % sliding_pattern < sliding_pattern - 1);
  }
  // Whether sliding-window layers rotate with frequencies of their own (their base differs, or full-context
  // layers scale theirs), so that a backend keeps a second table of angles for them.
  bool sliding_layers_rotate_apart() const {
    return sliding_window > 0 && (rope_base_sliding != rope_base || rope_scaling != RopeScaling::None);
  }
  // The rotation speed of each dimension pair of a sliding or a full-context layer: base^(-2i / rope_dims),
  // divided by the linear scale factor or by rope_freqs.weight[i] (`freq_factors`, Llama 3) where the
  // configuration asks for it (full-context layers only). In double: at position 100000 a float frequency
  // would already be off by milliradians.
  std::vector<double> rope_inverse_frequencies(bool sliding_layer, const float* freq_factors) const;
};

// Reads and checks the configuration. A missing or inconsistent key, an unsupported architecture or
// feature, or a file without tensors (vocabulary-only) is an rf::Error naming the file and the key.
// Tensor shapes are checked against the result when an ExecutionPlan is built.
ModelConfig read_config(const gguf::File& file);

}  // namespace rf::model
