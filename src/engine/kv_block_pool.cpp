#include "engine/kv_block_pool.h"

#include <algorithm>
#include <limits>

#include "util/error.h"

namespace rf::engine {

namespace {

// splitmix64's finalizer: every input bit flips about half the output bits.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void require_not_negative(SequenceId id, int64_t positions) {
  if (positions < 0) fail("KV block pool: {} positions for sequence {}", positions, id);
}

}  // namespace

uint64_t hash_block(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t hash = mix(parent);
  for (const int32_t token : tokens) hash = mix(hash ^ static_cast<uint32_t>(token));
  return hash;
}

KvBlockPool::KvBlockPool(int64_t blocks, int64_t block_positions, BlockHasher hasher)
    : block_positions_(block_positions), hasher_(hasher) {
  constexpr int64_t kMost = std::numeric_limits<int32_t>::max();
  if (blocks <= 0 || blocks > kMost || block_positions <= 0 || block_positions > kMost) {
    fail("KV block pool: {} blocks of {} positions (each must be 1 to {})", blocks, block_positions, kMost);
  }
  blocks_.resize(static_cast<size_t>(blocks));
  cached_tokens_.resize(static_cast<size_t>(blocks * block_positions));
  // Handed out from the back: block 0 first.
  for (int64_t b = blocks - 1; b >= 0; --b) unused_.push_back(static_cast<BlockId>(b));
}

KvBlockPool::Stats KvBlockPool::stats() const {
  Stats stats;
  stats.blocks = blocks();
  stats.free = free_blocks();
  stats.evictable = static_cast<int64_t>(lru_.size());
  stats.used = stats.blocks - stats.free;
  stats.prefix_lookups = prefix_lookups_;
  stats.reused_blocks = reused_blocks_;
  stats.reused_positions = reused_blocks_ * block_positions_;
  stats.evictions = evictions_;
  return stats;
}

int64_t KvBlockPool::start(SequenceId id, std::span<const int32_t> prompt) {
  if (contains(id)) fail("KV block pool: sequence {} already exists", id);
  Sequence& started = sequences_[id];
  started.tokens.assign(prompt.begin(), prompt.end());
  const int64_t reusable = prompt.empty() ? 0 : (static_cast<int64_t>(prompt.size()) - 1) / block_positions_;
  uint64_t hash = 0;
  uint64_t parent = 0;
  for (int64_t index = 0; index < reusable; ++index) {
    const std::span<const int32_t> tokens = prompt.subspan(index * block_positions_, block_positions_);
    hash = hasher_(hash, tokens);
    const auto found = cache_.find(hash);
    if (found == cache_.end()) break;
    const BlockId block = found->second;
    if (blocks_[block].parent != parent || !std::ranges::equal(cached_tokens(block), tokens)) break;
    hold(block);
    started.table.push_back(block);
    parent = blocks_[block].registration;
  }
  started.uncounted_prefix = static_cast<int64_t>(started.table.size());
  started.computed = started.reserved = static_cast<int64_t>(started.table.size()) * block_positions_;
  return started.computed;
}

void KvBlockPool::append(SequenceId id, std::span<const int32_t> tokens) {
  std::vector<int32_t>& sequence_tokens = sequence(id).tokens;
  sequence_tokens.insert(sequence_tokens.end(), tokens.begin(), tokens.end());
}

std::optional<std::vector<BlockCopy>> KvBlockPool::reserve(SequenceId id, int64_t positions) {
  require_not_negative(id, positions);
  Sequence& reserving = sequence(id);
  const int64_t end = reserving.computed + positions;
  // Only the block being filled can be shared or cached: blocks past it hold no computed position, so neither
  // a prefix, a fork nor the cache ever got them.
  const int64_t filling = reserving.computed / block_positions_;
  const bool copy = positions > 0 && reserving.computed % block_positions_ != 0 &&
                    !writable(reserving.table[static_cast<size_t>(filling)]);
  const int64_t added = std::max<int64_t>(0, blocks_for(end) - static_cast<int64_t>(reserving.table.size()));
  if (added + (copy ? 1 : 0) > free_blocks()) return std::nullopt;
  if (reserving.uncounted_prefix) {
    ++prefix_lookups_;
    reused_blocks_ += *reserving.uncounted_prefix;
    reserving.uncounted_prefix.reset();
  }
  std::vector<BlockCopy> copies;
  if (copy) {
    BlockId& slot = reserving.table[static_cast<size_t>(filling)];
    const BlockId source = slot;
    slot = allocate();
    drop(source);
    copies.push_back({source, slot});
  }
  for (int64_t b = 0; b < added; ++b) reserving.table.push_back(allocate());
  reserving.reserved = std::max(reserving.reserved, end);
  return copies;
}

