// The transformer families ROCmForge runs, one table entry per GGUF `general.architecture`: how a block is
// built (norms, attention inputs, positions, feed-forward) and which optional weights the family needs or may
// have. Tensor names are llama.cpp's and the same for every family (blk.N.attn_q.weight, ...); what differs
// is which of them a family has. Both backends read the block from this description; adding a family means
// adding an entry here (docs/ARCHITECTURE.md, "Adding an architecture").
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace rf::model {

enum class NormKind {
  Rms,    // x / sqrt(mean(x^2) + eps) * weight
  Layer,  // (x - mean) / sqrt(var + eps) * weight + bias
};

// How a token's position reaches attention.
enum class Positions {
  Rotary,   // queries and keys rotated by position (RoPE)
  Learned,  // a learned vector per position added to the token embedding (position_embd.weight; GPT-2)
};

// How rotary embedding pairs up the dimensions of a head.
enum class RopeStyle {
  Normal,  // adjacent pairs (x[2i], x[2i+1]): llama, GLM
  NeoX,    // halves (x[i], x[i + rope_dims/2]): Qwen, Phi, Gemma
};

enum class FfnKind {
  SiluGated,  // down(silu(gate(x)) * up(x)): SwiGLU
  GeluGated,  // down(gelu(gate(x)) * up(x)): GeGLU (Gemma)
  Gelu,       // down(gelu(up(x))): GPT-2, Phi-2
};

// Groups of optional weights (a bit set). A family lists those it needs and those it may have; the plan binds
// what the file holds and names a needed one that is missing.
enum Weights : uint32_t {
  kQkvBias = 1u << 0,       // attn_q/k/v.bias or attn_qkv.bias
  kOutputBias = 1u << 1,    // attn_output.bias
  kFfnBias = 1u << 2,       // ffn_up.bias, ffn_down.bias (and ffn_gate.bias where there is a gate)
  kNormBias = 1u << 3,      // attn_norm.bias, ffn_norm.bias, output_norm.bias (LayerNorm)
  kQkNorm = 1u << 4,        // attn_q_norm.weight, attn_k_norm.weight: per-head RMSNorm before rotation
  kPostNorms = 1u << 5,     // post_attention_norm.weight, post_ffw_norm.weight: norms of a block's outputs
  kLogitsBias = 1u << 6,    // output.bias
  kPositionEmbd = 1u << 7,  // position_embd.weight (Positions::Learned)
};

struct Architecture {
  std::string_view name;  // general.architecture, and the prefix of its hyperparameter keys
  NormKind norm = NormKind::Rms;
  Positions positions = Positions::Rotary;
  RopeStyle rope_style = RopeStyle::Normal;
  FfnKind ffn = FfnKind::SiluGated;
  bool parallel_blocks = false;   // attention and feed-forward both read the one attn_norm output (Phi-2)
  bool scale_embeddings = false;  // token embeddings times sqrt(n_embd) (Gemma)
  // Soft-capping of attention scores and final logits (cap * tanh(x / cap)), with llama.cpp's defaults where
  // the file has no attn_logit_softcapping / final_logit_softcapping key (Gemma 2); 0: none.
  float default_attention_cap = 0.0f;
  float default_logits_cap = 0.0f;
  // Sliding-window layers: layer l is one when l % pattern < pattern - 1 (attention.sliding_window_pattern
  // overrides this default; 0: never), attending to attention.sliding_window positions, or to llama.cpp's default
  // window where the file has no such key (Gemma 2: 4096; 0: the key is required).
  int64_t default_sliding_pattern = 0;
  int64_t default_sliding_window = 0;
  uint32_t needs = 0;  // Weights the family must have
  uint32_t may = 0;    // Weights it may have besides
};

// The supported families, in the order README.md lists them.
std::span<const Architecture> architectures();
// The entry for `name`, or nullptr.
const Architecture* find_architecture(std::string_view name);
// "llama, qwen2, ...", for error messages.
std::string supported_architecture_names();

}  // namespace rf::model
