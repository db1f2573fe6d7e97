#include "backend/gpu/transformer.h"

#include <algorithm>
#include <initializer_list>
#include <map>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/gpu/kernels.h"
#include "backend/gpu/products.h"
#include "backend/gpu/residency.h"
#include "backend/gpu/runtime.h"
#include "util/error.h"

namespace rf::gpu {
namespace {

size_t bytes_of_floats(int64_t n) { return static_cast<size_t>(n) * sizeof(float); }
int64_t count(std::span<const int32_t> tokens) { return static_cast<int64_t>(tokens.size()); }

static_assert(kKvBlockRows == model::kKvBlockPositions, "the kernels' blocks are those of the paged KV cache");

// The attention of layer l (its window where it slides; its ring, which depends on the cache, State::attention_of
// adds); layer -1: the shape every layer shares but the window.
AttentionShape attention_shape(const model::ModelConfig& c, int64_t l = -1) {
  return {c.n_heads,         c.n_kv_heads,       c.head_dim,
          c.rope_dims / 2,   c.rope_style == model::RopeStyle::NeoX,
          c.attention_scale, c.attention_cap,    l >= 0 && c.sliding(l) ? c.sliding_window : 0};
}


// Whether a layer is the llama block and nothing more: what the product chains compute.
bool llama_block(const model::ModelConfig& c, const model::LayerPlan& layer) {
  return c.arch->norm == model::NormKind::Rms && c.arch->ffn == model::FfnKind::SiluGated && !c.arch->parallel_blocks &&
         !layer.attn_q_bias && !layer.attn_k_bias && !layer.attn_v_bias && !layer.attn_q_norm &&
         !layer.attn_output_bias && !layer.attn_post_norm && !layer.ffn_gate_bias && !layer.ffn_up_bias &&
         !layer.ffn_down_bias && !layer.ffn_post_norm;
}

// Whether any layer normalizes a block's output before the residual add (Gemma 2/3, GLM-4).
bool has_post_norms(const model::ExecutionPlan& plan) {
  return std::any_of(plan.layers().begin(), plan.layers().end(),
                     [](const model::LayerPlan& layer) { return layer.attn_post_norm || layer.ffn_post_norm; });
}

// Rejects what the kernels cannot run from layer first_layer on, naming it.
void check_supported(const model::ExecutionPlan& plan, const AttentionShape& shape, int64_t first_layer) {
  if (plan.config().n_embd % 4 != 0) fail("the GPU backend needs a width that is a multiple of 4");
  if (shape.head_dim % 2 != 0 || shape.head_dim > kMaxHeadDim)
    fail("the GPU backend needs an even head dimension of at most {}, the model has {}", kMaxHeadDim, shape.head_dim);
  if (shape.heads_per_kv_head() > kMaxHeadsPerKvHead)
    fail("the GPU backend shares a kv head among at most {} query heads, the model among {}", kMaxHeadsPerKvHead,
         shape.heads_per_kv_head());
  const model::LazyTensor& positions = plan.position_embd();
  if (positions && positions.type() != TensorType::F32 && positions.type() != TensorType::F16)
    fail("tensor '{}' has type {}: the GPU backend takes learned positions in F32 or F16", positions.name(),
         tensor_type_name(positions.type()));
  // A post-norm's output passes through the normalized rows, which a parallel block's feed-forward still reads.
  if (plan.config().arch->parallel_blocks && has_post_norms(plan))
    fail("the GPU backend runs no post-norms in blocks whose attention and feed-forward run in parallel");
  std::vector<const model::LazyTensor*> matrices{&plan.output()};
  if (first_layer == 0) matrices.push_back(&plan.token_embd());
  for (int64_t l = first_layer; l < plan.config().n_layers; ++l)
    for (const model::LazyTensor* tensor : plan.layer(l).tensors())
      if (tensor->info().n_dims == 2) matrices.push_back(tensor);
  for (const model::LazyTensor* matrix : matrices) {
    if (!has_kernels(matrix->type()))
      fail("tensor '{}' has type {}, which the GPU backend does not compute with", matrix->name(),
           tensor_type_name(matrix->type()));
    // Float rows are read 16 bytes at a time (4 f32 or 8 f16 values), quantized rows block by block.
    if (!row_fits_kernels(matrix->type(), matrix->cols()))
      fail("tensor '{}': the GPU kernels read rows of {} in 16-byte pieces, and its {} values do not divide so",
           matrix->name(), tensor_type_name(matrix->type()), matrix->cols());
  }
}

// Positions the KV cache holds: every position of a paged cache's blocks, or one sequence's context.
int64_t context_of(const model::ModelConfig& config, const TransformerOptions& options) {
  if (options.kv_blocks > 0) return options.kv_blocks * kKvBlockRows;
  return options.context > 0 ? options.context : std::min(config.context_length, kDefaultContext);
}

// Where the rows of each layer from first_layer on start in the key cache (and in the value cache), then their
// total: a row for each of `context` positions, or a sliding-window layer's ring (model::kv_cache_rows) unless the
// cache is paged (its blocks hold every position of their sequences).
std::vector<int64_t> cache_starts(const model::ModelConfig& config, int64_t first_layer, int64_t context,
                                  int64_t max_batch, bool paged) {
  std::vector<int64_t> starts{0};
  for (int64_t l = first_layer; l < config.n_layers; ++l)
    starts.push_back(starts.back() + (paged ? context : model::kv_cache_rows(config, l, context, max_batch)));
  return starts;
}

// The key cache, or the value cache, of `rows` rows: f16.
uint64_t cache_bytes(const model::ModelConfig& config, int64_t rows) {
  return static_cast<uint64_t>(rows) * static_cast<uint64_t>(config.kv_dim()) * sizeof(uint16_t);
}

DeviceResidency& device_residency(const model::ExecutionPlan& plan) {
  auto* residency = dynamic_cast<DeviceResidency*>(&plan.residency());
  if (!residency)
    fail("the GPU backend needs a plan built with gpu::make_residency(), so that its weights are on the device");
  return *residency;
}

// Elements of the largest matrix of a layer: the dequantization scratch of prompt GEMMs holds one.
int64_t largest_layer_matrix(const model::ExecutionPlan& plan) {
  int64_t largest = 0;
  for (const model::LayerPlan& layer : plan.layers())
    for (const model::LazyTensor* tensor : layer.tensors())
      largest = std::max(largest, tensor->rows() * tensor->cols());
  return largest;
}

// What a decode step's capture needs on the device: the weights of layers first_layer.. and the output.
void preload_from(const model::ExecutionPlan& plan, int64_t first_layer) {
  if (first_layer == 0) {
    plan.preload_all();
    return;
  }
  if (first_layer < plan.config().n_layers) plan.preload_layers(first_layer, plan.config().n_layers - 1);
  for (const model::LazyTensor* tensor : plan.output_tensors()) tensor->data();
}

// Where a chain writes its results: the activations of one token, and the logits where the last layer's chain makes
// them (null: not).
struct ChainBuffers {
  const float* attention = nullptr;
  float* residual = nullptr;
  float* hidden = nullptr;
  float* q = nullptr;
  float* k = nullptr;
  float* v = nullptr;
  float* logits = nullptr;
};

// The products between layer l's attention and layer l + 1's (its output projection, its feed-forward block, and
// layer l + 1's q, k and v; after the last layer the final norm and the logits, where the output matrix has the
// chain's type and the launch room for its rows) as one chain, for decoding: the weights' device rows from `rows_of`
// (nullptr while only the shapes are asked about). Empty where the layers' matrices do not share one 16-bit float
// type.
template <typename RowsOf>
std::optional<ProductChain> chain_after_attention(const model::ExecutionPlan& plan, int64_t l, const ChainBuffers& out,
                                                  const RowsOf& rows_of) {
  const model::ModelConfig& c = plan.config();
  const model::LayerPlan& layer = plan.layer(l);
  const bool last = l + 1 == c.n_layers;
  if (!llama_block(c, layer) || (!last && !llama_block(c, plan.layer(l + 1)))) return std::nullopt;
  ProductChain chain;
  chain.type = layer.attn_output.type();
  chain.eps = c.norm_eps;
  bool one_type = true;
  const auto add = [&](const float* input, const model::LazyTensor* norm, ChainOutput output,
                       std::initializer_list<std::pair<const model::LazyTensor*, float*>> targets) {
    ChainStep& step = chain.step[chain.steps++];
    step.input = input;
    step.norm = norm ? static_cast<const float*>(rows_of(*norm)) : nullptr;
    step.output = output;
    for (const auto& [weight, y] : targets) {
      step.cols = weight->cols();
      step.weights[step.matrices] = rows_of(*weight);
      step.rows[step.matrices] = weight->rows();
      step.y[step.matrices++] = y;
      one_type = one_type && weight->type() == chain.type;
    }
  };
  add(out.attention, nullptr, ChainOutput::Accumulate, {{&layer.attn_output, out.residual}});
  add(out.residual, &layer.ffn_norm, ChainOutput::Swiglu,
      {{&layer.ffn_gate, out.hidden}, {&layer.ffn_up, nullptr}});
  add(out.hidden, nullptr, ChainOutput::Accumulate, {{&layer.ffn_down, out.residual}});
  if (!last) {
    const model::LayerPlan& next = plan.layer(l + 1);
    add(out.residual, &next.attn_norm, ChainOutput::Store,
        {{&next.attn_q, out.q}, {&next.attn_k, out.k}, {&next.attn_v, out.v}});
  } else if (out.logits && plan.output().type() == chain.type && !plan.output_bias() && c.logits_cap == 0.0f) {
    add(out.residual, &plan.output_norm(), ChainOutput::Store, {{&plan.output(), out.logits}});
    // Where a block's row sums of the vocabulary do not fit its shared memory, the logits are a product of their own.
    if (!product_chain_runs(chain)) --chain.steps;
  }
  if (!one_type) return std::nullopt;
  return chain;
}

// Bytes of a chain's weights.
uint64_t chain_bytes(const ProductChain& chain) {
  uint64_t bytes = 0;
  for (int s = 0; s < chain.steps; ++s)
    for (int m = 0; m < chain.step[s].matrices; ++m)
      bytes += static_cast<uint64_t>(chain.step[s].rows[m]) *
               row_bytes(chain.type, static_cast<uint64_t>(chain.step[s].cols));
  return bytes;
}

// Chains pay where a layer's weights stream long enough to hide the grid barriers between their steps. Measured on
// an H200, decoding tg128 from gen-model files with the chains of c38f0d5: llama3-8b F16 (436 MB a chain) 224 -> 239
// tokens/s, llama3-1b F16 (122 MB) 1009-1014 -> 1047-1055, tiny-256 F16 (1 MB) 9416-9526 -> 5697-5784. The floor
// sits just under the smallest chain measured to gain.
constexpr uint64_t kMinChainBytes = 100ull << 20;

// Whether decode steps run the products after each attention as chains: every layer's on this device.
bool chains_suit(const model::ExecutionPlan& plan, int64_t first_layer, TransformerOptions::Chains mode) {
  if (mode == TransformerOptions::Chains::Never) return false;
  const auto shapes_only = [](const model::LazyTensor&) -> const void* { return nullptr; };
  for (int64_t l = first_layer; l < plan.config().n_layers; ++l) {
    // With the logits, so that the last layer's chain is checked as decoding runs it.
    float logits = 0.0f;
    const std::optional<ProductChain> chain = chain_after_attention(plan, l, {.logits = &logits}, shapes_only);
    if (!chain || !product_chain_runs(*chain)) return false;
    if (mode == TransformerOptions::Chains::Auto && l == first_layer && chain_bytes(*chain) < kMinChainBytes)
      return false;
  }
  return true;
}

// Blocks of a sequence's table that hold its positions up to its last token's.
int64_t blocks_holding(const model::BatchSequence& sequence) {
  return model::kv_blocks_for(sequence.position + count(sequence.tokens));
}

// Float activations where asked; a paged cache's rows are many sequences, whose results must not depend on each
// other.
ProductPolicy product_policy(const TransformerOptions& options) {
  if (options.float_activations) return ProductPolicy::FloatActivations;
  return options.kv_blocks > 0 ? ProductPolicy::BatchInvariant : ProductPolicy::Fastest;
}

// A pass of a paged batch in device memory: its tokens, where they are, and the indices of the rows whose logits it
// computes.
struct PagedPass {
  const int32_t* tokens = nullptr;
  PagedRows rows;
  const int32_t* wanted = nullptr;
  int64_t wanted_count = 0;
};

}  // namespace

std::shared_ptr<model::Residency> make_residency(int64_t first_layer) {
  loader::StreamingOptions options;
  // Measured on an H200 host: 8 readers bring a page-cached file to the device at 24 to 31 GB/s.
  options.reader_threads = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8);
  options.progress_label = "loading";
  return std::make_shared<DeviceResidency>(std::move(options), first_layer);
}

