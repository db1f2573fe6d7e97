#include "model/execution_plan.h"

#include <initializer_list>
#include <set>
#include <string>

#include <fmt/ranges.h>

#include "util/error.h"

namespace rf::model {
namespace {

// Creates handles for the tensors a plan uses, checking each against the shape the configuration implies,
// and remembers which tensors it used so that leftovers (an unsupported variant) can be named.
class TensorBinder {
 public:
  TensorBinder(std::shared_ptr<const gguf::File> file, std::shared_ptr<Residency> residency,
               std::shared_ptr<LoadingCounters> counters)
      : file_(std::move(file)), residency_(std::move(residency)), counters_(std::move(counters)) {}

  // A vector of per-channel weights; norms and frequency factors are kept as F32, as llama.cpp keeps them.
  LazyTensor vector(const std::string& name, int64_t size) {
    const gguf::TensorInfo& info = checked(name, {size});
    if (info.type() != TensorType::F32)
      fail("{}: tensor '{}' has type {}, expected F32", file_->path(), name, tensor_type_name(info.type()));
    return handle(info);
  }

  // A matrix mapping `inputs` values to `outputs` values: ne = [inputs, outputs].
  LazyTensor matrix(const std::string& name, int64_t inputs, int64_t outputs) {
    return handle(checked(name, {inputs, outputs}));
  }

  void reject_unused() const {
    for (const gguf::TensorInfo& info : file_->tensors())
      if (!used_.contains(std::string(info.name)))
        fail("{}: tensor '{}' is not part of the {} architecture as supported (an unsupported variant?)", file_->path(),
             info.name, file_->architecture());
  }

 private:
  const gguf::TensorInfo& checked(const std::string& name, std::initializer_list<int64_t> dims) {
    const gguf::TensorInfo& info = file_->tensor(name);
    const std::vector<uint64_t> shape(dims.begin(), dims.end());
    if (info.shape() != shape)
      fail("{}: tensor '{}' has shape {}, expected {}", file_->path(), name, info.shape(), shape);
    used_.insert(name);
    return info;
  }

  LazyTensor handle(const gguf::TensorInfo& info) { return LazyTensor(file_, info, residency_, counters_); }

  std::shared_ptr<const gguf::File> file_;
  std::shared_ptr<Residency> residency_;
  std::shared_ptr<LoadingCounters> counters_;
  std::set<std::string> used_;
};

}  // namespace

ExecutionPlan ExecutionPlan::build(std::shared_ptr<const gguf::File> file, std::shared_ptr<Residency> residency) {
  ExecutionPlan plan;
  plan.config_ = read_config(*file);
  plan.counters_ = std::make_shared<LoadingCounters>();
  plan.file_ = file;
  plan.residency_ = residency;
  const ModelConfig& c = plan.config_;
  TensorBinder bind(std::move(file), std::move(residency), plan.counters_);

  plan.token_embd_ = bind.matrix("token_embd.weight", c.n_embd, c.vocab_size);
  plan.layers_.resize(static_cast<size_t>(c.n_layers));
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string blk = fmt::format("blk.{}.", i);
    LayerPlan& layer = plan.layers_[static_cast<size_t>(i)];
    layer.attn_norm = bind.vector(blk + "attn_norm.weight", c.n_embd);
    layer.attn_q = bind.matrix(blk + "attn_q.weight", c.n_embd, c.q_dim());
    layer.attn_k = bind.matrix(blk + "attn_k.weight", c.n_embd, c.kv_dim());
    layer.attn_v = bind.matrix(blk + "attn_v.weight", c.n_embd, c.kv_dim());
    layer.attn_output = bind.matrix(blk + "attn_output.weight", c.q_dim(), c.n_embd);
    layer.ffn_norm = bind.vector(blk + "ffn_norm.weight", c.n_embd);
    layer.ffn_gate = bind.matrix(blk + "ffn_gate.weight", c.n_embd, c.n_ff);
    layer.ffn_up = bind.matrix(blk + "ffn_up.weight", c.n_embd, c.n_ff);
    layer.ffn_down = bind.matrix(blk + "ffn_down.weight", c.n_ff, c.n_embd);
  }
  plan.output_norm_ = bind.vector("output_norm.weight", c.n_embd);
  plan.output_ = c.tied_embeddings ? plan.token_embd_ : bind.matrix("output.weight", c.n_embd, c.vocab_size);
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

void ExecutionPlan::preload_all() const {
  token_embd_.data();
  if (rope_freqs_) rope_freqs_.data();
  preload_layers(0, config_.n_layers - 1);
  output_norm_.data();
  output_.data();
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
