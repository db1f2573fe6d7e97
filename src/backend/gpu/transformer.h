// The forward pass on a GPU: the computation of cpu::Transformer (backend/cpu/transformer.h) with the
// same interface, so that a caller can run either backend. Weights stay in device memory in their stored
// types (gpu::DeviceResidency); activations are f32, the KV cache f16, all in device memory. Constructing a
// Transformer checks that weights, KV cache and activations fit in device memory and starts streaming the
// weights in execution order; a forward pass waits for each layer just before running it, so the first
// prompt is computed while later layers still arrive. A decoding step (one token) is captured once as a
// graph (CUDA graph / hipGraph), once every weight is resident, and replayed for every later token: the
// token and its position travel to the device as data, so the recorded launches never change. A transformer
// may run the last layers only (and the output), the layers before it running on the CPU: it then takes the
// residual stream those layers made instead of tokens (make_residency's first_layer). A transformer with a paged KV
// cache (TransformerOptions::kv_blocks) evaluates batches of many sequences instead, without chains; its decoding
// steps (a token of each sequence) replay a graph captured for their number of rows, the rows' tokens, positions and
// block tables travelling as data, which finds every row's argmax for the rows that ask for no more.
#pragma once
#include <cstdint>
#include <memory>
#include <span>

#include "model/execution_plan.h"
#include "model/forward_pass.h"

namespace rf::gpu {

// The KV cache holds the model's context length, capped here unless the caller asks for more.
constexpr int64_t kDefaultContext = 8192;

// Tokens a pass takes unless the caller says (a longer batch runs as several passes). A prompt pass dequantizes every
// quantized weight matrix once for its GEMMs, so longer passes spread that over more tokens: passes of 2048 were
// faster on an H200 than passes of 512 for long prompts, and 4096 added little. The activations of a pass are
// allocated up front: where those of kDefaultPassTokens do not fit beside the weights and the KV cache, passes take
// kShortPassTokens.
constexpr int64_t kDefaultPassTokens = 2048;
constexpr int64_t kShortPassTokens = 512;

struct TransformerOptions {
  int64_t context = 0;    // positions the KV cache holds; 0: min(model context, kDefaultContext)
  int64_t max_batch = 0;  // tokens per pass; 0: kDefaultPassTokens, or kShortPassTokens where those do not fit
  bool graphs = true;     // replay decoding steps from a captured graph
  // Device memory the model may take (weights, KV cache, activations); 0: what the device has free.
  uint64_t device_memory = 0;
  // Whether decode steps run the products after each attention as one persistent launch (product_chain), where the
  // device and the weights allow it: Auto where a layer's weights are large enough to gain (transformer.cpp).
  enum class Chains { Auto, Always, Never } chains = Chains::Auto;
  // Products take the f16 form of f32 activations, as GEMMs with quantized weights dequantized to f16, instead
  // of 8-bit blocks (cpu::TransformerOptions::float_activations); no chains. Needs cuBLAS or hipBLAS.
  bool float_activations = false;
  // Blocks of model::kKvBlockPositions positions in a paged KV cache, for batches of sequences (forward(batch,
  // copies)) instead of one sequence; 0: one sequence's cache of `context` positions. Every layer keeps a row for
  // each position of its blocks (sliding-window layers too), and the plan must hold every layer.
  int64_t kv_blocks = 0;
};

using model::Logits;

// The residency a plan must be built with to run here (gpu::DeviceResidency): 8 reader threads (at most one
// per hardware thread) and a progress bar on a terminal while loading takes longer than a moment. It holds
// layers first_layer.. and the output: a transformer on its plan runs those.
std::shared_ptr<model::Residency> make_residency(int64_t first_layer = 0);

class Transformer final : public model::ForwardPass {
 public:
  // Allocates the KV cache and the activations on the device and starts streaming the plan's weights; returns
  // without waiting for them. A model the kernels cannot run (a head dimension above 256, rows of float
  // weights that are not a multiple of 8 values, ...), a plan not built with make_residency(), and a model
  // whose weights, KV cache and activations do not fit in device memory (TransformerOptions::device_memory)
  // are rf::Errors naming what is wrong, raised before any weight is uploaded.
  explicit Transformer(const model::ExecutionPlan& plan, const TransformerOptions& options = {});
  ~Transformer();
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  std::span<const float> forward(std::span<const int32_t> tokens, int64_t position,
                                 Logits which = Logits::Last) override;
  // The same for a transformer on a residency from layer F > 0 on (make_residency(F)): `hidden` holds the
  // residual stream after layer F - 1, n_embd floats per token (cpu::Transformer::forward_hidden).
  std::span<const float> forward(std::span<const float> hidden, int64_t position, Logits which = Logits::Last);

  // A paged transformer's (kv_blocks > 0) passes over many sequences: one set of products for all the rows of a
  // pass, each row attending to its own sequence's blocks.
  std::span<const float> forward(std::span<const model::BatchSequence> batch,
                                 std::span<const model::BlockCopy> copies) override;
  // The argmax of the last batch's Argmax sequences, found on the device: only they come to the host.
  std::span<const int32_t> argmax() const override;

  int64_t cached() const override;
  void truncate(int64_t positions) override;
  int64_t context() const override;
  int64_t kv_blocks() const override;
  int64_t max_batch() const override;
  // Whether decode steps run the products after each attention as chains (TransformerOptions::chains).
  bool decodes_in_chains() const;
  const model::ModelConfig& config() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace rf::gpu
