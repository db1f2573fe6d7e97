// The paged KV cache's bookkeeping on its own: counts return to full, prefixes and generated tokens are reused
// block by block (whole blocks, never the last prompt token, never a wrong block on a hash collision), the least
// recently used free cached block is evicted first, a failed reservation changes nothing, forks copy on write,
// truncation gives blocks back, misuse is an rf::Error, and random interleavings of all of it keep every
// invariant, with a simulated KV memory that must always hold each sequence's own tokens.
#include "engine/kv_block_pool.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "error_of.h"

namespace rf::engine {
namespace {

using test::error_of;
using Tokens = std::vector<int32_t>;

// `count` tokens first, first + 1, ...
Tokens run_of(int32_t first, int32_t count) {
  Tokens tokens(static_cast<size_t>(count));
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

Tokens concat(Tokens a, const Tokens& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::vector<BlockId> table_of(const KvBlockPool& pool, SequenceId id) {
  const std::span<const BlockId> table = pool.table(id);
  return {table.begin(), table.end()};
}

// Reserves and computes the sequence's next `positions` positions; returns the copies reserve() asked for.
std::vector<BlockCopy> compute(KvBlockPool& pool, SequenceId id, int64_t positions) {
  const std::optional<std::vector<BlockCopy>> copies = pool.reserve(id, positions);
  if (!copies) {
    ADD_FAILURE() << "no room for " << positions << " positions of sequence " << id;
    return {};
  }
  pool.mark_computed(id, positions);
  return *copies;
}

// Computes every token of the sequence not computed yet.
std::vector<BlockCopy> compute_rest(KvBlockPool& pool, SequenceId id) {
  return compute(pool, id, static_cast<int64_t>(pool.tokens(id).size()) - pool.computed(id));
}

// Starts a sequence and computes its whole prompt; returns the positions it reused.
int64_t run_prompt(KvBlockPool& pool, SequenceId id, const Tokens& prompt) {
  const int64_t reused = pool.start(id, prompt);
  compute_rest(pool, id);
  return reused;
}

TEST(KvBlockPool, CountsReturnToFullAfterEverySequenceIsReleased) {
  KvBlockPool pool(8, 4);
  EXPECT_EQ(pool.stats(), (KvBlockPool::Stats{.blocks = 8, .free = 8}));
  run_prompt(pool, 1, run_of(0, 6));
  run_prompt(pool, 2, run_of(100, 9));
  run_prompt(pool, 3, run_of(200, 4));
  EXPECT_EQ(pool.table(1).size(), 2u);
  EXPECT_EQ(pool.table(2).size(), 3u);
  EXPECT_EQ(pool.table(3).size(), 1u);
  KvBlockPool::Stats stats = pool.stats();
  EXPECT_EQ(stats.used, 6);
  EXPECT_EQ(stats.free, 2);
  EXPECT_EQ(stats.evictable, 0);  // cached but held
  pool.verify();
  for (SequenceId id : {2, 1, 3}) pool.release(id);
  stats = pool.stats();
  EXPECT_EQ(stats.free, 8);
  EXPECT_EQ(stats.used, 0);
  EXPECT_EQ(stats.evictable, 4);  // the full blocks: 1 + 2 + 1
  EXPECT_FALSE(pool.contains(1));
  pool.verify();
}

TEST(KvBlockPool, SequencesWithACommonSystemPromptShareItsBlocks) {
  KvBlockPool pool(64);  // 16 positions a block
  const Tokens system = run_of(1000, 40);
  const Tokens first = concat(system, run_of(1, 10));
  EXPECT_EQ(run_prompt(pool, 1, first), 0);
  ASSERT_EQ(pool.table(1).size(), 4u);
  // Two whole blocks of the system prompt; the third mixes it with the first user's tokens.
  EXPECT_EQ(run_prompt(pool, 2, concat(system, run_of(2000, 7))), 32);
  const std::vector<BlockId> a = table_of(pool, 1);
  const std::vector<BlockId> b = table_of(pool, 2);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0], a[0]);
  EXPECT_EQ(b[1], a[1]);
  EXPECT_NE(b[2], a[2]);
  EXPECT_EQ(pool.references(a[0]), 2);
  EXPECT_EQ(pool.references(a[2]), 1);
  // The same prompt again: its three full blocks (48 of 50 positions), not the partial fourth.
  EXPECT_EQ(run_prompt(pool, 3, first), 48);
  const KvBlockPool::Stats stats = pool.stats();
  EXPECT_EQ(stats.prefix_lookups, 3);
  EXPECT_EQ(stats.reused_blocks, 5);
  EXPECT_EQ(stats.reused_positions, 80);
  EXPECT_EQ(stats.used, 4 + 1 + 1);
  pool.verify();
}

TEST(KvBlockPool, LeavesAtLeastOnePromptTokenToCompute) {
  KvBlockPool pool(16, 4);
  const Tokens prompt = run_of(0, 8);
  run_prompt(pool, 1, prompt);
  EXPECT_EQ(pool.start(2, prompt), 4);  // both blocks are cached, but the last token's logits are needed
  EXPECT_EQ(pool.computed(2), 4);
  EXPECT_EQ(pool.start(3, concat(prompt, {8})), 8);
  EXPECT_EQ(pool.start(4, Tokens{0}), 0);
  EXPECT_EQ(pool.start(5, Tokens{}), 0);
  pool.verify();
}

TEST(KvBlockPool, PartialBlocksAreNeverShared) {
  KvBlockPool pool(16, 4);
  const Tokens prompt = run_of(0, 6);  // a full block and half of one
  run_prompt(pool, 1, prompt);
  EXPECT_EQ(run_prompt(pool, 2, concat(prompt, {50, 51, 52})), 4);
  EXPECT_EQ(pool.table(2)[0], pool.table(1)[0]);
  EXPECT_NE(pool.table(2)[1], pool.table(1)[1]);
  EXPECT_EQ(pool.references(pool.table(1)[1]), 1);
  pool.release(1);
  pool.release(2);
  EXPECT_EQ(pool.stats().evictable, 2);  // the shared full block and sequence 2's second one; no partial block
  pool.verify();
}

TEST(KvBlockPool, GeneratedTokensAreReusedByTheNextTurn) {
  KvBlockPool pool(16, 4);
  const Tokens prompt = run_of(0, 6);
  run_prompt(pool, 1, prompt);
  // Generation: each sampled token is appended, then evaluated in the next step; the last one never is.
  const Tokens answer = {70, 71, 72, 73, 74};
  for (size_t i = 0; i < answer.size(); ++i) {
    if (i > 0) compute(pool, 1, 1);
    pool.append(1, std::span(&answer[i], 1));
  }
  EXPECT_EQ(pool.computed(1), 10);
  const std::vector<BlockId> first_turn = table_of(pool, 1);
  pool.release(1);
  // The next turn's prompt holds the answer: both full blocks (positions 0..7) come back.
  const Tokens next = concat(concat(prompt, answer), run_of(200, 5));
  EXPECT_EQ(pool.start(2, next), 8);
  EXPECT_EQ(pool.table(2)[0], first_turn[0]);
  EXPECT_EQ(pool.table(2)[1], first_turn[1]);
  pool.verify();
}

TEST(KvBlockPool, EvictsTheLeastRecentlyUsedFreeBlockFirstAndNeverAHeldOne) {
  KvBlockPool pool(4, 4);
  for (SequenceId id = 0; id < 4; ++id) run_prompt(pool, id, run_of(100 * static_cast<int32_t>(id), 4));
  for (SequenceId id : {0, 2, 1}) pool.release(id);  // sequence 3 keeps block 3
  KvBlockPool::Stats stats = pool.stats();
  EXPECT_EQ(stats.free, 3);
  EXPECT_EQ(stats.evictable, 3);
  run_prompt(pool, 10, run_of(500, 2));
  EXPECT_EQ(table_of(pool, 10), std::vector<BlockId>{0});  // sequence 0's, released first
  EXPECT_EQ(pool.stats().evictions, 1);
  EXPECT_EQ(pool.start(11, concat(run_of(200, 4), {7})), 4);  // sequence 2's block is still cached: held again
  EXPECT_EQ(pool.start(12, concat(run_of(0, 4), {7})), 0);    // sequence 0's is gone
  EXPECT_FALSE(pool.reserve(12, 5));                          // two blocks, one free
  pool.release(12);
  run_prompt(pool, 13, run_of(600, 3));
  EXPECT_EQ(table_of(pool, 13), std::vector<BlockId>{1});  // sequence 1's: block 2 is held, block 3 too
  stats = pool.stats();
  EXPECT_EQ(stats.evictions, 2);
  EXPECT_EQ(stats.free, 0);
  EXPECT_FALSE(pool.reserve(13, 2));
  EXPECT_EQ(pool.start(14, concat(run_of(300, 4), {7})), 4);  // the held blocks stayed cached
  pool.verify();
}

TEST(KvBlockPool, EvictsASequencesLastBlockBeforeItsFirst) {
  KvBlockPool pool(3, 4);
  run_prompt(pool, 1, run_of(0, 8));
  pool.release(1);
  run_prompt(pool, 2, run_of(50, 3));  // the unused block
  run_prompt(pool, 3, run_of(60, 3));  // evicts positions 4..7: without 0..3 no prompt could reach them
  EXPECT_EQ(table_of(pool, 3), std::vector<BlockId>{1});
  EXPECT_EQ(pool.start(4, run_of(0, 5)), 4);
  pool.verify();
}

TEST(KvBlockPool, AHashCollisionNeverReusesAWrongBlock) {
  KvBlockPool pool(16, 4, [](uint64_t, std::span<const int32_t>) -> uint64_t { return 42; });
  run_prompt(pool, 1, run_of(0, 5));
  EXPECT_EQ(run_prompt(pool, 2, run_of(10, 5)), 0);  // same hash, other tokens
  EXPECT_EQ(pool.start(3, run_of(0, 5)), 4);         // the real match still works
  pool.verify();
}

TEST(KvBlockPool, ABlockIsReusedOnlyAfterTheSameBlocks) {
  // Blocks with the same tokens hash the same whatever precedes them, so only the stored predecessor tells a
  // block computed after X from one computed after Y.
  KvBlockPool pool(16, 4, [](uint64_t, std::span<const int32_t> tokens) { return hash_block(0, tokens); });
  const Tokens x = run_of(0, 4);
  const Tokens y = run_of(10, 4);
  const Tokens z = run_of(20, 4);
  run_prompt(pool, 1, concat(concat(x, y), {1}));
  run_prompt(pool, 2, concat(z, {1}));
  EXPECT_EQ(pool.start(3, concat(concat(z, y), {1})), 4);  // z, but not the y that followed x
  EXPECT_EQ(pool.start(4, concat(concat(x, y), {1})), 8);
  pool.verify();
}

TEST(KvBlockPool, AFailedReserveChangesNothing) {
  KvBlockPool pool(3, 4);
  run_prompt(pool, 1, run_of(0, 6));
  pool.start(2, run_of(50, 2));
  KvBlockPool::Stats before = pool.stats();
  EXPECT_FALSE(pool.reserve(2, 8));  // two blocks, one free
  EXPECT_EQ(pool.stats(), before);
  EXPECT_TRUE(pool.table(2).empty());
  EXPECT_EQ(pool.computed(2), 0);
  // Copy on write needs a block too.
  EXPECT_TRUE(compute(pool, 2, 2).empty());
  EXPECT_EQ(pool.free_blocks(), 0);
  pool.fork(1, 3);
  pool.append(3, std::vector<int32_t>{9});
  const std::vector<BlockId> table = table_of(pool, 3);
  before = pool.stats();
  EXPECT_FALSE(pool.reserve(3, 1));
  EXPECT_EQ(pool.stats(), before);
  EXPECT_EQ(table_of(pool, 3), table);
  EXPECT_EQ(pool.references(table[1]), 2);
  pool.verify();
}

// The scheduler's admission: start, reserve, and on failure release and start again on a later step. Only the
// admission that got its blocks counts a prefix lookup and the blocks it reused.
TEST(KvBlockPool, AdmissionsThatFailForWantOfBlocksCountNoReuse) {
  KvBlockPool pool(4, 4);
  run_prompt(pool, 1, run_of(0, 9));  // two full cached blocks and a partial one: one block free
  const Tokens prompt = concat(run_of(0, 8), run_of(50, 8));
  for (int attempt = 0; attempt < 3; ++attempt) {
    EXPECT_EQ(pool.start(2, prompt), 8);
    EXPECT_FALSE(pool.reserve(2, 8));  // two blocks after the shared prefix, one free
    pool.release(2);
  }
  pool.release(1);
  EXPECT_EQ(run_prompt(pool, 2, prompt), 8);
  const KvBlockPool::Stats stats = pool.stats();
  EXPECT_EQ(stats.prefix_lookups, 2);
  EXPECT_EQ(stats.reused_blocks, 2);
  EXPECT_EQ(stats.reused_positions, 8);
  pool.verify();
}

TEST(KvBlockPool, ForksShareBlocksAndCopyOnWrite) {
  KvBlockPool pool(16, 4);
  run_prompt(pool, 1, run_of(0, 6));  // blocks 0 (full, cached) and 1 (2 positions)
  ASSERT_EQ(table_of(pool, 1), (std::vector<BlockId>{0, 1}));
  pool.fork(1, 2);
  pool.fork(1, 3);
  EXPECT_EQ(table_of(pool, 2), table_of(pool, 1));
  EXPECT_EQ(pool.computed(3), 6);
  EXPECT_EQ(pool.references(0), 3);
  EXPECT_EQ(pool.references(1), 3);
  // A fork must reserve before writing, so that it sees the copy to make.
  pool.append(1, std::vector<int32_t>{7});
  EXPECT_NE(error_of([&] { pool.mark_computed(1, 1); }).find("without reserving"), std::string::npos);
  pool.append(2, std::vector<int32_t>{8});
  pool.append(3, std::vector<int32_t>{9});
  EXPECT_EQ(compute(pool, 1, 1), (std::vector<BlockCopy>{{1, 2}}));
  EXPECT_EQ(compute(pool, 2, 1), (std::vector<BlockCopy>{{1, 3}}));
  EXPECT_EQ(compute(pool, 3, 1), std::vector<BlockCopy>{});  // the last holder writes in place
  EXPECT_EQ(table_of(pool, 1), (std::vector<BlockId>{0, 2}));
  EXPECT_EQ(table_of(pool, 2), (std::vector<BlockId>{0, 3}));
  EXPECT_EQ(table_of(pool, 3), (std::vector<BlockId>{0, 1}));
  EXPECT_EQ(pool.references(0), 3);
  EXPECT_EQ(pool.references(1), 1);
  pool.verify();
  // At a block boundary nothing is shared that will be written.
  run_prompt(pool, 4, run_of(100, 8));
  pool.fork(4, 5);
  for (SequenceId id : {4, 5}) {
    pool.append(id, std::vector<int32_t>{1});
    EXPECT_TRUE(compute(pool, id, 1).empty());
  }
  EXPECT_NE(pool.table(4)[2], pool.table(5)[2]);
  for (SequenceId id = 1; id <= 5; ++id) pool.release(id);
  EXPECT_EQ(pool.stats().used, 0);
  pool.verify();
}

TEST(KvBlockPool, TruncateReleasesTheBlocksPastThePosition) {
  KvBlockPool pool(8, 4);
  const Tokens prompt = run_of(0, 10);
  run_prompt(pool, 1, prompt);  // blocks 0 and 1 full and cached, 2 partial
  pool.truncate(1, 5);
  EXPECT_EQ(table_of(pool, 1), (std::vector<BlockId>{0, 1}));
  EXPECT_EQ(pool.computed(1), 5);
  EXPECT_EQ(pool.tokens(1).size(), 5u);
  EXPECT_EQ(pool.stats().free, 6);
  EXPECT_EQ(pool.stats().evictable, 0);  // block 2 was not cached: unused again
  // Block 1 is cached with the old tokens 4..7: writing position 5 takes a copy of its first row.
  pool.append(1, std::vector<int32_t>{90, 91});
  EXPECT_EQ(compute(pool, 1, 2), (std::vector<BlockCopy>{{1, 2}}));
  EXPECT_EQ(pool.stats().evictable, 1);
  EXPECT_EQ(pool.start(2, concat(run_of(0, 8), {1})), 8);  // the old block 1 still serves the old tokens
  EXPECT_EQ(table_of(pool, 2), (std::vector<BlockId>{0, 1}));
  // At a block boundary the block past it goes.
  pool.truncate(1, 4);
  EXPECT_EQ(table_of(pool, 1), (std::vector<BlockId>{0}));
  pool.append(1, std::vector<int32_t>{92});
  EXPECT_TRUE(compute(pool, 1, 1).empty());
  // Truncating tokens not computed yet keeps the computed positions.
  pool.append(1, std::vector<int32_t>{93, 94, 95});
  pool.truncate(1, 6);
  EXPECT_EQ(pool.computed(1), 5);
  EXPECT_EQ(pool.tokens(1).size(), 6u);
  pool.verify();
}

TEST(KvBlockPool, MisuseIsAnError) {
  auto says = [](const std::string& message, const std::string& part) {
    EXPECT_NE(message.find(part), std::string::npos) << message;
  };
  says(error_of([] { (void)KvBlockPool(0, 16); }), "0 blocks of 16 positions");
  says(error_of([] { (void)KvBlockPool(4, 0); }), "4 blocks of 0 positions");
  says(error_of([] { (void)KvBlockPool(int64_t{1} << 31, 16); }), "each must be 1 to 2147483647");
  KvBlockPool pool(4, 4);
  pool.start(1, run_of(0, 2));
  says(error_of([&] { pool.start(1, run_of(0, 2)); }), "sequence 1 already exists");
  says(error_of([&] { pool.fork(1, 1); }), "already exists");
  says(error_of([&] { pool.fork(7, 8); }), "no sequence 7");
  says(error_of([&] { (void)pool.reserve(1, -1); }), "-1 positions for sequence 1");
  says(error_of([&] { pool.mark_computed(1, 1); }), "without reserving");
  ASSERT_TRUE(pool.reserve(1, 4));
  says(error_of([&] { pool.mark_computed(1, 3); }), "sequence 1 has 2 tokens");
  says(error_of([&] { pool.truncate(1, 3); }), "cannot truncate sequence 1 of 2 tokens to 3");
  says(error_of([&] { (void)pool.references(4); }), "no block 4");
  says(error_of([&] { (void)pool.references(-1); }), "no block -1");
  pool.verify();
  pool.release(1);
  const std::string unknown = "no sequence 1 (never started, or released)";
  says(error_of([&] { pool.release(1); }), unknown);
  says(error_of([&] { (void)pool.reserve(1, 1); }), unknown);
  says(error_of([&] { pool.append(1, std::vector<int32_t>{1}); }), unknown);
  says(error_of([&] { pool.mark_computed(1, 0); }), unknown);
  says(error_of([&] { pool.truncate(1, 0); }), unknown);
  says(error_of([&] { (void)pool.table(1); }), unknown);
  says(error_of([&] { (void)pool.computed(1); }), unknown);
  EXPECT_EQ(pool.stats().free, 4);
  pool.verify();
}

// Many sequences joining (new prompts, shared system prompts, next turns of released ones), growing in chunks and
// by generated tokens, forking, truncating and released (finished, or preempted when a reservation fails), on a
// pool small enough to evict. A simulated KV memory records, for each slot, a fingerprint of the tokens up to
// the position written there; copies are made as reserve() reports them. After every operation the pool's own
// checks pass, every block is referenced by as many tables as hold it, and every computed position of every
// sequence reads its own fingerprint: no wrong reuse, no lost copy, no block written under another sequence.
class Simulation {
 public:
  Simulation(BlockHasher hasher, uint64_t seed)
      : pool_(kBlocks, kPositions, hasher), memory_(kBlocks * kPositions, 0), random_(seed) {}

