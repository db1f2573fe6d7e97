// Sliding-window layers keep a ring of their window and one pass instead of every position (model::kv_cache_rows):
// less memory, the same logits as the full layout whether a prompt runs in passes that wrap the ring or token by
// token, and truncation keeps a prefix only while the ring still holds the keys the next query sees.
#include "backend/cpu/kv_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/residency.h"
#include "backend/cpu/transformer.h"
#include "reference.h"
#include "test_paths.h"

namespace rf {
namespace {

model::ExecutionPlan plan_of(const std::string& path) {
  return model::ExecutionPlan::build(gguf::File::open(path), std::make_shared<cpu::MappedResidency>());
}

std::string arch_model(const std::string& name) { return test::shared_path("arch/models/" + name + ".gguf"); }

cpu::TransformerOptions options_of(int64_t context, int64_t max_batch) {
  cpu::TransformerOptions options;
  options.context = context;
  options.max_batch = max_batch;
  options.threads = 2;
  return options;
}

// The tokens of a model's reference (../shared/arch/reference): its prompt, then its greedy continuation.
std::vector<int32_t> reference_tokens(const std::string& model) {
  const test::Reference ref = test::read_reference("arch/reference/" + model + ".p2.json");
  std::vector<int32_t> tokens = ref.prompt_tokens;
  tokens.insert(tokens.end(), ref.greedy_tokens.begin(), ref.greedy_tokens.end());
  return tokens;
}

void expect_close(std::span<const float> got, std::span<const float> expected, float tolerance) {
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], expected[i], tolerance) << "at " << i;
}

TEST(KvCacheTest, SlidingLayersKeepARingWhereItIsShorterThanTheContext) {
  const model::ExecutionPlan plan = plan_of(arch_model("synth-gemma2-Q4_K_M"));
  const model::ModelConfig& c = plan.config();
  ASSERT_EQ(c.sliding_window, 8);
  ASSERT_TRUE(c.sliding(0) && !c.sliding(1) && c.sliding(2));
  const auto row_bytes = static_cast<size_t>(c.kv_dim()) * 2;

  // The window of 8 and passes of 2, in a whole block.
  const cpu::KvCache ring(c, 64, TensorType::F16, 2);
  EXPECT_EQ(ring.rows(0), 16);
  EXPECT_EQ(ring.rows(1), 64);
  EXPECT_EQ(ring.rows(2), 16);
  EXPECT_EQ(ring.row(0, ring.contiguous_table(), 23), 7);
  EXPECT_EQ(ring.row(1, ring.contiguous_table(), 23), 23);
  EXPECT_EQ(ring.bytes(), (16 + 64 + 16) * row_bytes);
  // A query at 23 sees 16..23 on the sliding layers: the ring's rows 0..7; a pass of 2 at 31 wraps it.
  std::vector<cpu::RowRange> ranges;
  ring.append_rows(0, ring.contiguous_table(), 16, 8, ranges);
  EXPECT_EQ(ranges, (std::vector<cpu::RowRange>{{0, 8}}));
  ranges.clear();
  ring.append_rows(0, ring.contiguous_table(), 25, 8, ranges);
  EXPECT_EQ(ranges, (std::vector<cpu::RowRange>{{9, 7}, {0, 1}}));

  // Where the window and a pass take the whole context, every layer keeps a row for each position.
  const cpu::KvCache full(c, 64, TensorType::F16, 56);
  for (int64_t l = 0; l < c.n_layers; ++l) EXPECT_EQ(full.rows(l), 64);
  EXPECT_EQ(full.bytes(), 3 * 64 * row_bytes);
  EXPECT_LT(ring.bytes(), full.bytes());

  // A model without sliding layers; a capacity short of a whole block takes one.
  const model::ExecutionPlan llama = plan_of(test::shared_path("models/stories260K.gguf"));
  const cpu::KvCache every_position(llama.config(), 60, TensorType::F32, 1);
  EXPECT_EQ(every_position.bytes(), static_cast<size_t>(llama.config().n_layers * 64 * llama.config().kv_dim() * 4));
}

