#include "model/config.h"

#include <cmath>
#include <string>

#include "util/error.h"

namespace rf::model {
namespace {

// Reads `<architecture>.<name>` keys, naming the full key and the file in every error.
class ArchKeys {
 public:
  ArchKeys(const gguf::File& file, std::string_view architecture)
      : file_(file), prefix_(std::string(architecture) + ".") {}

  std::string key(std::string_view name) const { return prefix_ + std::string(name); }
  bool has(std::string_view name) const { return file_.has(key(name)); }

  int64_t count(std::string_view name) const { return positive(name, file_.get_int(key(name))); }
  int64_t count_or(std::string_view name, int64_t fallback) const { return has(name) ? count(name) : fallback; }

  double number(std::string_view name) const {
    const gguf::Value& value = file_.get_value(key(name));
    try {
      return value.to_double();
    } catch (const Error& e) {
      fail("{}: key '{}': {}", file_.path(), key(name), e.what());
    }
  }
  double number_or(std::string_view name, double fallback) const { return has(name) ? number(name) : fallback; }

  std::string_view string_or(std::string_view name, std::string_view fallback) const {
    return has(name) ? file_.get<std::string_view>(key(name)) : fallback;
  }

  [[noreturn]] void reject(std::string_view name, const std::string& why) const {
    fail("{}: key '{}' {}", file_.path(), key(name), why);
  }

 private:
  int64_t positive(std::string_view name, int64_t value) const {
    if (value <= 0) reject(name, "is " + std::to_string(value) + ", must be positive");
    return value;
  }

  const gguf::File& file_;
  std::string prefix_;
};

int64_t read_vocab_size(const gguf::File& file, const ArchKeys& keys) {
  if (keys.has("vocab_size")) return keys.count("vocab_size");
  if (const gguf::Value* tokens = file.find("tokenizer.ggml.tokens"); tokens && tokens->is_array())
    return static_cast<int64_t>(tokens->size());
  return static_cast<int64_t>(file.tensor("token_embd.weight").ne[1]);
}

void read_rope_scaling(const gguf::File& file, const ArchKeys& keys, ModelConfig& config) {
  const std::string_view type = keys.string_or("rope.scaling.type", "linear");
  if (type != "linear" && type != "none")
    keys.reject("rope.scaling.type", "is '" + std::string(type) + "'; only none and linear are supported");
  // llama.cpp reads the factor whatever the type says; older files call it rope.scale_linear.
  const char* factor_key = keys.has("rope.scaling.factor") ? "rope.scaling.factor" : "rope.scale_linear";
  const double factor = keys.number_or(factor_key, 0.0);
  if (factor < 0.0) keys.reject(factor_key, "is negative");
  const bool linear = factor != 0.0 && factor != 1.0;
  const bool llama3 = file.find_tensor("rope_freqs.weight") != nullptr;
  if (linear && llama3)
    keys.reject(factor_key, "asks for linear rope scaling on top of rope_freqs.weight, which is not supported");
  if (linear) {
    config.rope_scaling = RopeScaling::Linear;
    config.rope_scale_factor = static_cast<float>(factor);
  } else if (llama3) {
    config.rope_scaling = RopeScaling::Llama3;
  }
}

}  // namespace

std::string_view rope_style_name(RopeStyle style) { return style == RopeStyle::Normal ? "normal" : "neox"; }

std::string_view rope_scaling_name(RopeScaling scaling) {
  switch (scaling) {
    case RopeScaling::None: return "none";
    case RopeScaling::Linear: return "linear";
    case RopeScaling::Llama3: return "llama3";
  }
  return "?";
}

std::vector<double> ModelConfig::rope_inverse_frequencies(bool sliding_layer, const float* freq_factors) const {
  std::vector<double> inverse(static_cast<size_t>(rope_dims / 2));
  const double base = sliding_layer ? rope_base_sliding : rope_base;
  for (size_t i = 0; i < inverse.size(); ++i) {
    double frequency = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(rope_dims));
    if (!sliding_layer && rope_scaling == RopeScaling::Linear) frequency /= rope_scale_factor;
    if (!sliding_layer && rope_scaling == RopeScaling::Llama3) frequency /= freq_factors[i];
    inverse[i] = frequency;
  }
  return inverse;
}