struct Transformer::State {
  State(const model::ExecutionPlan& plan, int64_t first_layer, const TransformerOptions& options);

  // Evaluates n tokens at position, position + 1, ... in passes of at most max_batch; stage(start, count) puts
  // the input of tokens start .. start + count - 1 into the pinned buffers (tokens to step_host from its
  // second element, or residual rows to hidden_host).
  template <typename Stage>
  std::span<const float> run(int64_t n, int64_t position, Logits which, const Stage& stage);
  // Runs the n <= max_batch tokens staged. Logits::All: the logits of every token go to all_logits from row
  // first_row on; Logits::Last: those of the last token of the last batch go to logits_host.
  void forward_batch(int64_t n, int64_t position, Logits which, int64_t first_row, bool last_batch);
  // Enqueues the pass over the n tokens staged on the stream: the logits of the wanted rows go to `logits`
  // (none when null): device memory, or logits_host for the last row. A paged pass (`paged`, already on the device)
  // takes its rows' positions and cache rows from there, and returns the logits of its wanted rows instead.
  void enqueue(int64_t n, Logits which, float* logits, const PagedPass* paged = nullptr);
  // A paged pass of n rows that each want their logits or their argmax: the logits of every row to logits_all and
  // the argmax of every row to argmax_device, from a graph where one is captured.
  void enqueue_decoding(int64_t n, const PagedPass& paged);
  // A paged cache's batch, checked and its copies enqueued: its passes, and the logits its sequences ask for (their
  // argmax to batch_argmax).
  std::span<const float> run_batch(std::span<const model::BatchSequence> batch);
  // Copies the keys and values of block `source` into block `destination`, in every layer (copy on write).
  void copy_block(model::BlockId source, model::BlockId destination);
  // An rf::Error where the cache is paged: it takes batches of sequences, not one sequence's calls.
  void check_contiguous() const {
    if (kv_blocks > 0)
      fail("this forward pass keeps a paged KV cache of {} blocks: it takes batches of sequences", kv_blocks);
  }
  // Drops the cached positions from `positions` on, or every position (ForwardPass::truncate).
  void truncate(int64_t positions);
  int64_t first_row(int64_t layer) const { return row_starts[static_cast<size_t>(layer - first_layer)]; }
  int64_t cache_rows(int64_t layer) const { return first_row(layer + 1) - first_row(layer); }
  uint16_t* key_cache(int64_t layer) const { return keys.as<uint16_t>() + first_row(layer) * shape.kv_dim(); }
  uint16_t* value_cache(int64_t layer) const { return values.as<uint16_t>() + first_row(layer) * shape.kv_dim(); }
  // Layer l's attention: its window where it slides, and its ring where its cache is one.
  AttentionShape attention_of(int64_t l) const {
    AttentionShape layer = attention_shape(config, l);
    if (cache_rows(l) < context) layer.ring = cache_rows(l);
    return layer;
  }

