// What every backend's forward pass offers the engine, and the checks and KV cache layout they share, so that the
// engine runs a CPU and a GPU transformer through one interface.
#pragma once
#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "model/config.h"

namespace rf::model {

// Which logits forward() returns.
enum class Logits {
  Last,  // of the last token only (generation)
  All,   // of every token, row by row (evaluation, perplexity)
  None,  // none: a chunk of a prompt that later chunks continue (batches only)
  // Of the last token, as Last, but only the index of its largest logit is returned (ForwardPass::argmax; the first
  // of equal ones, util/argmax.h), computed where the logits are: what a greedy step needs (batches only).
  Argmax,
};

// A paged KV cache (engine::KvBlockPool decides which block holds what) keeps a sequence's position p in block
// table[p / kKvBlockPositions] of its block table, slot p % kKvBlockPositions; the blocks of every layer share ids.
constexpr int64_t kKvBlockPositions = 16;
using BlockId = int32_t;

// The blocks that hold `positions` positions.
inline int64_t kv_blocks_for(int64_t positions) { return (positions + kKvBlockPositions - 1) / kKvBlockPositions; }

// A block whose keys and values (of every layer) are copied into another before a batch writes (copy on write).
struct BlockCopy {
  BlockId source;
  BlockId destination;
  bool operator==(const BlockCopy&) const = default;
};

// One sequence's part of a batch: `tokens` at positions position, position + 1, ..., whose keys and values the pass
// writes into the blocks of `blocks` (the sequence's block table, covering every position up to the last token's),
// and whose queries see the positions before them there.
struct BatchSequence {
  std::span<const int32_t> tokens;
  int64_t position = 0;
  std::span<const BlockId> blocks;
  Logits logits = Logits::Last;
};

class ForwardPass {
 public:
  virtual ~ForwardPass() = default;
  // Evaluates `tokens` at positions position, position + 1, ...: positions from `position` on are first dropped
  // from the cache (position <= cached()), then the tokens' keys and values are added. Returns the logits
  // (vocab_size floats per row) of the last token or of all tokens; the span stays valid until the next call.
  // A token id out of range, a position past the cache or past the context, or one that truncate(position) would
  // not keep, is an rf::Error.
  virtual std::span<const float> forward(std::span<const int32_t> tokens, int64_t position, Logits which) = 0;
  virtual int64_t cached() const = 0;  // positions in the KV cache
  // Drops the cached positions from `positions` on (positions <= cached()). It may drop more: where a sliding-window
  // layer keeps a ring (kv_cache_rows), positions newer than `positions` have overwritten older keys, and once those
  // include keys that the next query (at `positions`) sees, the cache keeps nothing (positions_after_truncate). So
  // a caller continues from cached(), not from `positions`.
  virtual void truncate(int64_t positions) = 0;
  virtual int64_t context() const = 0;  // positions the KV cache holds at most