  void run(int steps) {
    for (int step = 0; step < steps; ++step) {
      const int operation = pick(0, 9);
      if (sequences_.empty() || (operation <= 1 && sequences_.size() < 12)) {
        join();
      } else if (operation <= 5) {
        grow(any());
      } else if (operation == 6) {
        fork(any());
      } else if (operation == 7) {
        truncate(any());
      } else {
        leave(any());
      }
      check();
      if (testing::Test::HasFailure()) return;
    }
  }

  const KvBlockPool& pool() const { return pool_; }
  int64_t copies() const { return copies_; }

 private:
  static constexpr int64_t kBlocks = 40;
  static constexpr int64_t kPositions = 4;

  int pick(int low, int high) { return std::uniform_int_distribution<int>(low, high)(random_); }
  SequenceId any() {
    auto entry = sequences_.begin();
    std::advance(entry, pick(0, static_cast<int>(sequences_.size()) - 1));
    return entry->first;
  }
  // Tokens from a tiny vocabulary, so that different sequences often fill equal blocks.
  Tokens random_tokens(int count) {
    Tokens tokens(static_cast<size_t>(count));
    for (int32_t& token : tokens) token = pick(0, 2);
    return tokens;
  }
  // The fingerprint of tokens[0..p]: what position p's keys and values depend on.
  static std::vector<uint64_t> fingerprints(const Tokens& tokens) {
    std::vector<uint64_t> prints;
    uint64_t print = 0;
    for (const int32_t token : tokens) prints.push_back(print = hash_block(print, std::span(&token, 1)));
    return prints;
  }