  const model::ExecutionPlan& plan;
  const model::ModelConfig& config;
  const AttentionShape shape;
  const int64_t first_layer;  // layers before it run elsewhere: their output arrives in hidden_host
  const int64_t context;
  const int64_t kv_blocks;  // of a paged cache; 0: one sequence's
  const int64_t max_batch;
  const bool graphs;
  // Whether a decode step runs the products after each attention as one chain (product_chain).
  const bool chained;
  // Where the rows of layer first_layer + i start in keys and values: row_starts[i] (cache_starts).
  const std::vector<int64_t> row_starts;
  int64_t cached = 0;
  int64_t written = 0;  // one past the newest position stored since the cache was last empty

  Stream stream;
  Products products;
  DeviceBuffer keys;    // [layer - first_layer][row][kv_dim] f16: row p holds position p, or p % rows in a ring
  DeviceBuffer values;  // [layer - first_layer][row][kv_dim] f16, as keys

  // Activations of a batch, one row per token (the GPU twin of cpu::Transformer's).
  DeviceBuffer x;                // residual stream [n, n_embd]
  ActivationRows normalized;     // a block's normalized input [n, n_embd]
  DeviceBuffer q;                // [n, q_dim]
  DeviceBuffer k;                // [n, kv_dim]
  DeviceBuffer v;                // [n, kv_dim]
  ActivationRows attention_out;  // [n, q_dim]
  ActivationRows hidden;         // feed-forward gate, then silu(gate) * up [n, n_ff]
  DeviceBuffer up;               // feed-forward up [n, n_ff]
  DeviceBuffer block_out;        // a block's output before its post-norm [n, n_embd] (models with post-norms)
  DeviceBuffer gathered;         // paged: the rows of the stream whose logits a pass computes [n, n_embd]
  DeviceBuffer argmax_device;    // paged: the argmax of a pass's rows of logits_all [n]
  // (cos, sin) per position of the context and dimension pair (rope_table) of full-context layers [0] and of
  // sliding-window layers [1] (where those rotate with a base of their own).
  DeviceBuffer rope[2];
  DeviceBuffer partials;         // split-K attention partial results and block counters (zeroed once)
  DeviceBuffer chain_arrivals;   // the product chains' grid barrier counter (zeroed once)
  DeviceBuffer logits_all;       // [rows, vocab], grown on demand
  DeviceBuffer step_device;      // position, then the tokens of the batch
  PinnedBuffer step_host;
  PinnedBuffer hidden_host;  // with first_layer > 0: the batch's residual rows [n, n_embd]
  // [vocab]: the last row's logits, written there by the output product's thread blocks as they finish rather
  // than copied after it (H200, decoding: 1b Q4_K_M 1633-1648 -> 1648-1662, 8b 471-474 -> 476-478 tokens/s).
  PinnedBuffer logits_host;
  std::vector<float> all_logits;
  Graph decode_step;
  // Paged: a pass's tokens, positions, table starts, wanted rows and block tables (run_batch), and the batch's
  // logits and argmax tokens, grown on demand; pinned, so that the copies run as DMA rather than through a staging
  // copy.
  std::vector<model::BatchSequence> pass_parts;
  PinnedBuffer pass_host;
  DeviceBuffer pass_device;
  PinnedBuffer batch_logits;
  PinnedBuffer batch_argmax;
  std::span<const int32_t> argmax_tokens;  // the last batch's, in batch_argmax
  // Paged decoding steps (every row a sequence's next token) by their rows: a graph captured at the second step of
  // that size, unless the first ran a GEMM. Which of the rows want their logits and which their argmax changes from
  // step to step: the graph finds every row's argmax, and what is copied to the host is enqueued after it. Dropped
  // when a buffer the graphs point into moves.
  struct DecodingStep {
    Graph graph;
    bool capturable = true;
  };
  std::map<int64_t, DecodingStep> decoding_steps;
};