// A paged cache: every layer holds the pool's blocks, sliding ones too, and a sequence's positions follow its block
// table; runs of consecutive blocks are one range of rows.
TEST(KvCacheTest, PagedCacheFollowsBlockTables) {
  const model::ExecutionPlan plan = plan_of(arch_model("synth-gemma2-Q4_K_M"));
  const model::ModelConfig& c = plan.config();
  cpu::KvCache pool = cpu::KvCache::paged(c, 8, TensorType::F32);
  for (int64_t l = 0; l < c.n_layers; ++l) EXPECT_EQ(pool.rows(l), 8 * model::kKvBlockPositions);
  EXPECT_EQ(pool.capacity(), 8 * model::kKvBlockPositions);
  EXPECT_EQ(pool.size(), 0);

  const std::vector<model::BlockId> table = {5, 2, 3, 0};
  EXPECT_EQ(pool.row(0, table, 0), 80);
  EXPECT_EQ(pool.row(0, table, 17), 33);
  EXPECT_EQ(pool.row(2, table, 63), 15);
  std::vector<cpu::RowRange> ranges;
  pool.append_rows(0, table, 10, 45, ranges);
  EXPECT_EQ(ranges, (std::vector<cpu::RowRange>{{90, 6}, {32, 32}, {0, 7}}));

  // A block copied in every layer, keys and values.
  const auto kv_dim = static_cast<size_t>(c.kv_dim());
  std::vector<float> key(kv_dim), value(kv_dim);
  for (int64_t l = 0; l < c.n_layers; ++l)
    for (int64_t slot = 0; slot < model::kKvBlockPositions; ++slot) {
      std::fill(key.begin(), key.end(), static_cast<float>(l * 100 + slot));
      std::fill(value.begin(), value.end(), static_cast<float>(-l * 100 - slot));
      pool.store(l, 5 * model::kKvBlockPositions + slot, key.data(), value.data());
    }
  pool.copy_block(5, 6);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const size_t source = 5 * model::kKvBlockPositions * kv_dim, destination = 6 * model::kKvBlockPositions * kv_dim;
    const size_t block = model::kKvBlockPositions * kv_dim;
    EXPECT_TRUE(std::equal(pool.keys<float>(l) + source, pool.keys<float>(l) + source + block,
                           pool.keys<float>(l) + destination));
    EXPECT_TRUE(std::equal(pool.values<float>(l) + source, pool.values<float>(l) + source + block,
                           pool.values<float>(l) + destination));
    EXPECT_EQ(pool.values<float>(l)[destination + block - 1], static_cast<float>(-l * 100 - 15));
  }
  EXPECT_THROW(cpu::KvCache::paged(c, 0, TensorType::F16), Error);
}

TEST(KvCacheTest, TruncateKeepsWhatTheRingsStillHold) {
  const model::ExecutionPlan plan = plan_of(arch_model("synth-gemma2-Q4_K_M"));
  const model::ModelConfig& c = plan.config();
  // Rings of 16 rows: the window of 8 and passes of 2, in a whole block.
  cpu::KvCache cache(c, 64, TensorType::F32, 2);
  const std::vector<float> row(static_cast<size_t>(c.kv_dim()), 0.5f);
  const auto fill = [&](int64_t from, int64_t to) {
    for (int64_t p = from; p < to; ++p)
      for (int64_t l = 0; l < c.n_layers; ++l)
        cache.store(l, cache.row(l, cache.contiguous_table(), p), row.data(), row.data());
    cache.mark_filled(to);
  };
  fill(0, 30);
  // The ring holds positions 14..29, and a query at 27 sees 20..27.
  cache.truncate(28);
  EXPECT_EQ(cache.size(), 28);
  cache.truncate(27);
  EXPECT_EQ(cache.size(), 27);
  // Positions 27 and 28 again: the ring still holds 29 (written before), which overwrote 13, which a query at 20
  // sees, although the newest position cached now is 28; a query at 21 sees 14 on.
  fill(27, 29);
  cache.truncate(21);
  EXPECT_EQ(cache.size(), 21);
  cache.truncate(20);
  EXPECT_EQ(cache.size(), 0);

  // Without rings any prefix stays.
  cpu::KvCache full(c, 64, TensorType::F32, 56);
  full.mark_filled(30);
  full.truncate(3);
  EXPECT_EQ(full.size(), 3);
}

// The logits of `tokens` at positions position, position + 1, ..., fed in passes of `pass` tokens (the last may be
// shorter), row after row.
std::vector<float> in_passes(cpu::Transformer& transformer, std::span<const int32_t> tokens, int64_t position,
                             size_t pass) {
  std::vector<float> rows;
  for (size_t start = 0; start < tokens.size(); start += pass) {
    const std::span<const int32_t> part = tokens.subspan(start, std::min(pass, tokens.size() - start));
    const std::span<const float> logits =
        transformer.forward(part, position + static_cast<int64_t>(start), cpu::Logits::All);
    rows.insert(rows.end(), logits.begin(), logits.end());
  }
  return rows;
}