  void join() {
    Tokens prompt;
    const int kind = pick(0, 2);
    if (kind == 0 && !finished_.empty()) {  // the next turn of a finished or preempted sequence
      prompt = finished_[static_cast<size_t>(pick(0, static_cast<int>(finished_.size()) - 1))];
    } else if (kind == 1) {  // one of two system prompts
      prompt = run_of(1000 * pick(1, 2), pick(3, 13));
    }
    prompt = concat(prompt, random_tokens(pick(1, 10)));
    const SequenceId id = next_id_++;
    const int64_t reused = pool_.start(id, prompt);
    EXPECT_LT(reused, static_cast<int64_t>(prompt.size()));
    EXPECT_EQ(reused % kPositions, 0);
    sequences_[id] = prompt;
  }

  // Computes a chunk of the sequence's pending tokens (a new generated one where none is pending), preempting the
  // most recently joined other sequence while the pool has no room.
  void grow(SequenceId id) {
    Tokens& tokens = sequences_[id];
    if (pool_.computed(id) == static_cast<int64_t>(tokens.size())) {
      const Tokens generated = random_tokens(1);
      pool_.append(id, generated);
      tokens.push_back(generated[0]);
    }
    const int64_t pending = static_cast<int64_t>(tokens.size()) - pool_.computed(id);
    const int64_t positions = pick(1, static_cast<int>(pending));
    const int64_t ahead = pick(0, 3) == 0 ? pick(1, 6) : 0;  // room for later steps too, at times
    std::optional<std::vector<BlockCopy>> copies = pool_.reserve(id, positions + ahead);
    while (!copies) {
      const KvBlockPool::Stats before = pool_.stats();
      const auto victim = std::find_if(sequences_.rbegin(), sequences_.rend(),
                                       [&](const auto& entry) { return entry.first != id; });
      if (victim == sequences_.rend()) return;  // alone and still too long: leave it as it is
      leave(victim->first);
      EXPECT_GE(pool_.stats().free, before.free);
      copies = pool_.reserve(id, positions + ahead);
    }
    for (const BlockCopy& copy : *copies) {
      std::copy_n(memory_.begin() + copy.source * kPositions, kPositions,
                  memory_.begin() + copy.destination * kPositions);
      ++copies_;
    }
    const std::vector<uint64_t> prints = fingerprints(tokens);
    const std::span<const BlockId> table = pool_.table(id);
    for (int64_t p = pool_.computed(id); p < pool_.computed(id) + positions; ++p) {
      slot(table, p) = prints[static_cast<size_t>(p)];
    }
    pool_.mark_computed(id, positions);
  }