Transformer::State::State(const model::ExecutionPlan& plan_, int64_t first_layer_, const TransformerOptions& options)
    : plan(plan_),
      config(plan_.config()),
      shape(attention_shape(config)),
      first_layer(first_layer_),
      context(context_of(config, options)),
      kv_blocks(options.kv_blocks),
      max_batch(options.max_batch),
      graphs(options.graphs),
      chained(kv_blocks == 0 && !options.float_activations && chains_suit(plan_, first_layer_, options.chains)),
      row_starts(cache_starts(config, first_layer, context, max_batch, kv_blocks > 0)),
      products(largest_layer_matrix(plan_)),
      keys(cache_bytes(config, row_starts.back()), "the key cache"),
      values(cache_bytes(config, row_starts.back()), "the value cache"),
      x(bytes_of_floats(max_batch * config.n_embd), "activations"),
      normalized(max_batch, config.n_embd, product_policy(options)),
      q(bytes_of_floats(max_batch * config.q_dim()), "activations"),
      k(bytes_of_floats(max_batch * config.kv_dim()), "activations"),
      v(bytes_of_floats(max_batch * config.kv_dim()), "activations"),
      attention_out(max_batch, config.q_dim(), product_policy(options)),
      hidden(max_batch, config.n_ff, product_policy(options)),
      up(bytes_of_floats(max_batch * config.n_ff), "activations"),
      partials(bytes_of_floats(attention_partials_floats(shape, context)), "attention partials"),
      chain_arrivals(sizeof(unsigned), "the product chains' counter"),
      step_device(static_cast<size_t>(1 + max_batch) * sizeof(int32_t), "the batch's tokens"),
      step_host(static_cast<size_t>(1 + max_batch) * sizeof(int32_t), "the batch's tokens"),
      logits_host(bytes_of_floats(config.vocab_size), "logits") {
  if (first_layer > 0) hidden_host = PinnedBuffer(bytes_of_floats(max_batch * config.n_embd), "the residual stream");
  if (has_post_norms(plan))
    block_out = DeviceBuffer(bytes_of_floats(max_batch * config.n_embd), "activations");
  if (kv_blocks > 0) {
    gathered = DeviceBuffer(bytes_of_floats(max_batch * config.n_embd), "activations");
    argmax_device = DeviceBuffer(static_cast<size_t>(max_batch) * sizeof(int32_t), "the rows' argmax");
  }
  const float* freq_factors = plan.rope_freqs()
                                  ? reinterpret_cast<const float*>(plan.file().tensor_data(plan.rope_freqs().info()).data())
                                  : nullptr;
  std::vector<DeviceBuffer> frequencies;  // kept until the tables are made
  for (const bool sliding : {false, true}) {
    if (!config.rotary() || (sliding && !config.sliding_layers_rotate_apart())) break;
    const std::vector<double> inverse = config.rope_inverse_frequencies(sliding, freq_factors);
    const DeviceBuffer& inverse_frequencies =
        frequencies.emplace_back(inverse.size() * sizeof(double), "rotary frequencies");
    // On the stream: a plain copy from pageable memory may return before it lands, and this stream does not wait for
    // the default one.
    check(gpuMemcpyAsync(inverse_frequencies.data(), inverse.data(), inverse_frequencies.bytes(), gpuMemcpyHostToDevice,
                         stream.get()),
          "uploading rotary frequencies");
    rope[sliding] = DeviceBuffer(bytes_of_floats(context * 2 * shape.rope_pairs), "rotary angles");
    rope_table(inverse_frequencies.as<double>(), shape.rope_pairs, context, rope[sliding].as<float>(), stream.get());
  }
  // attention_decode counts finished blocks from zero and leaves the counters zeroed.
  check(gpuMemsetAsync(partials.data(), 0, partials.bytes(), stream.get()), "clearing the attention counters");
  check(gpuMemsetAsync(chain_arrivals.data(), 0, chain_arrivals.bytes(), stream.get()), "clearing the chains' counter");
  stream.synchronize();  // the table is made before its frequencies go
}

