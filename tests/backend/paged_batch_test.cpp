// A paged forward pass evaluates many sequences at once, each through its own block table of a shared pool: every
// sequence gets the logits that a single-sequence transformer (contiguous cache) gives it alone, whatever its
// blocks, its starting position, the other sequences of the batch, or the passes the batch is cut into.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/residency.h"
#include "backend/cpu/transformer.h"
#include "test_paths.h"

namespace rf {
namespace {

using model::BatchSequence;
using model::BlockCopy;
using model::BlockId;
using model::kKvBlockPositions;
using model::Logits;

constexpr int64_t kPoolBlocks = 64;
constexpr int64_t kContext = 128;  // of the single-sequence transformers

// A sequence's rows, batched or alone, differ only in the order of a product's sums: one row alone runs through
// the matrix-vector kernels, rows of a batch through the matrix-matrix ones (tiles from 4 rows on). With float
// activations that stays float rounding: up to 1.3e-4 on stories260K's logits (up to ~20) with the portable kernels
// of a sanitizer build, 6e-6 with the AVX2 ones.
constexpr float kTolerance = 5e-4f;
// With 8-bit activations, as the engine runs, such a rounding difference can move a value across an 8-bit step when
// the next product quantizes it: one step of 1/127 of the row's largest value, which the layers carry on. Measured
// up to 1.6e-2 on synth-tiny256-Q4_K_M (logits up to 1.4), as for a single-sequence prompt in one pass against
// token by token; a wrong block or position moves them far more.
constexpr float kTolerance8BitActivations = 5e-2f;

cpu::TransformerOptions options_of(int64_t kv_blocks, int64_t max_batch = 512, bool float_activations = true) {
  cpu::TransformerOptions options;
  options.threads = 2;
  options.context = kContext;
  options.max_batch = max_batch;
  options.kv_blocks = kv_blocks;
  options.float_activations = float_activations;
  return options;
}

// `count` token ids of the vocabulary, different for each seed.
std::vector<int32_t> tokens_of(const model::ModelConfig& config, int64_t count, uint32_t seed) {
  std::mt19937 random(seed);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(std::min<int64_t>(config.vocab_size, 512) - 1));
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  for (int32_t& token : tokens) token = id(random);
  return tokens;
}

// A sequence evaluated twice over: in the batches of a paged pass, through its block table, and alone.
struct Sequence {
  std::vector<BlockId> blocks;
  std::vector<int32_t> tokens;  // evaluated so far
  std::unique_ptr<cpu::Transformer> alone;
};

// One sequence's part of a step: its next tokens, and the logits it asks for.
struct Part {
  Sequence* sequence;
  std::vector<int32_t> tokens;
  Logits logits = Logits::Last;
};

class PagedBatch {
 public:
  PagedBatch(const std::string& path, int64_t max_batch, bool float_activations = true)
      : plan_(model::ExecutionPlan::build(gguf::File::open(path), std::make_shared<cpu::MappedResidency>())),
        float_activations_(float_activations),
        paged_(plan_, options_of(kPoolBlocks, max_batch, float_activations)) {
    // Blocks handed out in a shuffled order: tables of non-consecutive ids, with a run of consecutive ones at times.
    free_.resize(kPoolBlocks);
    std::iota(free_.begin(), free_.end(), 0);
    std::shuffle(free_.begin(), free_.end(), std::mt19937(7));
  }

  const model::ModelConfig& config() const { return plan_.config(); }
  cpu::Transformer& paged() { return paged_; }

  Sequence& start() {
    sequences_.push_back(std::make_unique<Sequence>());
    sequences_.back()->alone = std::make_unique<cpu::Transformer>(plan_, options_of(0, 512, float_activations_));
    return *sequences_.back();
  }

  // Adds blocks to the sequence's table until it holds `positions`.
  void reserve(Sequence& sequence, int64_t positions) {
    while (static_cast<int64_t>(sequence.blocks.size()) * kKvBlockPositions < positions) {
      sequence.blocks.push_back(free_.back());
      free_.pop_back();
    }
  }