void KvBlockPool::mark_computed(SequenceId id, int64_t positions) {
  require_not_negative(id, positions);
  Sequence& computing = sequence(id);
  const int64_t end = computing.computed + positions;
  if (end > computing.reserved) {
    fail("KV block pool: sequence {} marks positions {} to {} computed without reserving them (reserved up to {})",
         id, computing.computed, end - 1, computing.reserved);
  }
  if (end > static_cast<int64_t>(computing.tokens.size())) {
    fail("KV block pool: sequence {} has {} tokens: positions up to {} cannot be computed", id,
         computing.tokens.size(), end - 1);
  }
  for (int64_t index = computing.computed / block_positions_; index < end / block_positions_; ++index) {
    cache(computing, index);
  }
  computing.computed = end;
}

void KvBlockPool::fork(SequenceId parent, SequenceId child) {
  if (contains(child)) fail("KV block pool: cannot fork sequence {} into {}, which already exists", parent, child);
  Sequence& forked = sequence(parent);
  Sequence copy;
  copy.tokens = forked.tokens;
  const auto computed_blocks = forked.table.begin() + blocks_for(forked.computed);
  copy.table.assign(forked.table.begin(), computed_blocks);
  for (const BlockId block : copy.table) hold(block);
  copy.computed = copy.reserved = forked.computed;
  // The block being filled may be shared now: the parent, too, reserves (and copies) before writing into it.
  forked.reserved = forked.computed;
  sequences_.emplace(child, std::move(copy));
}

void KvBlockPool::truncate(SequenceId id, int64_t positions) {
  require_not_negative(id, positions);
  Sequence& truncated = sequence(id);
  if (positions > static_cast<int64_t>(truncated.tokens.size())) {
    fail("KV block pool: cannot truncate sequence {} of {} tokens to {}", id, truncated.tokens.size(), positions);
  }
  truncated.tokens.resize(static_cast<size_t>(positions));
  // The last block first, as release() does.
  while (static_cast<int64_t>(truncated.table.size()) > blocks_for(positions)) {
    drop(truncated.table.back());
    truncated.table.pop_back();
  }
  truncated.computed = std::min(truncated.computed, positions);
  truncated.reserved = std::min(truncated.reserved, positions);
}

void KvBlockPool::release(SequenceId id) {
  const Sequence& released = sequence(id);
  // The last block first: it becomes the least recently used, and a prefix's later blocks are useless without
  // its earlier ones.
  for (auto block = released.table.rbegin(); block != released.table.rend(); ++block) drop(*block);
  sequences_.erase(id);
}

int32_t KvBlockPool::references(BlockId block) const {
  if (block < 0 || block >= blocks()) fail("KV block pool: no block {} (the pool has {})", block, blocks());
  return blocks_[block].references;
}