template <typename Stage>
std::span<const float> Transformer::State::run(int64_t n, int64_t position, Logits which, const Stage& stage) {
  model::check_single_sequence(which);
  model::check_positions(config, n, position, cached, context);
  truncate(position);
  model::check_kept(position, cached);
  if (which == Logits::All) all_logits.resize(static_cast<size_t>(n * config.vocab_size));
  for (int64_t start = 0; start < n; start += max_batch) {
    const int64_t count = std::min(max_batch, n - start);
    stage(start, count);
    written = std::max(written, position + start + count);
    forward_batch(count, position + start, which, start, start + count == n);
    cached = position + start + count;
  }
  if (which == Logits::All) return all_logits;
  return {logits_host.as<float>(), static_cast<size_t>(config.vocab_size)};
}

void Transformer::State::forward_batch(int64_t n, int64_t position, Logits which, int64_t first_row,
                                       bool last_batch) {
  step_host.as<int32_t>()[0] = static_cast<int32_t>(position);
  const int64_t vocab = config.vocab_size;

  if (which == Logits::Last) {
    if (n == 1 && last_batch && graphs) {
      if (!decode_step.ready()) {
        // A capture records launches, not uploads: every weight must be on the device before.
        preload_from(plan, first_layer);
        decode_step.capture(stream.get(), [&] { enqueue(1, Logits::Last, logits_host.as<float>()); });
      }
      decode_step.launch(stream.get());
    } else {
      enqueue(n, Logits::Last, last_batch ? logits_host.as<float>() : nullptr);
    }
    stream.synchronize();
    return;
  }

  logits_all.reserve(bytes_of_floats(n * vocab), "logits");
  enqueue(n, Logits::All, logits_all.as<float>());
  check(gpuMemcpyAsync(&all_logits[static_cast<size_t>(first_row * vocab)], logits_all.data(),
                       bytes_of_floats(n * vocab), gpuMemcpyDeviceToHost, stream.get()),
        "copying logits");
  stream.synchronize();
}

