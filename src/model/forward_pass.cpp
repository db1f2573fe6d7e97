#include "model/forward_pass.h"

#include <algorithm>

#include "util/error.h"

namespace rf::model {

void check_tokens(const ModelConfig& config, std::span<const int32_t> tokens) {
  for (const int32_t token : tokens)
    if (token < 0 || token >= config.vocab_size)
      fail("token id {} is out of range: the vocabulary has {} tokens", token, config.vocab_size);
}

namespace {

// The rows of each sliding-window layer's ring (one window and one pass: the same for every such layer), or 0 where
// the model has no such layers or a ring would not be shorter than the context. Layer 0 slides whenever any layer
// does (l % pattern < pattern - 1 holds for l = 0 first).
int64_t ring_rows(const ModelConfig& config, int64_t context, int64_t max_batch) {
  const int64_t rows = kv_blocks_for(config.sliding_window + max_batch) * kKvBlockPositions;
  return config.sliding(0) && rows < context ? rows : 0;
}

}  // namespace

int64_t kv_cache_rows(const ModelConfig& config, int64_t layer, int64_t context, int64_t max_batch) {
  const int64_t ring = ring_rows(config, context, max_batch);
  return config.sliding(layer) && ring > 0 ? ring : context;
}

int64_t positions_after_truncate(const ModelConfig& config, int64_t context, int64_t max_batch, int64_t written,
                                 int64_t positions) {
  const int64_t ring = ring_rows(config, context, max_batch);
  const int64_t oldest_seen = std::max<int64_t>(0, positions - config.sliding_window + 1);
  return ring > 0 && oldest_seen < written - ring ? 0 : positions;
}

void check_positions(const ModelConfig& config, int64_t n, int64_t position, int64_t cached, int64_t context) {
  if (n == 0) fail("forward: no tokens to evaluate");
  if (position < 0 || position > cached)
    fail("forward: position {} is not within the {} cached positions", position, cached);
  if (position + n > context)
    fail("{} tokens at position {} do not fit in the context of {} positions", n, position, context);
  if (config.arch->positions == Positions::Learned && position + n > config.context_length)
    fail("{} tokens at position {} pass the model's {} learned positions", n, position, config.context_length);
}

std::span<const float> ForwardPass::forward(std::span<const BatchSequence>, std::span<const BlockCopy>) {
  fail("this forward pass keeps one sequence's KV cache: batches of sequences need a paged one (kv_blocks)");
}

void check_single_sequence(Logits which) {
  if (which == Logits::Argmax) fail("forward: Logits::Argmax is for batches of sequences");
}

void check_batch(const ModelConfig& config, std::span<const BatchSequence> batch, std::span<const BlockCopy> copies,
                 int64_t kv_blocks) {
  const auto check_block = [kv_blocks](BlockId block) {
    if (block < 0 || block >= kv_blocks) fail("block {} is outside the pool of {} blocks", block, kv_blocks);
  };
  for (const BlockCopy& copy : copies) {
    check_block(copy.source);
    check_block(copy.destination);
  }
  if (batch.empty()) fail("forward: an empty batch");
  for (const BatchSequence& sequence : batch) {
    const auto n = static_cast<int64_t>(sequence.tokens.size());
    if (n == 0) fail("forward: a sequence of the batch has no tokens");
    if (sequence.position < 0) fail("forward: position {} is negative", sequence.position);
    const int64_t end = sequence.position + n;
    if (static_cast<int64_t>(sequence.blocks.size()) * kKvBlockPositions < end)
      fail("forward: a block table of {} blocks does not hold positions up to {}", sequence.blocks.size(), end - 1);
    if (config.arch->positions == Positions::Learned && end > config.context_length)
      fail("{} tokens at position {} pass the model's {} learned positions", n, sequence.position,
           config.context_length);
    check_tokens(config, sequence.tokens);
    for (int64_t b = 0; b < kv_blocks_for(end); ++b)
      check_block(sequence.blocks[static_cast<size_t>(b)]);
  }
}

void check_kept(int64_t position, int64_t kept) {
  if (kept != position)
    fail("forward: the KV cache cannot continue at position {}: its sliding-window rings have overwritten keys that "
         "position sees (truncate, then continue from the {} positions it keeps)",
         position, kept);
}

}  // namespace rf::model
