#include "backend/cpu/transformer.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/ops.h"
#include "quant/quant.h"
#include "util/argmax.h"
#include "util/error.h"

namespace rf::cpu {
namespace {

size_t index(int64_t i) { return static_cast<size_t>(i); }
int64_t count(std::span<const int32_t> tokens) { return static_cast<int64_t>(tokens.size()); }

}  // namespace

Transformer::Transformer(const model::ExecutionPlan& plan, const TransformerOptions& options)
    : plan_(plan),
      config_(plan.config()),
      max_batch_(options.max_batch),
      layers_(options.layers > 0 ? options.layers : config_.n_layers),
      kv_blocks_(options.kv_blocks),
      pool_(options.threads),
      cache_(options.kv_blocks != 0 ? KvCache::paged(config_, options.kv_blocks, options.kv_type)
                                    : KvCache(config_, options.context > 0 ? options.context : config_.context_length,
                                              options.kv_type, options.max_batch)),
      input_(options.float_activations) {
  if (layers_ > config_.n_layers) fail("the model has {} layers, not {}", config_.n_layers, layers_);
  if (max_batch_ <= 0) fail("max_batch must be positive, got {}", max_batch_);
  const float* freq_factors = plan.rope_freqs().f32_values();
  for (const bool sliding : {false, true})
    inverse_frequencies_[sliding] = config_.rope_inverse_frequencies(sliding, freq_factors);
  scores_.resize(index(pool_.size() * cache_.capacity()));
}

void Transformer::reserve_batch(int64_t n) {
  if (n <= batch_capacity_) return;
  batch_capacity_ = n;
  rows_.resize(index(n));
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
  for (std::vector<float>& angles : rope_) angles.resize(rows_of(config_.rope_dims));
}

void Transformer::check_contiguous() const {
  if (kv_blocks_ > 0)
    fail("this forward pass keeps a paged KV cache of {} blocks: it takes batches of sequences", kv_blocks_);
}

void Transformer::check_every_layer() const {
  if (layers_ < config_.n_layers)
    fail("this transformer runs {} of the model's {} layers: forward_hidden() gives their output", layers_,
         config_.n_layers);
}

void Transformer::truncate(int64_t positions) {
  check_contiguous();
  cache_.truncate(positions);
}

model::BatchSequence Transformer::continue_at(std::span<const int32_t> tokens, int64_t position, Logits which) {
  check_contiguous();
  model::check_positions(config_, count(tokens), position, cache_.size(), cache_.capacity());
  model::check_tokens(config_, tokens);
  cache_.truncate(position);
  model::check_kept(position, cache_.size());
  return {tokens, position, cache_.contiguous_table(), which};
}

std::span<const float> Transformer::logits_of(std::span<const model::BatchSequence> batch) {
  const int64_t vocab = config_.vocab_size;
  int64_t rows = 0;
  for (const model::BatchSequence& sequence : batch) rows += model::computed_logits_rows(sequence);
  logits_.resize(index(rows * vocab));
  argmax_.clear();
  float* logits = logits_.data();  // past the rows returned so far
  model::for_each_pass(batch, max_batch_, pass_, [&](std::span<const model::BatchSequence> pass) {
    forward_batch(pass, logits);
    // An Argmax part's row leaves its index and gives its place to the rows after it.
    const float* row = logits;
    for (const model::BatchSequence& part : pass) {
      const size_t values = index(model::computed_logits_rows(part) * vocab);
      if (part.logits == Logits::Argmax) {
        argmax_.push_back(index_of_largest({row, values}));
      } else {
        if (logits != row) std::copy(row, row + values, logits);
        logits += values;
      }
      row += values;
    }
  });
  return {logits_.data(), static_cast<size_t>(logits - logits_.data())};
}

std::span<const float> Transformer::forward(std::span<const int32_t> tokens, int64_t position, Logits which) {
  model::check_single_sequence(which);
  check_every_layer();
  const model::BatchSequence sequence = continue_at(tokens, position, which);
  return logits_of({&sequence, 1});
}

std::span<const float> Transformer::forward(std::span<const model::BatchSequence> batch,
                                            std::span<const model::BlockCopy> copies) {
  if (kv_blocks_ == 0) return model::ForwardPass::forward(batch, copies);
  model::check_batch(config_, batch, copies, kv_blocks_);
  check_every_layer();
  // A table for more positions than the pool holds repeats blocks; attention's scratch holds the pool's positions.
  for (const model::BatchSequence& sequence : batch)
    if (sequence.position + count(sequence.tokens) > context())
      fail("{} tokens at position {} pass the {} positions of the KV cache's {} blocks", sequence.tokens.size(),
           sequence.position, context(), kv_blocks_);
  for (const model::BlockCopy& copy : copies) cache_.copy_block(copy.source, copy.destination);
  return logits_of(batch);
}

std::span<const float> Transformer::forward_hidden(std::span<const int32_t> tokens, int64_t position) {
  const int64_t width = config_.n_embd;
  const model::BatchSequence sequence = continue_at(tokens, position, Logits::None);
  hidden_.resize(tokens.size() * index(width));
  float* hidden = hidden_.data();
  model::for_each_pass({&sequence, 1}, max_batch_, pass_, [&](std::span<const model::BatchSequence> pass) {
    forward_batch(pass, nullptr);
    hidden = std::copy_n(x_.begin(), index(count(pass.front().tokens) * width), hidden);
  });
  return hidden_;
}

void Transformer::normalize(float* out, const float* in, const model::LazyTensor& weight,
                            const model::LazyTensor& bias, int64_t rows) const {
  const int64_t width = config_.n_embd;
  const float* w = weight.f32_values();
  for (int64_t t = 0; t < rows; ++t) {
    if (config_.arch->norm == model::NormKind::Rms)
      rmsnorm(out + t * width, in + t * width, w, width, config_.norm_eps);
    else
      layernorm(out + t * width, in + t * width, w, bias.f32_values(), width, config_.norm_eps);
  }
}

void Transformer::project(const model::LazyTensor& weight, const model::LazyTensor& bias, float* out) {
  matmul(pool_, matrix_of(weight), input_, out);
  if (bias) add_rows(out, bias.f32_values(), input_.rows(), weight.rows());
}

int64_t Transformer::forward_batch(std::span<const model::BatchSequence> pass, float* logits) {
  const model::ModelConfig& c = config_;
  int64_t n = 0;
  for (const model::BatchSequence& part : pass) n += count(part.tokens);
  reserve_batch(n);
  Row* next = rows_.data();
  for (const model::BatchSequence& part : pass)
    for (int64_t i = 0; i < count(part.tokens); ++i) *next++ = {part.tokens[index(i)], part.position + i, part.blocks};

  // Each token's embedding row (scaled, plus its position's learned row where the model says), and the
  // rotation angles of its position.
  const model::LazyTensor& embeddings = plan_.token_embd();
  const model::LazyTensor& positions = plan_.position_embd();
  const int tables = c.sliding_layers_rotate_apart() ? 2 : 1;
  for (int64_t t = 0; t < n; ++t) {
    const Row& row = rows_[index(t)];
    float* x = &x_[index(t * c.n_embd)];
    const auto* embedding = static_cast<const uint8_t*>(embeddings.data()) + index(row.token) * embeddings.row_bytes();
    quant::dequantize(embeddings.type(), embedding, x, c.n_embd);
    if (c.embedding_scale != 1.0f)
      for (int64_t i = 0; i < c.n_embd; ++i) x[i] *= c.embedding_scale;
    if (positions) {
      // The token's row of delta_, which the layers write later, holds its learned position meanwhile.
      float* learned = &delta_[index(t * c.n_embd)];
      const auto* stored = static_cast<const uint8_t*>(positions.data()) + index(row.position) * positions.row_bytes();
      quant::dequantize(positions.type(), stored, learned, c.n_embd);
      add(x, learned, c.n_embd);
    }
    if (c.rotary())
      for (int table = 0; table < tables; ++table)
        rope_angles(&rope_[table][index(t * c.rope_dims)], row.position, inverse_frequencies_[table]);
  }

  for (int64_t l = 0; l < layers_; ++l) {
    const model::LayerPlan& layer = plan_.layer(l);
    const auto add_block_output = [&](const model::LazyTensor& post_norm) {
      if (post_norm)
        for (int64_t t = 0; t < n; ++t) {
          float* row = &delta_[index(t * c.n_embd)];
          rmsnorm(row, row, post_norm.f32_values(), c.n_embd, c.norm_eps);
        }
      add(x_.data(), delta_.data(), n * c.n_embd);
    };

    // Attention of the normalized stream, added to the residual stream (normalized again after it, where it
    // is a post-norm model).
    normalize(xb_.data(), x_.data(), layer.attn_norm, layer.attn_norm_bias, n);
    attention_block(l, n);
    add_block_output(layer.attn_post_norm);

    // The feed-forward network of the stream normalized anew, or of the attention's input where the two run
    // in parallel (Phi-2: x + attention(norm(x)) + ffn(norm(x))).
    if (!c.arch->parallel_blocks) normalize(xb_.data(), x_.data(), layer.ffn_norm, layer.ffn_norm_bias, n);
    ffn_block(layer, n);
    add_block_output(layer.ffn_post_norm);
  }
  if (kv_blocks_ == 0) cache_.mark_filled(rows_[index(n - 1)].position + 1);

  // The final norm and the projection to the vocabulary, for the rows whose logits are wanted, gathered in xb_.
  int64_t wanted = 0;
  int64_t end = 0;  // of the part's rows
  for (const model::BatchSequence& part : pass) {
    const int64_t rows = model::computed_logits_rows(part);
    end += count(part.tokens);
    normalize(&xb_[index(wanted * c.n_embd)], &x_[index((end - rows) * c.n_embd)], plan_.output_norm(),
              plan_.output_norm_bias(), rows);
    wanted += rows;
  }
  if (wanted == 0) return 0;
  input_.set(xb_.data(), wanted, c.n_embd);
  project(plan_.output(), plan_.output_bias(), logits);
  if (c.logits_cap > 0.0f) soft_cap(logits, wanted * c.vocab_size, c.logits_cap);
  return wanted;
}

void Transformer::attention_block(int64_t l, int64_t n) {
  const model::ModelConfig& c = config_;
  const model::LayerPlan& layer = plan_.layer(l);
  input_.set(xb_.data(), n, c.n_embd);
  const Product qkv[] = {{matrix_of(layer.attn_q), q_.data()},
                         {matrix_of(layer.attn_k), k_.data()},
                         {matrix_of(layer.attn_v), v_.data()}};
  matmul(pool_, qkv, input_);
  if (layer.attn_q_bias) add_rows(q_.data(), layer.attn_q_bias.f32_values(), n, c.q_dim());
  if (layer.attn_k_bias) add_rows(k_.data(), layer.attn_k_bias.f32_values(), n, c.kv_dim());
  if (layer.attn_v_bias) add_rows(v_.data(), layer.attn_v_bias.f32_values(), n, c.kv_dim());
  // Each head of q and k normalized (Qwen 3, Gemma 3), then rotated by its position; keys and values cached.
  const auto head_norm = [&](float* heads, int64_t count, const model::LazyTensor& weight) {
    if (!weight) return;
    for (int64_t h = 0; h < count; ++h)
      rmsnorm(heads + h * c.head_dim, heads + h * c.head_dim, weight.f32_values(), c.head_dim, c.norm_eps);
  };
  const std::vector<float>& angles = rope_[c.sliding(l) && c.sliding_layers_rotate_apart()];
  for (int64_t t = 0; t < n; ++t) {
    float* q = &q_[index(t * c.q_dim())];
    float* k = &k_[index(t * c.kv_dim())];
    head_norm(q, c.n_heads, layer.attn_q_norm);
    head_norm(k, c.n_kv_heads, layer.attn_k_norm);
    if (c.rotary()) {
      const float* cos_sin = &angles[index(t * c.rope_dims)];
      rope(q, c.n_heads, c.head_dim, cos_sin, c.rope_dims / 2, c.rope_style);
      rope(k, c.n_kv_heads, c.head_dim, cos_sin, c.rope_dims / 2, c.rope_style);
    }
    const Row& row = rows_[index(t)];
    cache_.store(l, cache_.row(l, row.blocks, row.position), k, &v_[index(t * c.kv_dim())]);
  }
  attention(l, n);
  input_.set(attn_out_.data(), n, c.q_dim());
  project(layer.attn_output, layer.attn_output_bias, delta_.data());
}

void Transformer::ffn_block(const model::LayerPlan& layer, int64_t n) {
  const model::ModelConfig& c = config_;
  input_.set(xb_.data(), n, c.n_embd);
  if (layer.ffn_gate) {
    // down(act(gate(x)) * up(x)), gate and up as one job.
    const Product gate_up[] = {{matrix_of(layer.ffn_gate), hb_.data()}, {matrix_of(layer.ffn_up), hb2_.data()}};
    matmul(pool_, gate_up, input_);
    if (layer.ffn_gate_bias) add_rows(hb_.data(), layer.ffn_gate_bias.f32_values(), n, c.n_ff);
    if (layer.ffn_up_bias) add_rows(hb2_.data(), layer.ffn_up_bias.f32_values(), n, c.n_ff);
    if (c.arch->ffn == model::FfnKind::GeluGated)
      geglu(hb_.data(), hb2_.data(), n * c.n_ff);
    else
      swiglu(hb_.data(), hb2_.data(), n * c.n_ff);
  } else {
    // down(gelu(up(x))).
    project(layer.ffn_up, layer.ffn_up_bias, hb_.data());
    gelu(hb_.data(), n * c.n_ff);
  }
  input_.set(hb_.data(), n, c.n_ff);
  project(layer.ffn_down, layer.ffn_down_bias, delta_.data());
}

void Transformer::attention(int64_t layer, int64_t n) {
  const model::ModelConfig& c = config_;
  // Token t sees its sequence's cached positions up to its own (causal), and on a sliding-window layer only the
  // last `window` of them: the rows of a ring that may wrap, or of a paged sequence's blocks.
  const int64_t window = c.sliding(layer) ? c.sliding_window : cache_.capacity();
  ranges_.clear();
  range_starts_.clear();
  for (int64_t t = 0; t < n; ++t) {
    const Row& row = rows_[index(t)];
    const int64_t first = std::max<int64_t>(0, row.position + 1 - window);
    range_starts_.push_back(ranges_.size());
    cache_.append_rows(layer, row.blocks, first, row.position + 1 - first, ranges_);
  }
  range_starts_.push_back(ranges_.size());
  // One item per (token, query head).
  const auto attend_all = [&](auto kv_element) {
    using KvElement = decltype(kv_element);
    const KvElement* keys = cache_.keys<KvElement>(layer);
    const KvElement* values = cache_.values<KvElement>(layer);
    pool_.parallel_for(n * c.n_heads, 1, [&](int64_t begin, int64_t end, int thread) {
      float* scores = &scores_[index(thread * cache_.capacity())];
      for (int64_t item = begin; item < end; ++item) {
        const int64_t t = item / c.n_heads;
        const int64_t head = item % c.n_heads;
        const size_t first_range = range_starts_[index(t)];
        const std::span<const RowRange> ranges(&ranges_[first_range], range_starts_[index(t + 1)] - first_range);
        const int64_t kv_offset = head / c.heads_per_kv_head() * c.head_dim;
        const int64_t offset = t * c.q_dim() + head * c.head_dim;
        attend(&attn_out_[index(offset)], &q_[index(offset)], keys + kv_offset, values + kv_offset, ranges, c.kv_dim(),
               c.head_dim, c.attention_scale, c.attention_cap, scores);
      }
    });
  };
  if (cache_.type() == TensorType::F16)
    attend_all(uint16_t{});
  else
    attend_all(float{});
}

}  // namespace rf::cpu