void Transformer::State::enqueue(int64_t n, Logits which, float* logits, const PagedPass* paged) {
  const model::ModelConfig& c = config;
  const gpuStream_t s = stream.get();
  auto* const step = step_device.as<int32_t>();
  if (!paged)
    check(gpuMemcpyAsync(step, step_host.data(), static_cast<size_t>(1 + n) * sizeof(int32_t), gpuMemcpyHostToDevice,
                         s),
          "copying the batch's tokens");
  const auto multiply = [&](std::initializer_list<Products::Target> targets, ActivationRows& input, int64_t rows,
                            bool accumulate) {
    products.multiply({targets.begin(), targets.size()}, input, rows, accumulate, s);
  };
  // Up to three (y, bias) pairs of n rows in one launch; empty biases are left out.
  const auto add_bias_rows = [&](std::initializer_list<std::pair<float*, const model::LazyTensor*>> pairs,
                                 int64_t rows) {
    BiasSegment segments[3];
    size_t count = 0;
    for (const auto& [y, bias] : pairs)
      if (*bias) segments[count++] = {y, bias->f32_values(), bias->cols()};
    add_biases({segments, count}, rows, s);
  };
  const auto add_bias = [&](float* y, const model::LazyTensor& bias, int64_t rows) {
    add_bias_rows({{y, &bias}}, rows);
  };
  // The block's norm (RMSNorm or LayerNorm) of rows of the stream into `normalized`, also writing the 8-bit form
  // that `consumer`'s product reads.
  const auto normalize = [&](const float* in, const model::LazyTensor& weight, const model::LazyTensor& bias,
                             int64_t rows, const model::LazyTensor& consumer) {
    const ActivationOutput out = normalized.output_for(consumer.type(), rows);
    if (c.arch->norm == model::NormKind::Rms)
      rmsnorm(in, weight.f32_values(), rows, c.n_embd, c.norm_eps, out, s);
    else
      layernorm(in, weight.f32_values(), bias.f32_values(), rows, c.n_embd, c.norm_eps, out, s);
  };
  // weight x input (+ bias) added to the residual stream, through the post-norm where the layer has one.
  const auto add_to_stream = [&](const model::LazyTensor& weight, const model::LazyTensor& bias,
                                 const model::LazyTensor& post_norm, ActivationRows& input) {
    float* out = post_norm ? block_out.as<float>() : x.as<float>();
    multiply({{device_matrix(weight), out}}, input, n, !post_norm);
    add_bias(out, bias, n);
    if (!post_norm) return;
    normalized.changed();
    rmsnorm(out, post_norm.f32_values(), n, c.n_embd, c.norm_eps, ActivationOutput{.f32 = normalized.f32()}, s);
    add(x.as<float>(), normalized.f32(), n * c.n_embd, s);
  };

  // Each token's embedding row (scaled, and with its learned position, where the model says), or the residual
  // stream the layers before first_layer made.
  if (first_layer == 0) {
    const DeviceMatrix embeddings = device_matrix(plan.token_embd());
    embed_tokens(embeddings.type, embeddings.view, c.n_embd, paged ? paged->tokens : step + 1, n, x.as<float>(), s);
    const model::LazyTensor& positions = plan.position_embd();
    if (c.embedding_scale != 1.0f || positions) {
      const TensorType positions_type = positions ? positions.type() : TensorType::F32;
      const void* learned = positions ? positions.data() : nullptr;
      if (paged)
        scale_and_position(x.as<float>(), n, c.n_embd, c.embedding_scale, positions_type, learned, paged->rows, s);
      else
        scale_and_position(x.as<float>(), n, c.n_embd, c.embedding_scale, positions_type, learned, step, s);
    }
  } else {
    check(gpuMemcpyAsync(x.data(), hidden_host.data(), bytes_of_floats(n * c.n_embd), gpuMemcpyHostToDevice, s),
          "copying the residual stream");
  }

  // Decoding in chains, the products after each attention are one launch that also makes the next layer's q, k
  // and v; the first layer's come before the loop.
  const bool in_chains = n == 1 && chained;
  const auto device_rows = [](const model::LazyTensor& tensor) -> const void* {
    return device_matrix(tensor).view.blocks;
  };
  for (int64_t l = first_layer; l < c.n_layers; ++l) {
    const model::LayerPlan& layer = plan.layer(l);
    const AttentionShape layer_shape = attention_of(l);
    const float* angles = rope[c.sliding(l) && c.sliding_layers_rotate_apart()].as<float>();
    // The layer's weights may still be streaming in: wait for this layer's only (at once when resident), and in
    // chains for the next layer's too.
    plan.preload_layers(l, in_chains ? std::min(l + 1, c.n_layers - 1) : l);

    // Attention: queries, keys and values of the normalized stream (with their biases, each head normalized
    // where the model says), rotated by position; keys and values join the cache; the attention output is
    // projected back and added to the residual stream.
    if (!in_chains || l == first_layer) {
      normalize(x.as<float>(), layer.attn_norm, layer.attn_norm_bias, n, layer.attn_q);
      multiply({{device_matrix(layer.attn_q), q.as<float>()},
                {device_matrix(layer.attn_k), k.as<float>()},
                {device_matrix(layer.attn_v), v.as<float>()}},
               normalized, n, false);
    }
    if (!paged && n == 1 && attention_decode_runs(layer_shape) &&
        (!layer.attn_q_norm || attention_decode_takes_norms(layer_shape))) {
      // Also adds the biases, normalizes the heads, rotates q and k, stores k and v, and writes the 8-bit form
      // that the output projection reads.
      const QkvExtras extras{layer.attn_q_bias.f32_values(), layer.attn_k_bias.f32_values(),
                             layer.attn_v_bias.f32_values(), layer.attn_q_norm.f32_values(),
                             layer.attn_k_norm.f32_values(), c.norm_eps};
      attention_decode(layer_shape, q.as<float>(), k.as<float>(), v.as<float>(), extras, angles, key_cache(l),
                       value_cache(l), context, step, partials.as<float>(),
                       attention_out.output_for(layer.attn_output.type(), n), s);
    } else {
      add_bias_rows({{q.as<float>(), &layer.attn_q_bias}, {k.as<float>(), &layer.attn_k_bias},
                     {v.as<float>(), &layer.attn_v_bias}},
                    n);
      if (layer.attn_q_norm) {
        const HeadNormSegment heads[] = {{q.as<float>(), layer.attn_q_norm.f32_values(), n * c.n_heads},
                                         {k.as<float>(), layer.attn_k_norm.f32_values(), n * c.n_kv_heads}};
        head_rmsnorm(heads, c.head_dim, c.norm_eps, s);
      }
      // One sequence's tokens from step[0] on, or each row of a paged pass at its own position, over its own blocks.
      if (paged) {
        rope_and_store(layer_shape, q.as<float>(), k.as<float>(), v.as<float>(), angles, n, paged->rows, key_cache(l),
                       value_cache(l), s);
        attention_paged(layer_shape, q.as<float>(), key_cache(l), value_cache(l), n, paged->rows, attention_out.f32(),
                        s);
      } else {
        rope_and_store(layer_shape, q.as<float>(), k.as<float>(), v.as<float>(), angles, n, step, key_cache(l),
                       value_cache(l), s);
        attention_prompt(layer_shape, q.as<float>(), key_cache(l), value_cache(l), n, step, attention_out.f32(), s);
      }
      attention_out.changed();
    }
    if (in_chains) {
      const ChainBuffers buffers{attention_out.f32(), x.as<float>(), hidden.f32(), q.as<float>(),
                                 k.as<float>(),       v.as<float>(), logits};
      const std::optional<ProductChain> chain = chain_after_attention(plan, l, buffers, device_rows);
      product_chain(*chain, chain_arrivals.as<unsigned>(), s);
      hidden.changed();
      // The last layer's chain made the logits where the output matrix has its type.
      if (l + 1 == c.n_layers && chain->step[chain->steps - 1].y[0] == logits) return;
      continue;
    }
    add_to_stream(layer.attn_output, layer.attn_output_bias, layer.attn_post_norm, attention_out);

    // Feed-forward of the stream normalized anew (or, where attention and feed-forward run in parallel, of the
    // attention's normalized input): down(act(gate(x)) * up(x)), or down(gelu(up(x))), added to the stream.
    if (!c.arch->parallel_blocks)
      normalize(x.as<float>(), layer.ffn_norm, layer.ffn_norm_bias, n, layer.ffn_gate ? layer.ffn_gate : layer.ffn_up);
    const Activation activation = c.arch->ffn == model::FfnKind::SiluGated ? Activation::Silu : Activation::Gelu;
    if (layer.ffn_gate) {
      multiply({{device_matrix(layer.ffn_gate), hidden.f32()}, {device_matrix(layer.ffn_up), up.as<float>()}},
               normalized, n, false);
      add_bias_rows({{hidden.f32(), &layer.ffn_gate_bias}, {up.as<float>(), &layer.ffn_up_bias}}, n);
    } else {
      multiply({{device_matrix(layer.ffn_up), hidden.f32()}}, normalized, n, false);
      add_bias(hidden.f32(), layer.ffn_up_bias, n);
    }
    activate(activation, hidden.f32(), layer.ffn_gate ? up.as<float>() : nullptr, n, c.n_ff,
             hidden.output_for(layer.ffn_down.type(), n), s);
    add_to_stream(layer.ffn_down, layer.ffn_down_bias, layer.ffn_post_norm, hidden);
  }
  if (!logits) return;

  // The final norm and the projection to the vocabulary (plus its bias, soft-capped where the model says), for
  // the rows whose logits are wanted: the last or every row of one sequence's pass, or those a paged pass gathers.
  const int64_t first = which == Logits::All ? 0 : n - 1;
  const float* rows = x.as<float>() + first * c.n_embd;
  int64_t wanted = n - first;
  if (paged) {
    gather_rows(x.as<float>(), paged->wanted, paged->wanted_count, c.n_embd, gathered.as<float>(), s);
    rows = gathered.as<float>();
    wanted = paged->wanted_count;
  }
  normalize(rows, plan.output_norm(), plan.output_norm_bias(), wanted, plan.output());
  multiply({{device_matrix(plan.output()), logits}}, normalized, wanted, false);
  add_bias(logits, plan.output_bias(), wanted);
  if (c.logits_cap > 0.0f) soft_cap(logits, wanted * c.vocab_size, c.logits_cap, s);
}