  // Runs the parts as one batch after `copies`, and each part alone on its sequence's own transformer; expects the
  // same logits rows. Returns the largest difference.
  float step(const std::vector<Part>& parts, const std::vector<BlockCopy>& copies = {}) {
    std::vector<BatchSequence> batch;
    for (const Part& part : parts) {
      Sequence& sequence = *part.sequence;
      const auto position = static_cast<int64_t>(sequence.tokens.size());
      reserve(sequence, position + static_cast<int64_t>(part.tokens.size()));
      batch.push_back({part.tokens, position, sequence.blocks, part.logits});
    }
    const std::span<const float> got = paged_.forward(batch, copies);

    const auto vocab = static_cast<size_t>(config().vocab_size);
    size_t row = 0;
    float largest = 0.0f;
    for (const Part& part : parts) {
      Sequence& sequence = *part.sequence;
      const auto position = static_cast<int64_t>(sequence.tokens.size());
      const std::span<const float> expected =
          sequence.alone->forward(part.tokens, position, part.logits == Logits::All ? Logits::All : Logits::Last);
      sequence.tokens.insert(sequence.tokens.end(), part.tokens.begin(), part.tokens.end());
      if (part.logits == Logits::None) continue;
      if (row * vocab + expected.size() > got.size()) {
        ADD_FAILURE() << "the batch returned " << got.size() / vocab << " logits rows";
        return INFINITY;
      }
      for (size_t i = 0; i < expected.size(); ++i)
        largest = std::max(largest, std::abs(got[row * vocab + i] - expected[i]));
      row += expected.size() / vocab;
    }
    EXPECT_EQ(row * vocab, got.size());
    EXPECT_LE(largest, float_activations_ ? kTolerance : kTolerance8BitActivations);
    return largest;
  }