// 8-bit activations round a token's products a little differently in passes of different lengths, so the runs
// compared here take passes of the same tokens: then nothing differs but where the keys and values are kept.
constexpr float kSameArithmetic = 1e-6f;

class SlidingWindowTest : public ::testing::TestWithParam<std::string> {};

// Passes of 1, 2, 3 and 5 tokens wrap rings of 16 rows (9 to 13, in a whole block) over the reference's 36 tokens:
// the logits are those of the full layout (max_batch 512), in passes and token by token.
TEST_P(SlidingWindowTest, RingGivesTheLogitsOfTheFullLayout) {
  const model::ExecutionPlan plan = plan_of(arch_model(GetParam()));
  const std::vector<int32_t> tokens = reference_tokens(GetParam());
  const auto n = static_cast<int64_t>(tokens.size());
  for (const int64_t max_batch : {1, 2, 3, 5}) {
    SCOPED_TRACE("passes of " + std::to_string(max_batch));
    cpu::Transformer full(plan, options_of(n, 512));
    ASSERT_GE(cpu::KvCache(plan.config(), n, TensorType::F16, 512).rows(0), n);
    const std::vector<float> expected = in_passes(full, tokens, 0, static_cast<size_t>(max_batch));

    cpu::Transformer ring(plan, options_of(n, max_batch));
    ASSERT_LT(cpu::KvCache(plan.config(), n, TensorType::F16, max_batch).rows(0), n);
    expect_close(ring.forward(tokens, 0, cpu::Logits::All), expected, kSameArithmetic);
  }
  cpu::Transformer full(plan, options_of(n, 512));
  const std::vector<float> expected = in_passes(full, tokens, 0, 1);
  cpu::Transformer ring(plan, options_of(n, 2));
  expect_close(in_passes(ring, tokens, 0, 1), expected, kSameArithmetic);
}

// Truncating within the ring's slack (max_batch positions past the point) keeps the prefix and continues as a
// fresh run would; beyond it the cache starts over (and forward() refuses to continue there), and evaluating again
// from position 0 gives a fresh run's logits. Token by token, so that every run has the same arithmetic.
TEST_P(SlidingWindowTest, TruncateReusesWithinTheSlackAndStartsOverBeyondIt) {
  const model::ExecutionPlan plan = plan_of(arch_model(GetParam()));
  const std::vector<int32_t> tokens = reference_tokens(GetParam());
  const auto n = static_cast<int64_t>(tokens.size());
  const std::vector<int32_t> tail = {5, 77, 301};
  const auto followed_by_tail = [&](int64_t keep) {
    std::vector<int32_t> sequence(tokens.begin(), tokens.begin() + keep);
    sequence.insert(sequence.end(), tail.begin(), tail.end());
    return sequence;
  };
  const auto vocab = static_cast<size_t>(plan.config().vocab_size);
  // The logits of the tail after `keep` tokens, from a fresh run of the full layout.
  const auto fresh_tail = [&](int64_t keep) {
    cpu::Transformer fresh(plan, options_of(n, 512));
    const std::vector<float> rows = in_passes(fresh, followed_by_tail(keep), 0, 1);
    return std::vector<float>(rows.end() - static_cast<ptrdiff_t>(tail.size() * vocab), rows.end());
  };

  // Rings of 16 rows: the window of 8 and passes of 2, in a whole block.
  cpu::Transformer transformer(plan, options_of(n, 2));
  in_passes(transformer, {tokens.data(), 30}, 0, 1);
  transformer.truncate(27);
  ASSERT_EQ(transformer.cached(), 27);
  expect_close(in_passes(transformer, tail, 27, 1), fresh_tail(27), kSameArithmetic);

  EXPECT_THROW(transformer.forward(tail, 20), Error);
  EXPECT_EQ(transformer.cached(), 0);
  in_passes(transformer, {tokens.data(), 30}, 0, 1);
  transformer.truncate(20);
  EXPECT_EQ(transformer.cached(), 0);
  const std::vector<float> again = in_passes(transformer, followed_by_tail(20), 0, 1);
  expect_close(std::span<const float>(again).last(tail.size() * vocab), fresh_tail(20), kSameArithmetic);
}

// The synthetic Gemma models slide over windows of 8 positions.
INSTANTIATE_TEST_SUITE_P(Models, SlidingWindowTest, ::testing::Values("synth-gemma2-Q4_K_M", "synth-gemma3-Q4_K_M"),
                         [](const ::testing::TestParamInfo<std::string>& param) {
                           std::string name = param.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace rf
