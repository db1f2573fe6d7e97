#include "model/execution_plan.h"

#include <initializer_list>
#include <set>
#include <string>
#include <utility>

#include <fmt/ranges.h>

#include "util/error.h"

namespace rf::model {
namespace {

// Whether a plan binds one of architecture.h's optional weight groups.
enum class Presence { Absent, Optional, Required };

Presence presence(const Architecture& arch, uint32_t weights) {
  if (arch.needs & weights) return Presence::Required;
  return (arch.may & weights) ? Presence::Optional : Presence::Absent;
}

// Creates handles for the tensors a plan uses, checking each against the shape the configuration implies,
// and remembers which tensors it used so that leftovers (an unsupported variant) can be named.
class TensorBinder {
 public:
  TensorBinder(std::shared_ptr<const gguf::File> file, std::shared_ptr<Residency> residency,
               std::shared_ptr<LoadingCounters> counters)
      : file_(std::move(file)), residency_(std::move(residency)), counters_(std::move(counters)) {}

  bool has(const std::string& name) const { return file_->find_tensor(name) != nullptr; }

  // A vector of per-channel weights; norms, biases and frequency factors are kept as F32, as llama.cpp keeps
  // them. An Absent one is not bound (a file that has it anyway is rejected by reject_unused).
  LazyTensor vector(const std::string& name, int64_t size, Presence presence = Presence::Required) {
    if (!wanted(name, presence)) return {};
    const gguf::TensorInfo& info = checked(name, {size});
    if (info.type() != TensorType::F32)
      fail("{}: tensor '{}' has type {}, expected F32", file_->path(), name, tensor_type_name(info.type()));
    return handle(info);
  }

  // A matrix mapping `inputs` values to `outputs` values: ne = [inputs, outputs].
  LazyTensor matrix(const std::string& name, int64_t inputs, int64_t outputs, Presence presence = Presence::Required) {
    if (!wanted(name, presence)) return {};
    return handle(checked(name, {inputs, outputs}));
  }

  // The handles bound since the last call, in the order they were bound.
  std::vector<LazyTensor> take_bound() { return std::exchange(bound_, {}); }

  void reject_unused() const {
    for (const gguf::TensorInfo& info : file_->tensors())
      if (!used_.contains(std::string(info.name)))
        fail("{}: tensor '{}' is not part of the {} architecture as supported (an unsupported variant?)", file_->path(),
             info.name, file_->architecture());
  }

 private:
  bool wanted(const std::string& name, Presence presence) const {
    if (presence == Presence::Required && !has(name))
      fail("{}: tensor '{}' is missing (the {} architecture needs it)", file_->path(), name, file_->architecture());
    return presence == Presence::Required || (presence == Presence::Optional && has(name));
  }

  const gguf::TensorInfo& checked(const std::string& name, std::initializer_list<int64_t> dims) {
    const gguf::TensorInfo& info = file_->tensor(name);
    const std::vector<uint64_t> shape(dims.begin(), dims.end());
    if (info.shape() != shape)
      fail("{}: tensor '{}' has shape {}, expected {}", file_->path(), name, info.shape(), shape);
    used_.insert(name);
    return info;
  }

  LazyTensor handle(const gguf::TensorInfo& info) {
    return bound_.emplace_back(file_, info, residency_, counters_);
  }