std::span<const float> Transformer::State::run_batch(std::span<const model::BatchSequence> batch) {
  const int64_t vocab = config.vocab_size;
  int64_t logits_count = 0;
  int64_t argmax_count = 0;
  for (const model::BatchSequence& sequence : batch) {
    logits_count += model::logits_rows(sequence);
    argmax_count += sequence.logits == Logits::Argmax;
  }
  batch_logits.reserve(bytes_of_floats(logits_count * vocab), "the batch's logits");
  batch_argmax.reserve(static_cast<size_t>(argmax_count) * sizeof(int32_t), "the batch's argmax");
  float* logits = batch_logits.as<float>();
  int32_t* argmax_host = batch_argmax.as<int32_t>();
  model::for_each_pass(batch, max_batch, pass_parts, [&](std::span<const model::BatchSequence> pass) {
    // One upload: the pass's tokens, their positions, where their sequence's table starts, the rows whose logits are
    // computed, and the tables (each part's blocks up to its last token's). The rows whose logits are returned come
    // first, so that one copy brings them, then those of Argmax parts, so that one copy brings their argmax.
    int64_t n = 0;
    int64_t returned = 0;
    int64_t argmaxed = 0;
    int64_t blocks = 0;
    for (const model::BatchSequence& part : pass) {
      n += count(part.tokens);
      returned += model::logits_rows(part);
      argmaxed += part.logits == Logits::Argmax;
      blocks += blocks_holding(part);
    }
    const int64_t wanted = returned + argmaxed;
    const size_t bytes = static_cast<size_t>(3 * n + wanted + blocks) * sizeof(int32_t);
    pass_host.reserve(bytes, "the pass's tokens and block tables");
    int32_t* const tokens = pass_host.as<int32_t>();
    int32_t* const positions = tokens + n;
    int32_t* const table_starts = positions + n;
    int32_t* const wanted_rows = table_starts + n;
    int32_t* const tables = wanted_rows + wanted;
    int64_t row = 0;
    int32_t* returned_row = wanted_rows;
    int32_t* argmax_row = wanted_rows + returned;
    int32_t* table = tables;
    for (const model::BatchSequence& part : pass) {
      for (size_t i = 0; i < part.tokens.size(); ++i, ++row) {
        tokens[row] = part.tokens[i];
        positions[row] = static_cast<int32_t>(part.position + static_cast<int64_t>(i));
        table_starts[row] = static_cast<int32_t>(table - tables);
      }
      if (part.logits == Logits::Argmax) *argmax_row++ = static_cast<int32_t>(row - 1);
      for (int64_t r = row - model::logits_rows(part); r < row; ++r) *returned_row++ = static_cast<int32_t>(r);
      table = std::copy_n(part.blocks.begin(), blocks_holding(part), table);
    }
    if (pass_device.reserve(bytes, "the pass's tokens and block tables")) decoding_steps.clear();
    check(gpuMemcpyAsync(pass_device.data(), pass_host.data(), bytes, gpuMemcpyHostToDevice, stream.get()),
          "copying the pass's tokens and block tables");
    const int32_t* const device = pass_device.as<int32_t>();
    const PagedPass paged{device, {device + n, device + 2 * n, device + 3 * n + wanted}, device + 3 * n, wanted};

    if (wanted == 0) {
      enqueue(n, Logits::None, nullptr, &paged);
    } else {
      if (logits_all.reserve(bytes_of_floats(wanted * vocab), "logits")) decoding_steps.clear();
      int32_t* const argmax = argmax_device.as<int32_t>() + returned;  // of the Argmax parts' rows
      if (graphs && wanted == n) {
        enqueue_decoding(n, paged);
      } else {
        enqueue(n, Logits::All, logits_all.as<float>(), &paged);
        argmax_rows(logits_all.as<float>() + returned * vocab, argmaxed, vocab, argmax, stream.get());
      }
      if (returned > 0)
        check(gpuMemcpyAsync(logits, logits_all.data(), bytes_of_floats(returned * vocab), gpuMemcpyDeviceToHost,
                             stream.get()),
              "copying logits");
      if (argmaxed > 0)
        check(gpuMemcpyAsync(argmax_host, argmax, static_cast<size_t>(argmaxed) * sizeof(int32_t),
                             gpuMemcpyDeviceToHost, stream.get()),
              "copying the argmax of logits");
      logits += returned * vocab;
      argmax_host += argmaxed;
    }
    stream.synchronize();  // before the next pass rewrites pass_host
  });
  argmax_tokens = {batch_argmax.as<int32_t>(), static_cast<size_t>(argmax_count)};
  return {batch_logits.as<float>(), static_cast<size_t>(logits_count * vocab)};
}

void Transformer::State::enqueue_decoding(int64_t n, const PagedPass& paged) {
  const auto [found, first] = decoding_steps.try_emplace(n);
  DecodingStep& step = found->second;
  const auto record = [&] {
    enqueue(n, Logits::All, logits_all.as<float>(), &paged);
    argmax_rows(logits_all.as<float>(), n, config.vocab_size, argmax_device.as<int32_t>(), stream.get());
  };
  if (first || !step.capturable) {
    const int64_t gemms = products.gemms();
    record();
    step.capturable = products.gemms() == gemms;
    return;
  }
  if (!step.graph.ready()) {
    // A capture records launches, not uploads: every weight must be on the device before.
    preload_from(plan, first_layer);
    step.graph.capture(stream.get(), record);
  }
  step.graph.launch(stream.get());
}

void Transformer::State::copy_block(model::BlockId source, model::BlockId destination) {
  if (source == destination) return;  // copies never overlap otherwise
  const int64_t block_values = kKvBlockRows * shape.kv_dim();
  for (int64_t l = first_layer; l < config.n_layers; ++l)
    for (uint16_t* cache : {key_cache(l), value_cache(l)})
      check(gpuMemcpyAsync(cache + destination * block_values, cache + source * block_values,
                           static_cast<size_t>(block_values) * sizeof(uint16_t), gpuMemcpyDeviceToDevice, stream.get()),
            "copying a block of the KV cache");
}