void KvBlockPool::verify() const {
  std::vector<int32_t> holders(blocks_.size(), 0);
  for (const auto& [id, checked] : sequences_) {
    const int64_t capacity = static_cast<int64_t>(checked.table.size()) * block_positions_;
    if (checked.computed > checked.reserved || checked.reserved > capacity ||
        checked.computed > static_cast<int64_t>(checked.tokens.size())) {
      fail("KV block pool: sequence {} has {} computed, {} reserved positions, {} tokens and {} blocks", id,
           checked.computed, checked.reserved, checked.tokens.size(), checked.table.size());
    }
    std::vector<BlockId> sorted = checked.table;
    std::ranges::sort(sorted);
    if (std::ranges::adjacent_find(sorted) != sorted.end()) fail("KV block pool: sequence {} holds a block twice", id);
    for (size_t index = 0; index < checked.table.size(); ++index) {
      const BlockId block = checked.table[index];
      ++holders[block];
      const int64_t first = static_cast<int64_t>(index) * block_positions_;
      // Written later: a block past the computed positions, or the one being filled once it is reserved.
      const bool written_later = first >= checked.computed ||
                                 (first + block_positions_ > checked.computed && checked.reserved > checked.computed);
      if (written_later && !writable(block)) {
        fail("KV block pool: sequence {} will write into block {}, which is shared or cached", id, block);
      }
      if (blocks_[block].registration == 0) continue;
      const int64_t held = std::min(block_positions_, checked.computed - first);
      if (held <= 0 || !std::ranges::equal(cached_tokens(block).first(static_cast<size_t>(held)),
                                           std::span(checked.tokens).subspan(static_cast<size_t>(first),
                                                                             static_cast<size_t>(held)))) {
        fail("KV block pool: sequence {} holds cached block {} at positions whose tokens differ", id, block);
      }
    }
  }
  std::vector<int32_t> places(blocks_.size(), 0);
  for (const BlockId block : unused_) {
    ++places[block];
    if (blocks_[block].registration != 0) fail("KV block pool: unused block {} is cached", block);
  }
  for (auto entry = lru_.begin(); entry != lru_.end(); ++entry) {
    ++places[*entry];
    if (blocks_[*entry].registration == 0 || blocks_[*entry].lru != entry) {
      fail("KV block pool: evictable block {} is not cached at its place", *entry);
    }
  }
  size_t registered = 0;
  for (size_t block = 0; block < blocks_.size(); ++block) {
    if (blocks_[block].references != holders[block]) {
      fail("KV block pool: block {} counts {} references, {} tables hold it", block, blocks_[block].references,
           holders[block]);
    }
    if (places[block] != (holders[block] == 0 ? 1 : 0)) {
      fail("KV block pool: block {}, held {} times, is in {} free lists", block, holders[block], places[block]);
    }
    if (blocks_[block].registration == 0) continue;
    ++registered;
    const auto found = cache_.find(blocks_[block].hash);
    if (found == cache_.end() || found->second != static_cast<BlockId>(block)) {
      fail("KV block pool: cached block {} is not under its hash", block);
    }
  }
  if (registered != cache_.size()) fail("KV block pool: {} cached blocks, {} hashes", registered, cache_.size());
}

KvBlockPool::Sequence& KvBlockPool::sequence(SequenceId id) {
  const auto found = sequences_.find(id);
  if (found == sequences_.end()) fail("KV block pool: no sequence {} (never started, or released)", id);
  return found->second;
}

const KvBlockPool::Sequence& KvBlockPool::sequence(SequenceId id) const {
  const auto found = sequences_.find(id);
  if (found == sequences_.end()) fail("KV block pool: no sequence {} (never started, or released)", id);
  return found->second;
}

std::span<const int32_t> KvBlockPool::cached_tokens(BlockId block) const {
  return std::span(cached_tokens_).subspan(static_cast<size_t>(block) * block_positions_, block_positions_);
}

BlockId KvBlockPool::allocate() {
  BlockId block;
  if (!unused_.empty()) {
    block = unused_.back();
    unused_.pop_back();
  } else {
    block = lru_.front();
    lru_.pop_front();
    cache_.erase(blocks_[block].hash);
    blocks_[block].registration = 0;
    ++evictions_;
  }
  blocks_[block].references = 1;
  return block;
}

void KvBlockPool::hold(BlockId block) {
  // A free block that a sequence takes is evictable: start() takes only cached blocks, fork() only held ones.
  if (blocks_[block].references++ == 0) lru_.erase(blocks_[block].lru);
}

void KvBlockPool::drop(BlockId block) {
  Block& dropped = blocks_[block];
  if (--dropped.references > 0) return;
  if (dropped.registration == 0) {
    unused_.push_back(block);
  } else {
    dropped.lru = lru_.insert(lru_.end(), block);
  }
}

void KvBlockPool::cache(const Sequence& filled, int64_t index) {
  const BlockId previous = index > 0 ? filled.table[static_cast<size_t>(index - 1)] : -1;
  if (previous >= 0 && blocks_[previous].registration == 0) return;
  const std::span<const int32_t> tokens =
      std::span(filled.tokens).subspan(static_cast<size_t>(index * block_positions_), block_positions_);
  const uint64_t hash = hasher_(previous >= 0 ? blocks_[previous].hash : 0, tokens);
  const BlockId block = filled.table[static_cast<size_t>(index)];
  if (!cache_.emplace(hash, block).second) return;
  Block& cached = blocks_[block];
  cached.registration = ++registrations_;
  cached.hash = hash;
  cached.parent = previous >= 0 ? blocks_[previous].registration : 0;
  std::ranges::copy(tokens, cached_tokens_.begin() + static_cast<ptrdiff_t>(block) * block_positions_);
}

}  // namespace rf::engine