 private:
  model::ExecutionPlan plan_;
  bool float_activations_;
  cpu::Transformer paged_;
  std::vector<BlockId> free_;
  std::vector<std::unique_ptr<Sequence>> sequences_;
};

// `model`: the model file's path under ../shared, without ".gguf".
std::string model_path(const std::string& model) { return test::shared_path(model + ".gguf"); }

class PagedBatchTest : public ::testing::TestWithParam<std::string> {};

// Prompts of different lengths, one of them in two chunks (None, then Last) and one with every row's logits; then
// continuations at the positions the prompts reached, with a new prompt beside them; then decode steps of a token
// each. With max_batch 5 the same batches run in passes that cut sequences apart. With float activations, then
// with 8-bit ones.
TEST_P(PagedBatchTest, SequencesGetTheLogitsTheyGetAlone) {
  for (const bool float_activations : {true, false})
    for (const int64_t max_batch : {512, 5}) {
      const std::string run =
          std::string(float_activations ? "float" : "8-bit") + " activations, max_batch " + std::to_string(max_batch);
      SCOPED_TRACE(run);
      PagedBatch runs(model_path(GetParam()), max_batch, float_activations);
      const model::ModelConfig& c = runs.config();
      Sequence& a = runs.start();
      Sequence& b = runs.start();
      Sequence& chunked = runs.start();
      Sequence& late = runs.start();
      float largest = runs.step({{&a, tokens_of(c, 21, 1)},
                                 {&b, tokens_of(c, 5, 2), Logits::All},
                                 {&chunked, tokens_of(c, 12, 3), Logits::None}});
      largest = std::max(largest, runs.step({{&a, tokens_of(c, 7, 4)},
                                             {&chunked, tokens_of(c, 9, 5)},
                                             {&late, tokens_of(c, 30, 6)},
                                             {&b, tokens_of(c, 3, 7), Logits::All}}));
      for (uint32_t token = 0; token < 12; ++token)
        largest = std::max(largest, runs.step({{&late, tokens_of(c, 1, 10 + token)},
                                               {&a, tokens_of(c, 1, 30 + token)},
                                               {&b, tokens_of(c, 1, 50 + token)},
                                               {&chunked, tokens_of(c, 1, 70 + token)}}));
      std::cout << "[ paged ] " << GetParam() << ", " << run << ": largest difference " << largest << "\n";
    }
}

// Copy on write: B starts as a fork of A, sharing A's full first block and taking a copy of its partly filled
// second one; then both continue with different tokens in one batch (A into its own second block), and decode.
// The block B copies into held another sequence's keys before, so a copy not made shows.
TEST_P(PagedBatchTest, ForkedSequenceContinuesFromACopiedBlock) {
  PagedBatch runs(model_path(GetParam()), 512);
  const model::ModelConfig& c = runs.config();
  Sequence& a = runs.start();
  Sequence& finished = runs.start();
  runs.step({{&a, tokens_of(c, 20, 1)}, {&finished, tokens_of(c, 16, 9)}});
  ASSERT_EQ(a.blocks.size(), 2u);

  Sequence& b = runs.start();
  const BlockId copy = finished.blocks[0];
  b.blocks = {a.blocks[0], copy};
  // B alone evaluates A's prompt first.
  b.alone->forward(a.tokens, 0);
  b.tokens = a.tokens;
  float largest = runs.step({{&a, tokens_of(c, 3, 2)}, {&b, tokens_of(c, 4, 3), Logits::All}}, {{a.blocks[1], copy}});
  for (uint32_t token = 0; token < 4; ++token)
    largest = std::max(largest, runs.step({{&b, tokens_of(c, 1, 10 + token)}, {&a, tokens_of(c, 1, 20 + token)}}));
  std::cout << "[ paged ] " << GetParam() << ", fork: largest difference " << largest << "\n";
}

// Llama models, sliding windows (Gemma 2 and 3: windows of 8 positions) and learned positions (GPT-2).
INSTANTIATE_TEST_SUITE_P(Models, PagedBatchTest,
                         ::testing::Values("models/stories260K", "models/synth-tiny256-Q4_K_M",
                                           "arch/models/synth-gemma2-Q4_K_M", "arch/models/synth-gemma3-Q4_K_M",
                                           "arch/models/synth-gpt2-Q4_K_M"),
                         [](const ::testing::TestParamInfo<std::string>& param) {
                           std::string name = param.param.substr(param.param.rfind('/') + 1);
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

template <typename Call>
void expect_error(const Call& call, const std::string& part) {
  try {
    call();
    FAIL() << "expected an error naming \"" << part << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(PagedBatchErrors, NameWhatIsWrong) {
  const model::ExecutionPlan plan = model::ExecutionPlan::build(gguf::File::open(model_path("models/stories260K")),
                                                                std::make_shared<cpu::MappedResidency>());
  cpu::Transformer paged(plan, options_of(4));
  EXPECT_EQ(paged.kv_blocks(), 4);
  EXPECT_EQ(paged.context(), 4 * kKvBlockPositions);
  EXPECT_EQ(paged.cached(), 0);
  EXPECT_EQ(paged.max_batch(), 512);
  const std::vector<int32_t> tokens = tokens_of(plan.config(), 20, 1);
  const std::vector<BlockId> two = {3, 1};

  const std::vector<BlockId> outside = {3, 4};
  expect_error([&] { paged.forward(std::vector<BatchSequence>{{tokens, 0, outside}}, {}); }, "block 4");
  const std::vector<BlockCopy> bad_copy = {{1, -1}};
  expect_error([&] { paged.forward(std::vector<BatchSequence>{{tokens, 0, two}}, bad_copy); }, "block -1");
  const std::vector<BlockId> one = {2};
  expect_error([&] { paged.forward(std::vector<BatchSequence>{{tokens, 0, one}}, {}); }, "table of 1 blocks");
  // A table for more positions than the pool holds repeats its blocks.
  const std::vector<BlockId> repeated = {0, 1, 2, 3, 0};
  const std::vector<int32_t> long_tokens = tokens_of(plan.config(), 70, 2);
  expect_error([&] { paged.forward(std::vector<BatchSequence>{{long_tokens, 0, repeated}}, {}); }, "positions of");

  expect_error([&] { paged.forward(tokens, 0); }, "paged");
  expect_error([&] { paged.forward_hidden(tokens, 0); }, "paged");
  expect_error([&] { paged.truncate(0); }, "paged");

  // Nothing was computed: a valid batch still runs.
  EXPECT_EQ(paged.forward(std::vector<BatchSequence>{{tokens, 0, two}}, {}).size(),
            static_cast<size_t>(plan.config().vocab_size));

  // A single-sequence transformer takes no batches.
  cpu::Transformer single(plan, options_of(0));
  EXPECT_EQ(single.kv_blocks(), 0);
  expect_error([&] { single.forward(std::vector<BatchSequence>{{tokens, 0, two}}, {}); }, "paged one");
}

}  // namespace
}  // namespace rf