  std::shared_ptr<const gguf::File> file_;
  std::shared_ptr<Residency> residency_;
  std::shared_ptr<LoadingCounters> counters_;
  std::set<std::string> used_;
  std::vector<LazyTensor> bound_;
};

// Slices `count` rows (or elements) at `first` of a fused tensor; an empty handle stays empty.
LazyTensor slice(const LazyTensor& fused, int64_t first, int64_t count) {
  return fused ? fused.slice(first, count) : LazyTensor{};
}

LayerPlan bind_layer(TensorBinder& bind, const ModelConfig& c, int64_t index) {
  const Architecture& arch = *c.arch;
  const std::string blk = fmt::format("blk.{}.", index);
  const auto name = [&](std::string_view tensor) { return blk + std::string(tensor); };
  const Presence norm_bias = presence(arch, kNormBias);
  LayerPlan layer;
  layer.attn_norm = bind.vector(name("attn_norm.weight"), c.n_embd);
  layer.attn_norm_bias = bind.vector(name("attn_norm.bias"), c.n_embd, norm_bias);

  const Presence qkv_bias = presence(arch, kQkvBias);
  if (bind.has(name("attn_qkv.weight"))) {
    const int64_t rows = c.q_dim() + 2 * c.kv_dim();
    const LazyTensor qkv = bind.matrix(name("attn_qkv.weight"), c.n_embd, rows);
    const LazyTensor bias = bind.vector(name("attn_qkv.bias"), rows, qkv_bias);
    const int64_t starts[] = {0, c.q_dim(), c.q_dim() + c.kv_dim()};
    const int64_t sizes[] = {c.q_dim(), c.kv_dim(), c.kv_dim()};
    LazyTensor* weights[] = {&layer.attn_q, &layer.attn_k, &layer.attn_v};
    LazyTensor* biases[] = {&layer.attn_q_bias, &layer.attn_k_bias, &layer.attn_v_bias};
    for (int i = 0; i < 3; ++i) {
      *weights[i] = qkv.slice(starts[i], sizes[i]);
      *biases[i] = slice(bias, starts[i], sizes[i]);
    }
  } else {
    layer.attn_q = bind.matrix(name("attn_q.weight"), c.n_embd, c.q_dim());
    layer.attn_q_bias = bind.vector(name("attn_q.bias"), c.q_dim(), qkv_bias);
    layer.attn_k = bind.matrix(name("attn_k.weight"), c.n_embd, c.kv_dim());
    layer.attn_k_bias = bind.vector(name("attn_k.bias"), c.kv_dim(), qkv_bias);
    layer.attn_v = bind.matrix(name("attn_v.weight"), c.n_embd, c.kv_dim());
    layer.attn_v_bias = bind.vector(name("attn_v.bias"), c.kv_dim(), qkv_bias);
  }
  layer.attn_q_norm = bind.vector(name("attn_q_norm.weight"), c.head_dim, presence(arch, kQkNorm));
  layer.attn_k_norm = bind.vector(name("attn_k_norm.weight"), c.head_dim, presence(arch, kQkNorm));
  layer.attn_output = bind.matrix(name("attn_output.weight"), c.q_dim(), c.n_embd);
  layer.attn_output_bias = bind.vector(name("attn_output.bias"), c.n_embd, presence(arch, kOutputBias));
  layer.attn_post_norm = bind.vector(name("post_attention_norm.weight"), c.n_embd, presence(arch, kPostNorms));

  if (!arch.parallel_blocks) {
    layer.ffn_norm = bind.vector(name("ffn_norm.weight"), c.n_embd);
    layer.ffn_norm_bias = bind.vector(name("ffn_norm.bias"), c.n_embd, norm_bias);
  }
  const Presence ffn_bias = presence(arch, kFfnBias);
  if (arch.ffn == FfnKind::Gelu) {
    layer.ffn_up = bind.matrix(name("ffn_up.weight"), c.n_embd, c.n_ff);
    layer.ffn_up_bias = bind.vector(name("ffn_up.bias"), c.n_ff, ffn_bias);
  } else if (bind.has(name("ffn_gate.weight"))) {
    layer.ffn_gate = bind.matrix(name("ffn_gate.weight"), c.n_embd, c.n_ff);
    layer.ffn_gate_bias = bind.vector(name("ffn_gate.bias"), c.n_ff, ffn_bias);
    layer.ffn_up = bind.matrix(name("ffn_up.weight"), c.n_embd, c.n_ff);
    layer.ffn_up_bias = bind.vector(name("ffn_up.bias"), c.n_ff, ffn_bias);
  } else {
    // Gate and up in one tensor, the gate's rows first (Phi-3, GLM).
    const LazyTensor gate_up = bind.matrix(name("ffn_up.weight"), c.n_embd, 2 * c.n_ff);
    const LazyTensor bias = bind.vector(name("ffn_up.bias"), 2 * c.n_ff, ffn_bias);
    layer.ffn_gate = gate_up.slice(0, c.n_ff);
    layer.ffn_gate_bias = slice(bias, 0, c.n_ff);
    layer.ffn_up = gate_up.slice(c.n_ff, c.n_ff);
    layer.ffn_up_bias = slice(bias, c.n_ff, c.n_ff);
  }
  layer.ffn_down = bind.matrix(name("ffn_down.weight"), c.n_ff, c.n_embd);
  layer.ffn_down_bias = bind.vector(name("ffn_down.bias"), c.n_embd, ffn_bias);
  layer.ffn_post_norm = bind.vector(name("post_ffw_norm.weight"), c.n_embd, presence(arch, kPostNorms));
  layer.stored = bind.take_bound();
  return layer;
}

}  // namespace

ExecutionPlan ExecutionPlan::build(std::shared_ptr<const gguf::File> file, std::shared_ptr<Residency> residency) {
  ExecutionPlan plan;
  plan.config_ = read_config(*file);
  plan.counters_ = std::make_shared<LoadingCounters>();
  plan.file_ = file;
  plan.residency_ = residency;
  const ModelConfig& c = plan.config_;
  const Architecture& arch = *c.arch;
  TensorBinder bind(std::move(file), std::move(residency), plan.counters_);

  plan.token_embd_ = bind.matrix("token_embd.weight", c.n_embd, c.vocab_size);
  plan.position_embd_ =
      bind.matrix("position_embd.weight", c.n_embd, c.context_length, presence(arch, kPositionEmbd));
  plan.layers_.reserve(static_cast<size_t>(c.n_layers));
  for (int64_t i = 0; i < c.n_layers; ++i) {
    bind.take_bound();
    plan.layers_.push_back(bind_layer(bind, c, i));
  }
  plan.output_norm_ = bind.vector("output_norm.weight", c.n_embd);
  plan.output_norm_bias_ = bind.vector("output_norm.bias", c.n_embd, presence(arch, kNormBias));
  plan.output_ = c.tied_embeddings ? plan.token_embd_ : bind.matrix("output.weight", c.n_embd, c.vocab_size);
  plan.output_bias_ = bind.vector("output.bias", c.vocab_size, presence(arch, kLogitsBias));
  if (c.rope_scaling == RopeScaling::Llama3) plan.rope_freqs_ = bind.vector("rope_freqs.weight", c.rope_dims / 2);
  bind.reject_unused();
  plan.residency_->bind(plan);
  return plan;
}

void ExecutionPlan::preload_layers(int64_t first, int64_t last) const {
  if (first < 0 || last >= config_.n_layers || first > last)
    fail("preload_layers({}, {}): the model has layers 0..{}", first, last, config_.n_layers - 1);
  for (int64_t i = first; i <= last; ++i)
    for (const LazyTensor* tensor : layer(i).tensors()) tensor->data();
}

std::vector<const LazyTensor*> ExecutionPlan::output_tensors() const {
  std::vector<const LazyTensor*> tensors;
  for (const LazyTensor* tensor : {&output_norm_, &output_norm_bias_, &output_, &output_bias_})
    if (*tensor) tensors.push_back(tensor);
  return tensors;
}

void ExecutionPlan::preload_all() const {
  token_embd_.data();
  if (position_embd_) position_embd_.data();
  if (rope_freqs_) rope_freqs_.data();
  preload_layers(0, config_.n_layers - 1);
  for (const LazyTensor* tensor : output_tensors()) tensor->data();
}

LoadingStats ExecutionPlan::loading_stats() const {
  LoadingStats stats = counters_->snapshot();
  residency_->report(stats);
  return stats;
}

bool ExecutionPlan::is_layer_loaded(int64_t index) const {
  for (const LazyTensor* tensor : layer(index).tensors())
    if (!tensor->is_loaded()) return false;
  return true;
}

}  // namespace rf::model