  // A pass constructed with a paged KV cache of kv_blocks() > 0 blocks evaluates batches of many sequences instead
  // (the single-sequence calls above are then rf::Errors): first the copies, in order, then every sequence's tokens
  // in one pass per max_batch() tokens, each weight read once per pass. Returns the logits each sequence asks for,
  // in the batch's order (Last: one row, All: one per token, None and Argmax: none); valid until the next call. A
  // token out of range, a block id outside the pool, a table too short for its positions, or positions past the
  // model's learned ones are rf::Errors raised before anything is computed.
  virtual std::span<const float> forward(std::span<const BatchSequence> batch, std::span<const BlockCopy> copies);
  // The tokens of the last batch's Argmax sequences, in the batch's order: each the index of the largest logit of
  // its last token; valid until the next call.
  virtual std::span<const int32_t> argmax() const { return {}; }
  virtual int64_t kv_blocks() const { return 0; }
  virtual int64_t max_batch() const = 0;  // tokens per pass
};

// The logits rows a sequence of a batch gets back: one (Last), one per token (All) or none (None, Argmax).
inline int64_t logits_rows(const BatchSequence& sequence) {
  const auto tokens = static_cast<int64_t>(sequence.tokens.size());
  return sequence.logits == Logits::All ? tokens : sequence.logits == Logits::Last ? 1 : 0;
}

// The logits rows a pass computes for a sequence of a batch: those it gets back, or the row whose argmax it gets.
inline int64_t computed_logits_rows(const BatchSequence& sequence) {
  return sequence.logits == Logits::Argmax ? 1 : logits_rows(sequence);
}

// Cuts `batch` into passes of at most max_batch tokens, its sequences in order, and calls pass(parts) for each: a
// sequence that does not fit continues in the next pass and asks for its last token's logits (or their argmax) in
// the part that holds it. `parts` is the caller's scratch, kept across calls so that steady decoding allocates nothing.
template <typename Pass>
void for_each_pass(std::span<const BatchSequence> batch, int64_t max_batch, std::vector<BatchSequence>& parts,
                   const Pass& pass) {
  size_t next = 0;   // the sequence to run next
  int64_t done = 0;  // its tokens that earlier passes ran
  while (next < batch.size()) {
    parts.clear();
    for (int64_t rows = 0; rows < max_batch && next < batch.size();) {
      const BatchSequence& sequence = batch[next];
      const auto tokens = static_cast<int64_t>(sequence.tokens.size());
      const int64_t n = std::min(max_batch - rows, tokens - done);
      const bool last = done + n == tokens;
      parts.push_back({sequence.tokens.subspan(static_cast<size_t>(done), static_cast<size_t>(n)),
                       sequence.position + done, sequence.blocks,
                       last || sequence.logits == Logits::All ? sequence.logits : Logits::None});
      rows += n;
      done = last ? 0 : done + n;
      next += last;
    }
    pass(std::span<const BatchSequence>(parts));
  }
}

// An rf::Error naming what in a batch for a pool of `kv_blocks` blocks is wrong (ForwardPass::forward's checks).
void check_batch(const ModelConfig& config, std::span<const BatchSequence> batch, std::span<const BlockCopy> copies,
                 int64_t kv_blocks);

// An rf::Error where a single-sequence forward() is asked for what only a batch returns (Logits::Argmax).
void check_single_sequence(Logits which);

// An rf::Error naming a token id outside the vocabulary.
void check_tokens(const ModelConfig& config, std::span<const int32_t> tokens);
// An rf::Error unless n > 0 tokens at `position` follow the `cached` positions (position <= cached) within
// `context` positions and, for learned positions, within the model's context length.
void check_positions(const ModelConfig& config, int64_t n, int64_t position, int64_t cached, int64_t context);

// Rows of layer `layer`'s KV cache, for a cache of `context` positions filled by passes of at most `max_batch` tokens.
// A sliding-window layer keeps a ring of sliding_window + max_batch rows (position p in row p % rows: every query of
// a pass still finds its whole window after the pass stored its own keys) where that is fewer than `context`; every
// other layer keeps a row for each position.
// Ring rows are whole blocks of kKvBlockPositions, so that a ring is a block table that wraps.
int64_t kv_cache_rows(const ModelConfig& config, int64_t layer, int64_t context, int64_t max_batch);
// What such a cache still holds when truncated to `positions`, having stored positions below `written` since it was
// last empty: `positions`, or 0 where a ring has overwritten keys that the next query sees. A ring of `rows` rows
// holds positions written - rows and later, and the next query, at `positions`, sees those from
// positions - sliding_window + 1 on: so the newest position stored may lie up to the ring's slack over the window
// (max_batch) past `positions`.
int64_t positions_after_truncate(const ModelConfig& config, int64_t context, int64_t max_batch, int64_t written,
                                 int64_t positions);
// An rf::Error unless a cache truncated to `position` by forward() kept it (`kept`: the positions it holds now).
void check_kept(int64_t position, int64_t kept);

}  // namespace rf::model