  void fork(SequenceId parent) {
    const SequenceId child = next_id_++;
    pool_.fork(parent, child);
    sequences_[child] = sequences_[parent];
  }

  void truncate(SequenceId id) {
    Tokens& tokens = sequences_[id];
    const int positions = pick(0, static_cast<int>(tokens.size()));
    pool_.truncate(id, positions);
    tokens.resize(static_cast<size_t>(positions));
  }

  void leave(SequenceId id) {
    pool_.release(id);
    finished_.push_back(sequences_[id]);
    sequences_.erase(id);
  }

  uint64_t& slot(std::span<const BlockId> table, int64_t position) {
    return memory_[static_cast<size_t>(table[static_cast<size_t>(position / kPositions)] * kPositions +
                                       position % kPositions)];
  }

  void check() {
    pool_.verify();
    std::vector<int32_t> holders(kBlocks, 0);
    for (const auto& [id, tokens] : sequences_) {
      const std::span<const int32_t> known = pool_.tokens(id);
      ASSERT_TRUE(std::ranges::equal(known, tokens)) << "sequence " << id;
      const std::span<const BlockId> table = pool_.table(id);
      for (const BlockId block : table) ++holders[static_cast<size_t>(block)];
      const std::vector<uint64_t> prints = fingerprints(tokens);
      for (int64_t p = 0; p < pool_.computed(id); ++p) {
        ASSERT_EQ(slot(table, p), prints[static_cast<size_t>(p)]) << "sequence " << id << " position " << p;
      }
    }
    for (BlockId block = 0; block < kBlocks; ++block) {
      ASSERT_EQ(pool_.references(block), holders[static_cast<size_t>(block)]) << "block " << block;
    }
    const KvBlockPool::Stats stats = pool_.stats();
    ASSERT_EQ(stats.free + stats.used, stats.blocks);
    ASSERT_EQ(stats.used, std::ranges::count_if(holders, [](int32_t count) { return count > 0; }));
  }

  KvBlockPool pool_;
  std::vector<uint64_t> memory_;
  std::mt19937_64 random_;
  std::map<SequenceId, Tokens> sequences_;  // by id: the last one joined last
  std::vector<Tokens> finished_;
  SequenceId next_id_ = 0;
  int64_t copies_ = 0;
};

void simulate(BlockHasher hasher) {
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Simulation simulation(hasher, seed);
    simulation.run(4000);
    const KvBlockPool::Stats stats = simulation.pool().stats();
    EXPECT_GT(stats.reused_blocks, 0);
    EXPECT_GT(stats.evictions, 0);
    EXPECT_GT(simulation.copies(), 0);
  }
}

TEST(KvBlockPool, RandomOperationsKeepEveryInvariant) { simulate(hash_block); }

TEST(KvBlockPool, RandomOperationsKeepEveryInvariantWithCollidingHashes) {
  simulate([](uint64_t parent, std::span<const int32_t> tokens) { return hash_block(parent, tokens) % 8; });
}

}  // namespace
}  // namespace rf::engine
