// The hyperparameters of a decoder-only transformer, read from a GGUF file's `<arch>.*` keys and checked
// against the tensors it holds. Today the architecture is `llama` (Llama 1/2/3, Mistral without sliding
// window, TinyLlama, SmolLM): pre-norm RMSNorm blocks, rotary positions, grouped-query attention, SwiGLU.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "gguf/gguf.h"

namespace rf::model {

// How rotary embedding pairs up the dimensions of a head.
enum class RopeStyle {
  Normal,  // adjacent pairs (x[2i], x[2i+1]); what llama.cpp uses for the llama architecture
  NeoX,    // halves (x[i], x[i + dims/2]); GPT-NeoX, Qwen, Phi, ...
};

// How rotary frequencies are stretched for contexts longer than the training context.
enum class RopeScaling {
  None,
  Linear,  // every angle divided by rope_scale_factor (llama.rope.scaling.type = linear)
  Llama3,  // per-frequency divisors precomputed into the tensor rope_freqs.weight
};

std::string_view rope_style_name(RopeStyle style);
std::string_view rope_scaling_name(RopeScaling scaling);

struct ModelConfig {
  std::string architecture;  // general.architecture
  int64_t n_embd = 0;        // width of the residual stream
  int64_t n_layers = 0;
  int64_t n_heads = 0;     // query heads
  int64_t n_kv_heads = 0;  // key/value heads; n_heads / n_kv_heads query heads share each (GQA)
  int64_t head_dim = 0;
  int64_t n_ff = 0;  // hidden width of the feed-forward network
  int64_t vocab_size = 0;
  int64_t context_length = 0;  // positions the model was trained for
  float rms_eps = 0.0f;
  float rope_base = 10000.0f;
  int64_t rope_dims = 0;  // leading dimensions of each head that rotate; the rest pass through
  RopeStyle rope_style = RopeStyle::Normal;
  RopeScaling rope_scaling = RopeScaling::None;
  float rope_scale_factor = 1.0f;  // the divisor of RopeScaling::Linear
  bool tied_embeddings = false;    // no output.weight: logits reuse token_embd.weight

  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  int64_t heads_per_kv_head() const { return n_heads / n_kv_heads; }
};

// Reads and checks the configuration. A missing or inconsistent key, an unsupported architecture or
// feature, or a file without tensors (vocabulary-only) is an rf::Error naming the file and the key.
// Tensor shapes are checked against the result when an ExecutionPlan is built.
ModelConfig read_config(const gguf::File& file);

}  // namespace rf::model
