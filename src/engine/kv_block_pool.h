// The bookkeeping of a paged KV cache that many sequences share, as vLLM's block manager with automatic prefix
// caching keeps it. The pool has `blocks` blocks of `block_positions` positions; the keys and values of a
// sequence's position p live in block table[p / block_positions] of its block table, slot p % block_positions.
// Backends own the memory and index it by these block ids; the pool only decides which block holds what.
//
// A block is held by the tables of one or more sequences (reference counted), or free: unused, or cached. A full
// block whose positions have been computed is cached under a hash of its tokens chained with the hash of the
// blocks before it, with its tokens and its predecessor, so a sequence that starts with the same tokens takes it
// instead of computing them again, and a hash collision never hands out a wrong block. A cached block that no
// sequence holds stays cached until a free block is needed; then the least recently used one is evicted.
// Cached blocks are never written, and neither are blocks that several sequences hold: reserve() replaces such a
// block with a fresh one before its sequence writes into it, and reports the rows to copy (copy on write).
//
// Each sequence goes: start (takes its cached prefix); per step reserve(n), the copies it returns, the forward
// pass writing n positions, mark_computed(n); append() adds generated tokens; fork, truncate, release. The stats
// count a started sequence's prefix at its first successful reserve(), so a start that release() undoes for want of
// blocks (and retries later) counts nothing.
// Not thread-safe: the scheduler thread owns the pool.
#pragma once
#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "model/forward_pass.h"

namespace rf::engine {

using SequenceId = int64_t;
using model::BlockCopy;
using model::BlockId;

// The hash of a full block's tokens chained with `parent`, the hash of the blocks before it (0 for the first).
using BlockHasher = uint64_t (*)(uint64_t parent, std::span<const int32_t> tokens);
uint64_t hash_block(uint64_t parent, std::span<const int32_t> tokens);

class KvBlockPool {
 public:
  struct Stats {
    int64_t blocks = 0;            // in the pool: free + used
    int64_t free = 0;              // held by no sequence: unused, or evictable
    int64_t evictable = 0;         // free blocks still cached: a prefix can take them until they are evicted
    int64_t used = 0;              // held by at least one sequence
    int64_t prefix_lookups = 0;    // sequences started that got their first reservation
    int64_t reused_blocks = 0;     // cached blocks that those sequences took when they started
    int64_t reused_positions = 0;  // the positions those hold: not computed again
    int64_t evictions = 0;         // cached blocks taken for other positions
    bool operator==(const Stats&) const = default;
  };

  // `hasher`: hash_block; tests pass weak ones to provoke collisions.
  explicit KvBlockPool(int64_t blocks, int64_t block_positions = model::kKvBlockPositions, BlockHasher hasher = hash_block);

  int64_t blocks() const { return static_cast<int64_t>(blocks_.size()); }
  int64_t block_positions() const { return block_positions_; }
  // Blocks that reserve() can hand out: unused ones, then evictable ones.
  int64_t free_blocks() const { return static_cast<int64_t>(unused_.size() + lru_.size()); }
  Stats stats() const;

  // Adds sequence `id` with its prompt and gives it the cached blocks of the prompt's longest cached prefix of
  // whole blocks, short of the last token (whose logits are still to compute). Returns the positions those
  // blocks hold, which count as computed: the prompt's evaluation starts there.
  int64_t start(SequenceId id, std::span<const int32_t> prompt);
  // Adds tokens after the sequence's (the generated ones), to be computed.
  void append(SequenceId id, std::span<const int32_t> tokens);
  // Makes the next `positions` positions after the computed ones writable: adds blocks, and replaces the block
  // being filled by a fresh one where other sequences hold it or it is cached. Returns the copies to make before
  // this step writes any position, in the order given across the step's reserve() calls (a source may be handed
  // out again by a later reserve()), or std::nullopt, changing nothing, where the pool has too few free blocks.
  [[nodiscard]] std::optional<std::vector<BlockCopy>> reserve(SequenceId id, int64_t positions);
  // Says that the next `positions` positions, reserved and with their tokens known, now hold their keys and
  // values. Each block they fill becomes cached.
  void mark_computed(SequenceId id, int64_t positions);
  // Adds sequence `child` with the tokens of `parent` and the blocks holding its computed positions (the
  // choices of an n > 1 request). Both reserve again before writing.
  void fork(SequenceId parent, SequenceId child);
  // Drops the sequence's tokens, computed positions and reservations from `positions` on, and its blocks past them.
  void truncate(SequenceId id, int64_t positions);
  // Removes the sequence (finished, cancelled, preempted) at once: the blocks no other holds become free.
  void release(SequenceId id);

  bool contains(SequenceId id) const { return sequences_.contains(id); }
  std::span<const BlockId> table(SequenceId id) const { return sequence(id).table; }
  std::span<const int32_t> tokens(SequenceId id) const { return sequence(id).tokens; }
  int64_t computed(SequenceId id) const { return sequence(id).computed; }
  // How many block tables hold `block`.
  int32_t references(BlockId block) const;
  // Checks every invariant of the pool against every table and throws an rf::Error naming the first one broken.
  // For tests and debugging: it walks every block and every table.
  void verify() const;

 private:
  struct Block {
    int32_t references = 0;
    // Cached blocks only: its number among all registrations (0: not cached), the key under which cache_ holds
    // it, and the registration of the block before it (0: the first block of a sequence).
    uint64_t registration = 0;
    uint64_t hash = 0;
    uint64_t parent = 0;
    std::list<BlockId>::iterator lru;  // its entry in lru_ while evictable
  };
  struct Sequence {
    std::vector<int32_t> tokens;
    std::vector<BlockId> table;
    int64_t computed = 0;  // positions that hold their keys and values
    int64_t reserved = 0;  // positions that can be written (from `computed` on): reserve() made their blocks so
    // Started sequences until their first successful reserve(): the blocks their prefix took, not in the stats yet.
    std::optional<int64_t> uncounted_prefix;
  };

  Sequence& sequence(SequenceId id);
  const Sequence& sequence(SequenceId id) const;
  int64_t blocks_for(int64_t positions) const { return (positions + block_positions_ - 1) / block_positions_; }
  bool writable(BlockId block) const { return blocks_[block].references == 1 && blocks_[block].registration == 0; }
  std::span<const int32_t> cached_tokens(BlockId block) const;
  // A block held once: an unused one, else the least recently used evictable one, evicted.
  BlockId allocate();
  void hold(BlockId block);
  // One reference less; the last makes the block unused, or evictable where it is cached.
  void drop(BlockId block);
  // Caches block `index` of the sequence, just filled, unless the block before it is not cached (no lookup can
  // reach it) or its hash is taken (an equal block computed by another sequence, or a collision).
  void cache(const Sequence& sequence, int64_t index);

  int64_t block_positions_;
  BlockHasher hasher_;
  std::vector<Block> blocks_;
  std::vector<int32_t> cached_tokens_;  // block b's at [b * block_positions_, (b + 1) * block_positions_)
  std::vector<BlockId> unused_;         // free and not cached
  std::list<BlockId> lru_;              // evictable (free and cached), least recently used first
  std::unordered_map<uint64_t, BlockId> cache_;
  std::unordered_map<SequenceId, Sequence> sequences_;
  uint64_t registrations_ = 0;
  int64_t prefix_lookups_ = 0;
  int64_t reused_blocks_ = 0;
  int64_t evictions_ = 0;
};

}  // namespace rf::engine