Transformer::Transformer(const model::ExecutionPlan& plan, const TransformerOptions& options) {
  if (options.max_batch < 0) fail("max_batch must not be negative, got {}", options.max_batch);
  if (options.kv_blocks < 0) fail("kv_blocks must not be negative, got {}", options.kv_blocks);
  if (options.float_activations && !ROCMFORGE_GPU_BLAS)
    fail("float activations run as GEMMs, and this build has no BLAS for the GPU (hipBLAS was not found)");
  DeviceResidency& weights = device_residency(plan);
  const int64_t first_layer = weights.first_layer();
  if (options.kv_blocks > 0 && first_layer > 0)
    fail("a paged KV cache needs every layer on the GPU: this plan's residency holds layers {}.. only", first_layer);
  check_supported(plan, attention_shape(plan.config()), first_layer);
  // Refuse a model that does not fit before anything is uploaded: weights and KV cache before the cache is
  // allocated (the smallest the passes may take: sliding-window layers' rings hold their window and one pass), then
  // once more with the activations, measured as what allocating the state took beyond it.
  const uint64_t free_before = memory_info().free_bytes;
  const uint64_t available = options.device_memory > 0 ? std::min(free_before, options.device_memory) : free_before;
  const int64_t kv_positions = context_of(plan.config(), options);
  const auto kv_cache_bytes = [&](int64_t pass_tokens) {
    const std::vector<int64_t> starts =
        cache_starts(plan.config(), first_layer, kv_positions, pass_tokens, options.kv_blocks > 0);
    return 2 * cache_bytes(plan.config(), starts.back());
  };
  DeviceMemoryNeed need{.weights = weights.unallocated_bytes(),
                        .kv_cache = kv_cache_bytes(options.max_batch > 0 ? options.max_batch : kShortPassTokens),
                        .context = kv_positions};
  require_fits(need, available);
  TransformerOptions pass = options;
  pass.max_batch = options.max_batch > 0 ? options.max_batch : kDefaultPassTokens;
  const auto allocate = [&] {
    need.kv_cache = kv_cache_bytes(pass.max_batch);
    state_ = std::make_unique<State>(plan, first_layer, pass);
    const uint64_t taken = free_before - std::min(free_before, memory_info().free_bytes);
    need.activations = taken - std::min(taken, need.kv_cache);
    require_fits(need, available);
  };
  if (options.max_batch > 0) {
    allocate();
  } else {
    try {
      allocate();
    } catch (const Error&) {
      state_.reset();  // gives its memory back before the shorter passes' is measured
      pass.max_batch = kShortPassTokens;
      allocate();
    }
  }
  weights.start_streaming();
}

Transformer::~Transformer() = default;

int64_t Transformer::cached() const { return state_->cached; }
int64_t Transformer::context() const { return state_->context; }
int64_t Transformer::kv_blocks() const { return state_->kv_blocks; }
int64_t Transformer::max_batch() const { return state_->max_batch; }
std::span<const int32_t> Transformer::argmax() const { return state_->argmax_tokens; }
bool Transformer::decodes_in_chains() const { return state_->chained; }
const model::ModelConfig& Transformer::config() const { return state_->config; }

void Transformer::truncate(int64_t positions) {
  state_->check_contiguous();
  state_->truncate(positions);
}

// Counts the rings of every layer, those that run on the CPU too: at worst it drops positions it could keep.
void Transformer::State::truncate(int64_t positions) {
  if (positions < 0 || positions > cached)
    fail("cannot truncate the KV cache to {} positions: it holds {}", positions, cached);
  cached = model::positions_after_truncate(config, context, max_batch, written, positions);
  if (cached == 0) written = 0;
}

std::span<const float> Transformer::forward(std::span<const int32_t> tokens, int64_t position, Logits which) {
  State& s = *state_;
  s.check_contiguous();
  if (s.first_layer > 0)
    fail("this GPU transformer runs layers {}.. only: it takes the residual stream of the layers before",
         s.first_layer);
  model::check_tokens(s.config, tokens);
  return s.run(static_cast<int64_t>(tokens.size()), position, which, [&](int64_t start, int64_t count) {
    std::copy_n(tokens.begin() + start, count, s.step_host.as<int32_t>() + 1);
  });
}

std::span<const float> Transformer::forward(std::span<const float> hidden, int64_t position, Logits which) {
  State& s = *state_;
  const int64_t width = s.config.n_embd;
  s.check_contiguous();
  if (s.first_layer == 0) fail("this GPU transformer runs every layer: it takes tokens, not a residual stream");
  if (hidden.size() % static_cast<size_t>(width) != 0)
    fail("forward: {} floats are not whole rows of the residual stream ({} values)", hidden.size(), width);
  return s.run(static_cast<int64_t>(hidden.size()) / width, position, which, [&](int64_t start, int64_t count) {
    std::copy_n(hidden.begin() + start * width, count * width, s.hidden_host.as<float>());
  });
}

std::span<const float> Transformer::forward(std::span<const model::BatchSequence> batch,
                                            std::span<const model::BlockCopy> copies) {
  State& s = *state_;
  if (s.kv_blocks == 0) return model::ForwardPass::forward(batch, copies);
  model::check_batch(s.config, batch, copies, s.kv_blocks);
  // A table for more positions than the pool holds repeats blocks; the rotary angles cover the pool's positions.
  for (const model::BatchSequence& sequence : batch)
    if (sequence.position + count(sequence.tokens) > s.context)
      fail("{} tokens at position {} pass the {} positions of the KV cache's {} blocks", sequence.tokens.size(),
           sequence.position, s.context, s.kv_blocks);
  for (const model::BlockCopy& copy : copies) s.copy_block(copy.source, copy.destination);
  return s.run_batch(batch);
}

}  // namespace rf::gpu