ModelConfig read_config(const gguf::File& file) {
  ModelConfig config;
  config.architecture = std::string(file.architecture());
  if (config.architecture.empty()) fail("{}: key 'general.architecture' is missing", file.path());
  config.arch = find_architecture(config.architecture);
  if (!config.arch)
    fail("{}: architecture '{}' is not supported (supported: {})", file.path(), config.architecture,
         supported_architecture_names());
  if (file.tensors().empty())
    fail("{}: the file holds no tensors (a vocabulary-only GGUF has no weights to run)", file.path());
  const Architecture& arch = *config.arch;

  const ArchKeys keys(file, config.architecture);
  if (keys.has("expert_count") && file.get_int(keys.key("expert_count")) > 0)
    keys.reject("expert_count", "is set: mixture-of-experts models are not supported");

  config.n_embd = keys.count("embedding_length");
  config.n_layers = keys.count("block_count");
  config.n_ff = keys.count("feed_forward_length");
  config.context_length = keys.count("context_length");
  config.n_heads = keys.count("attention.head_count");
  config.n_kv_heads = keys.count_or("attention.head_count_kv", config.n_heads);
  if (config.n_heads % config.n_kv_heads != 0)
    keys.reject("attention.head_count_kv",
                fmt::format("is {}, which does not divide head_count {}", config.n_kv_heads, config.n_heads));

  if (!keys.has("attention.key_length") && config.n_embd % config.n_heads != 0)
    keys.reject("attention.head_count",
                fmt::format("is {}, which does not divide embedding_length {}", config.n_heads, config.n_embd));
  config.head_dim = keys.count_or("attention.key_length", config.n_embd / config.n_heads);
  if (keys.count_or("attention.value_length", config.head_dim) != config.head_dim)
    keys.reject("attention.value_length", "differs from attention.key_length, which is not supported");

  const char* eps_key =
      arch.norm == NormKind::Rms ? "attention.layer_norm_rms_epsilon" : "attention.layer_norm_epsilon";
  config.norm_eps = static_cast<float>(keys.number(eps_key));
  if (!(config.norm_eps > 0.0f)) keys.reject(eps_key, "must be positive");

  if (arch.positions == Positions::Rotary) {
    config.rope_style = arch.rope_style;
    config.rope_base = static_cast<float>(keys.number_or("rope.freq_base", 10000.0));
    if (!(config.rope_base > 0.0f)) keys.reject("rope.freq_base", "must be positive");
    config.rope_base_sliding = static_cast<float>(keys.number_or("rope.freq_base_swa", config.rope_base));
    if (!(config.rope_base_sliding > 0.0f)) keys.reject("rope.freq_base_swa", "must be positive");
    config.rope_dims = keys.count_or("rope.dimension_count", config.head_dim);
    if (config.rope_dims > config.head_dim || config.rope_dims % 2 != 0)
      keys.reject("rope.dimension_count", fmt::format("is {}; it must be even and at most the head size {}",
                                                      config.rope_dims, config.head_dim));
    read_rope_scaling(file, keys, config);
  }

  // Gemma 2 and 3 scale queries by the head size, except the 27B models (46 and 62 layers), which use
  // n_embd / n_heads (google/gemma_pytorch's query_pre_attn_scalar), as llama.cpp does.
  const bool gemma_27b =
      (arch.name == "gemma2" && config.n_layers == 46) || (arch.name == "gemma3" && config.n_layers == 62);
  config.attention_scale =
      1.0f / std::sqrt(static_cast<float>(gemma_27b ? config.n_embd / config.n_heads : config.head_dim));
  // llama.cpp soft-caps Gemma 2 only, whatever keys other files hold.
  if (arch.default_attention_cap > 0.0f) {
    config.attention_cap = static_cast<float>(keys.number_or("attn_logit_softcapping", arch.default_attention_cap));
    config.logits_cap = static_cast<float>(keys.number_or("final_logit_softcapping", arch.default_logits_cap));
    if (!(config.attention_cap >= 0.0f)) keys.reject("attn_logit_softcapping", "must not be negative");
    if (!(config.logits_cap >= 0.0f)) keys.reject("final_logit_softcapping", "must not be negative");
  }
  if (arch.scale_embeddings) config.embedding_scale = std::sqrt(static_cast<float>(config.n_embd));

  if (arch.default_sliding_pattern > 0) {
    config.sliding_window = arch.default_sliding_window > 0
                                ? keys.count_or("attention.sliding_window", arch.default_sliding_window)
                                : keys.count("attention.sliding_window");
    config.sliding_pattern = keys.count_or("attention.sliding_window_pattern", arch.default_sliding_pattern);
  }

  config.vocab_size = read_vocab_size(file, keys);
  config.tied_embeddings = file.find_tensor("output.weight") == nullptr;
  return config;
}

}  // namespace rf::model
