#include "backend/cpu/transformer.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/ops.h"
#include "quant/quant.h"
#include "util/error.h"

namespace rf::cpu {
namespace {

size_t index(int64_t i) { return static_cast<size_t>(i); }

const float* f32_data(const model::LazyTensor& tensor) { return static_cast<const float*>(tensor.data()); }

}  // namespace

Transformer::Transformer(const model::ExecutionPlan& plan, const TransformerOptions& options)
    : plan_(plan),
      config_(plan.config()),
      max_batch_(options.max_batch),
      layers_(options.layers > 0 ? options.layers : config_.n_layers),
      pool_(options.threads),
      cache_(config_, options.context > 0 ? options.context : config_.context_length, options.kv_type) {
  if (max_batch_ <= 0) fail("max_batch must be positive, got {}", max_batch_);
  if (layers_ > config_.n_layers) fail("the model has {} layers, not {}", config_.n_layers, layers_);
  const float* freq_factors = plan.rope_freqs() ? f32_data(plan.rope_freqs()) : nullptr;
  rope_inverse_frequencies_ = rope_inverse_frequencies(config_, freq_factors);
  scores_.resize(index(pool_.size() * cache_.capacity()));
}

void Transformer::reserve_batch(int64_t n) {
  if (n <= batch_capacity_) return;
  batch_capacity_ = n;
  const auto rows_of = [n](int64_t width) { return index(n * width); };
  x_.resize(rows_of(config_.n_embd));
  xb_.resize(rows_of(config_.n_embd));
  q_.resize(rows_of(config_.q_dim()));
  k_.resize(rows_of(config_.kv_dim()));
  v_.resize(rows_of(config_.kv_dim()));
  attn_out_.resize(rows_of(config_.q_dim()));
  hb_.resize(rows_of(config_.n_ff));
  hb2_.resize(rows_of(config_.n_ff));
  delta_.resize(rows_of(config_.n_embd));
  rope_.resize(rows_of(config_.rope_dims));
}

template <typename Batch>
void Transformer::run(std::span<const int32_t> tokens, int64_t position, const Batch& batch) {
  const auto n = static_cast<int64_t>(tokens.size());
  if (n == 0) fail("forward: no tokens to evaluate");
  if (position < 0 || position > cache_.size())
    fail("forward: position {} is not within the {} cached positions", position, cache_.size());
  if (position + n > cache_.capacity())
    fail("{} tokens at position {} do not fit in the context of {} positions", n, position, cache_.capacity());
  for (const int32_t token : tokens)
    if (token < 0 || token >= config_.vocab_size)
      fail("token id {} is out of range: the vocabulary has {} tokens", token, config_.vocab_size);

  cache_.truncate(position);
  for (int64_t start = 0; start < n; start += max_batch_) batch(start, std::min(max_batch_, n - start));
}

std::span<const float> Transformer::forward(std::span<const int32_t> tokens, int64_t position, Logits which) {
  if (layers_ < config_.n_layers)
    fail("this transformer runs {} of the model's {} layers: forward_hidden() gives their output", layers_,
         config_.n_layers);
  const int64_t vocab = config_.vocab_size;
  const auto n = static_cast<int64_t>(tokens.size());
  logits_.resize(index((which == Logits::All ? n : 1) * vocab));
  run(tokens, position, [&](int64_t start, int64_t count) {
    const bool last_batch = start + count == n;
    float* logits = which == Logits::All ? &logits_[index(start * vocab)] : last_batch ? logits_.data() : nullptr;
    forward_batch(tokens.subspan(index(start), index(count)), position + start, which, logits);
  });
  return logits_;
}

std::span<const float> Transformer::forward_hidden(std::span<const int32_t> tokens, int64_t position) {
  const int64_t width = config_.n_embd;
  hidden_.resize(tokens.size() * index(width));
  run(tokens, position, [&](int64_t start, int64_t count) {
    forward_batch(tokens.subspan(index(start), index(count)), position + start, Logits::Last, nullptr);
    std::copy_n(x_.begin(), index(count * width), hidden_.begin() + start * width);
  });
  return hidden_;
}

void Transformer::forward_batch(std::span<const int32_t> tokens, int64_t position, Logits which, float* logits) {
  const model::ModelConfig& c = config_;
  const auto n = static_cast<int64_t>(tokens.size());
  reserve_batch(n);
  const auto rmsnorm_rows = [&](float* out, const float* in, const model::LazyTensor& weight, int64_t rows) {
    const float* w = f32_data(weight);
    for (int64_t t = 0; t < rows; ++t) rmsnorm(out + t * c.n_embd, in + t * c.n_embd, w, c.n_embd, c.rms_eps);
  };

  // Each token's embedding row, and the rotation angles of its position.
  const model::LazyTensor& embeddings = plan_.token_embd();
  const auto* table = static_cast<const uint8_t*>(embeddings.data());
  for (int64_t t = 0; t < n; ++t) {
    const uint8_t* row = table + index(tokens[index(t)]) * embeddings.row_bytes();
    quant::dequantize(embeddings.type(), row, &x_[index(t * c.n_embd)], c.n_embd);
    rope_angles(&rope_[index(t * c.rope_dims)], position + t, rope_inverse_frequencies_);
  }

  for (int64_t l = 0; l < layers_; ++l) {
    const model::LayerPlan& layer = plan_.layer(l);

    // Attention: project the normalized stream to queries, keys and values, rotate queries and keys by
    // position, cache keys and values, attend, project back and add to the residual stream.
    rmsnorm_rows(xb_.data(), x_.data(), layer.attn_norm, n);
    input_.set(xb_.data(), n, c.n_embd);
    const Product qkv[] = {{matrix_of(layer.attn_q), q_.data()},
                           {matrix_of(layer.attn_k), k_.data()},
                           {matrix_of(layer.attn_v), v_.data()}};
    matmul(pool_, qkv, input_);
    for (int64_t t = 0; t < n; ++t) {
      const float* cos_sin = &rope_[index(t * c.rope_dims)];
      float* k = &k_[index(t * c.kv_dim())];
      rope(&q_[index(t * c.q_dim())], c.n_heads, c.head_dim, cos_sin, c.rope_dims / 2, c.rope_style);
      rope(k, c.n_kv_heads, c.head_dim, cos_sin, c.rope_dims / 2, c.rope_style);
      cache_.store(l, position + t, k, &v_[index(t * c.kv_dim())]);
    }
    attention(l, n, position);
    input_.set(attn_out_.data(), n, c.q_dim());
    matmul(pool_, matrix_of(layer.attn_output), input_, delta_.data());
    add(x_.data(), delta_.data(), n * c.n_embd);

    // Feed-forward: down(silu(gate(x)) * up(x)) of the normalized stream, added to the residual stream.
    rmsnorm_rows(xb_.data(), x_.data(), layer.ffn_norm, n);
    input_.set(xb_.data(), n, c.n_embd);
    const Product gate_up[] = {{matrix_of(layer.ffn_gate), hb_.data()}, {matrix_of(layer.ffn_up), hb2_.data()}};
    matmul(pool_, gate_up, input_);
    swiglu(hb_.data(), hb2_.data(), n * c.n_ff);
    input_.set(hb_.data(), n, c.n_ff);
    matmul(pool_, matrix_of(layer.ffn_down), input_, delta_.data());
    add(x_.data(), delta_.data(), n * c.n_embd);
  }
  cache_.mark_filled(position + n);
  if (!logits) return;

  // The final norm and the projection to the vocabulary, for the rows whose logits are wanted.
  const int64_t first = which == Logits::All ? 0 : n - 1;
  rmsnorm_rows(xb_.data(), &x_[index(first * c.n_embd)], plan_.output_norm(), n - first);
  input_.set(xb_.data(), n - first, c.n_embd);
  matmul(pool_, matrix_of(plan_.output()), input_, logits);
}

void Transformer::attention(int64_t layer, int64_t n, int64_t position) {
  const model::ModelConfig& c = config_;
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  // One item per (token, query head); token t sees the cached positions 0 .. position + t (causal).
  const auto attend_all = [&](auto kv_element) {
    using KvElement = decltype(kv_element);
    const KvElement* keys = cache_.keys<KvElement>(layer);
    const KvElement* values = cache_.values<KvElement>(layer);
    pool_.parallel_for(n * c.n_heads, 1, [&](int64_t begin, int64_t end, int thread) {
      float* scores = &scores_[index(thread * cache_.capacity())];
      for (int64_t item = begin; item < end; ++item) {
        const int64_t t = item / c.n_heads;
        const int64_t head = item % c.n_heads;
        const int64_t kv_offset = head / c.heads_per_kv_head() * c.head_dim;
        const int64_t offset = t * c.q_dim() + head * c.head_dim;
        attend(&attn_out_[index(offset)], &q_[index(offset)], keys + kv_offset, values + kv_offset, position + t + 1,
               c.kv_dim(), c.head_dim, scale, scores);
      }
    });
  };
  if (cache_.type() == TensorType::F16)
    attend_all(uint16_t{});
  else
    attend_all(float{});
}

}  // namespace rf::cpu
