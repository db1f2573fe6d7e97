// The harness of the paged forward passes' tests, paged_batch_test.cpp on the CPU and gpu_paged_test.cpp on the GPU:
// sequences evaluated in batches through block tables of a shared pool, each compared with the same sequence alone
// on a single-sequence transformer of the same backend, in the scenarios both backends run, and the errors both
// name. A backend supplies its passes and its tolerance (Backend below); the GPU's harness also compares each batch
// with the CPU's paged pass (check_batch). A batch with Argmax sequences runs again with Last in their place, which
// their argmax must be the largest logit of.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/transformer.h"
#include "error_of.h"
#include "gguf/gguf.h"
#include "model/execution_plan.h"
#include "model/forward_pass.h"
#include "test_paths.h"
#include "util/argmax.h"

namespace rf::test {

inline constexpr int64_t kPoolBlocks = 64;
inline constexpr int64_t kContext = 128;  // of the single-sequence transformers

inline cpu::TransformerOptions cpu_options(int64_t kv_blocks, int64_t max_batch = 512, bool float_activations = true) {
  cpu::TransformerOptions options;
  options.threads = 2;
  options.context = kContext;
  options.max_batch = max_batch;
  options.kv_blocks = kv_blocks;
  options.float_activations = float_activations;
  return options;
}

// `count` token ids of the vocabulary, different for each seed.
inline std::vector<int32_t> tokens_of(const model::ModelConfig& config, int64_t count, uint32_t seed) {
  std::mt19937 random(seed);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(std::min<int64_t>(config.vocab_size, 512) - 1));
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  for (int32_t& token : tokens) token = id(random);
  return tokens;
}

// `model`: the model file's path under ../shared, without ".gguf".
inline std::string model_path(const std::string& model) { return shared_path(model + ".gguf"); }

// The models the scenarios run on, for INSTANTIATE_TEST_SUITE_P with model_name: Llama models, sliding windows
// (Gemma 2 with soft caps and Gemma 3 with q/k norms: windows of 8 positions) and learned positions (GPT-2).
inline auto paged_models() {
  return ::testing::Values("models/stories260K", "models/synth-tiny256-Q4_K_M", "arch/models/synth-gemma2-Q4_K_M",
                           "arch/models/synth-gemma3-Q4_K_M", "arch/models/synth-gpt2-Q4_K_M");
}

inline std::string model_name(const ::testing::TestParamInfo<std::string>& param) {
  std::string name = param.param.substr(param.param.rfind('/') + 1);
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

// A sequence evaluated in the batches of a paged pass, through its block table, and alone.
struct Sequence {
  std::vector<model::BlockId> blocks;
  std::vector<int32_t> tokens;  // evaluated so far
  std::unique_ptr<model::ForwardPass> alone;
};

// One sequence's part of a step: its next tokens, and the logits it asks for.
struct Part {
  Sequence* sequence;
  std::vector<int32_t> tokens;
  model::Logits logits = model::Logits::Last;
};

// `Backend` supplies, as static functions:
//   residency(): the residency its plans are built with;
//   pass(plan, kv_blocks, max_batch, float_activations): a transformer (paged where kv_blocks > 0);
//   tolerance(largest_logit, float_activations): how far a row of a batch may be from the same row alone, given
//   the largest logit of that row.
template <typename Backend>
class PagedBatch {
 public:
  PagedBatch(const std::string& path, int64_t max_batch, bool float_activations = true)
      : file_(gguf::File::open(path)),
        plan_(model::ExecutionPlan::build(file_, Backend::residency())),
        float_activations_(float_activations),
        paged_(Backend::pass(plan_, kPoolBlocks, max_batch, float_activations)) {
    // Blocks handed out in a shuffled order: tables of non-consecutive ids, with a run of consecutive ones at times.
    free_.resize(kPoolBlocks);
    std::iota(free_.begin(), free_.end(), 0);
    std::shuffle(free_.begin(), free_.end(), std::mt19937(7));
  }
  virtual ~PagedBatch() = default;

  const model::ModelConfig& config() const { return plan_.config(); }

  Sequence& start() {
    sequences_.push_back(std::make_unique<Sequence>());
    sequences_.back()->alone = Backend::pass(plan_, 0, 512, float_activations_);
    return *sequences_.back();
  }

  // Adds blocks to the sequence's table until it holds `positions`.
  void reserve(Sequence& sequence, int64_t positions) {
    while (static_cast<int64_t>(sequence.blocks.size()) * model::kKvBlockPositions < positions) {
      sequence.blocks.push_back(free_.back());
      free_.pop_back();
    }
  }

  // Runs the parts as one batch after `copies` on the paged pass, and each part alone on its sequence's own
  // transformer; expects each row of the batch within the backend's tolerance of the same row alone, and each Argmax
  // part's token to be that of the largest logit the part gets with Last (expect_argmax_of_last_logits).
  void step(const std::vector<Part>& parts, const std::vector<model::BlockCopy>& copies = {}) {
    std::vector<model::BatchSequence> batch;
    for (const Part& part : parts) {
      Sequence& sequence = *part.sequence;
      const auto position = static_cast<int64_t>(sequence.tokens.size());
      reserve(sequence, position + static_cast<int64_t>(part.tokens.size()));
      batch.push_back({part.tokens, position, sequence.blocks, part.logits});
    }
    const std::span<const float> got = paged_->forward(batch, copies);
    check_batch(batch, copies, got);
    const std::vector<float> got_rows(got.begin(), got.end());
    const std::vector<int32_t> argmax(paged_->argmax().begin(), paged_->argmax().end());

    const auto vocab = static_cast<size_t>(config().vocab_size);
    size_t row = 0;
    for (const Part& part : parts) {
      Sequence& sequence = *part.sequence;
      const auto position = static_cast<int64_t>(sequence.tokens.size());
      const model::Logits which = part.logits == model::Logits::All ? model::Logits::All : model::Logits::Last;
      const std::span<const float> expected = sequence.alone->forward(part.tokens, position, which);
      sequence.tokens.insert(sequence.tokens.end(), part.tokens.begin(), part.tokens.end());
      if (part.logits == model::Logits::None || part.logits == model::Logits::Argmax) continue;
      ASSERT_LE(row * vocab + expected.size(), got.size()) << "the batch returned " << got.size() / vocab << " rows";
      for (size_t first = 0; first < expected.size(); first += vocab, ++row) {
        float largest_logit = 0.0f;
        float difference = 0.0f;
        for (size_t i = 0; i < vocab; ++i) {
          largest_logit = std::max(largest_logit, std::abs(expected[first + i]));
          difference = std::max(difference, std::abs(got[row * vocab + i] - expected[first + i]));
        }
        EXPECT_LE(difference, Backend::tolerance(largest_logit, float_activations_)) << "row " << row;
        largest_difference_ = std::max(largest_difference_, difference);
        largest_relative_difference_ = std::max(largest_relative_difference_, difference / largest_logit);
      }
    }
    EXPECT_EQ(row * vocab, got.size());
    expect_argmax_of_last_logits(batch, got_rows, argmax);
  }

  // Runs `batch` (just run, which returned the rows `got` and the tokens `argmax`) once more with Last in place of
  // Argmax, writing the same keys and values again: expects each Argmax sequence's token to be the index of the
  // largest logit of its row now, and every row returned before to be the same bits now.
  void expect_argmax_of_last_logits(std::vector<model::BatchSequence> batch, const std::vector<float>& got,
                                    const std::vector<int32_t>& argmax) {
    std::vector<bool> asked_argmax;
    for (model::BatchSequence& sequence : batch) {
      asked_argmax.push_back(sequence.logits == model::Logits::Argmax);
      if (asked_argmax.back()) sequence.logits = model::Logits::Last;
    }
    const auto asking = static_cast<size_t>(std::count(asked_argmax.begin(), asked_argmax.end(), true));
    ASSERT_EQ(argmax.size(), asking);
    if (asking == 0) return;
    const std::span<const float> with_last = paged_->forward(batch, {});
    const auto vocab = static_cast<size_t>(config().vocab_size);
    size_t row = 0;         // of with_last
    size_t got_row = 0;     // of got
    size_t argmax_row = 0;  // of argmax
    for (size_t i = 0; i < batch.size(); ++i) {
      const auto rows = static_cast<size_t>(model::logits_rows(batch[i]));
      ASSERT_LE((row + rows) * vocab, with_last.size());
      if (asked_argmax[i]) {
        EXPECT_EQ(argmax[argmax_row++], index_of_largest(with_last.subspan(row * vocab, vocab))) << "sequence " << i;
      } else {
        EXPECT_TRUE(std::equal(got.begin() + static_cast<std::ptrdiff_t>(got_row * vocab),
                               got.begin() + static_cast<std::ptrdiff_t>((got_row + rows) * vocab),
                               with_last.begin() + static_cast<std::ptrdiff_t>(row * vocab)))
            << "sequence " << i << "'s logits changed when others asked for their argmax";
        got_row += rows;
      }
      row += rows;
    }
  }

  // Prints how far the batches' rows were from the same rows alone, over every step so far.
  virtual void report(const std::string& what) const {
    std::cout << "[ paged ] " << what << ": largest difference " << largest_difference_ << " ("
              << largest_relative_difference_ << " of the row's largest logit)\n";
  }

 protected:
  // Checks a batch's rows `got` further, where the backend has another paged pass to compare them with.
  virtual void check_batch(std::span<const model::BatchSequence> /*batch*/,
                           std::span<const model::BlockCopy> /*copies*/, std::span<const float> /*got*/) {}

  const std::shared_ptr<const gguf::File>& file() const { return file_; }
  bool float_activations() const { return float_activations_; }
  float largest_difference() const { return largest_difference_; }
  // Relative to the row's largest logit.
  float largest_relative_difference() const { return largest_relative_difference_; }

 private:
  std::shared_ptr<const gguf::File> file_;
  model::ExecutionPlan plan_;
  bool float_activations_;
  std::unique_ptr<model::ForwardPass> paged_;
  std::vector<model::BlockId> free_;
  std::vector<std::unique_ptr<Sequence>> sequences_;
  float largest_difference_ = 0.0f;
  float largest_relative_difference_ = 0.0f;
};

// Calls check(runs, run) with a fresh Runs (a PagedBatch) of model `name` for float and for 8-bit activations, each
// in passes of 512 and of 5 tokens; `run` names the setting.
template <typename Runs, typename Check>
void for_each_setting(const std::string& name, const Check& check) {
  for (const bool float_activations : {true, false})
    for (const int64_t max_batch : {512, 5}) {
      const std::string run =
          std::string(float_activations ? "float" : "8-bit") + " activations, max_batch " + std::to_string(max_batch);
      SCOPED_TRACE(run);
      Runs runs(model_path(name), max_batch, float_activations);
      check(runs, run);
    }
}

// Prompts of different lengths, one of them in two chunks (None, then its last token's row) and one with every row's
// logits; then continuations at the positions the prompts reached, with a new prompt beside them; then decode steps of
// a token each, crossing block boundaries. With max_batch 5 the same batches run in passes that cut sequences apart.
// With float activations, then with 8-bit ones. With `argmax`, some sequences ask for the index of their last token's
// largest logit (Argmax) instead of its row (Last), beside sequences that ask for rows or none, in a mix that changes
// from decode step to decode step (the GPU replays one decoding graph for all of them); PagedBatch::step runs each
// such batch again with Last in place of Argmax, which the argmax must match. `Runs`: a PagedBatch; `name`: a model
// of paged_models().
template <typename Runs>
void expect_sequences_of_the_scenario_get_what_they_get_alone(const std::string& name, bool argmax) {
  using model::Logits;
  // What a sequence asks for of its last token where it may ask for the argmax.
  const auto newest = [argmax](bool asks_argmax) { return argmax && asks_argmax ? Logits::Argmax : Logits::Last; };
  for_each_setting<Runs>(name, [&](Runs& runs, const std::string& run) {
    const model::ModelConfig& c = runs.config();
    Sequence& a = runs.start();
    Sequence& b = runs.start();
    Sequence& chunked = runs.start();
    Sequence& late = runs.start();
    runs.step({{&a, tokens_of(c, 21, 1), newest(true)},
               {&b, tokens_of(c, 5, 2), Logits::All},
               {&chunked, tokens_of(c, 12, 3), Logits::None}});
    runs.step({{&a, tokens_of(c, 7, 4), newest(false)},
               {&chunked, tokens_of(c, 9, 5), newest(true)},
               {&late, tokens_of(c, 30, 6), newest(true)},
               {&b, tokens_of(c, 3, 7), Logits::All}});
    for (uint32_t token = 0; token < 12; ++token) {
      const auto which = [&](uint32_t sequence) { return newest(token % 3 == 0 || (token + sequence) % 2 == 0); };
      runs.step({{&late, tokens_of(c, 1, 10 + token), which(0)},
                 {&a, tokens_of(c, 1, 30 + token), which(1)},
                 {&b, tokens_of(c, 1, 50 + token), which(2)},
                 {&chunked, tokens_of(c, 1, 70 + token), which(3)}});
    }
    runs.report(name + (argmax ? ", argmax, " : ", ") + run);
  });
}

template <typename Runs>
void expect_sequences_get_the_logits_they_get_alone(const std::string& name) {
  expect_sequences_of_the_scenario_get_what_they_get_alone<Runs>(name, false);
}

template <typename Runs>
void expect_argmax_sequences_get_their_largest_logit(const std::string& name) {
  expect_sequences_of_the_scenario_get_what_they_get_alone<Runs>(name, true);
}

// Copy on write: B starts as a fork of A, sharing A's full first block and taking a copy of its partly filled
// second one; then both continue with different tokens in one batch (A into its own second block), and decode.
// The block B copies into held another sequence's keys before, so a copy not made shows. `Runs`: a PagedBatch;
// `name`: a model of paged_models().
template <typename Runs>
void expect_forked_sequence_continues_from_a_copied_block(const std::string& name) {
  Runs runs(model_path(name), 512);
  const model::ModelConfig& c = runs.config();
  Sequence& a = runs.start();
  Sequence& finished = runs.start();
  runs.step({{&a, tokens_of(c, 20, 1)}, {&finished, tokens_of(c, 16, 9)}});
  ASSERT_EQ(a.blocks.size(), 2u);

  Sequence& b = runs.start();
  const model::BlockId copy = finished.blocks[0];
  b.blocks = {a.blocks[0], copy};
  // B alone evaluates A's prompt first.
  b.alone->forward(a.tokens, 0, model::Logits::Last);
  b.tokens = a.tokens;
  runs.step({{&a, tokens_of(c, 3, 2)}, {&b, tokens_of(c, 4, 3), model::Logits::All}}, {{a.blocks[1], copy}});
  for (uint32_t token = 0; token < 4; ++token)
    runs.step({{&b, tokens_of(c, 1, 10 + token)}, {&a, tokens_of(c, 1, 20 + token)}});
  runs.report(name + ", fork");
}

inline void expect_error_naming(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos)
      << "expected an error naming \"" << part << "\", got \"" << message << "\"";
}

// What a paged pass of 4 blocks and max_batch 512 (`paged`) and a single-sequence pass of the same plan (`single`)
// refuse, each an error naming what is wrong; a valid batch still runs after them, since they computed nothing.
inline void expect_paged_errors(model::ForwardPass& paged, model::ForwardPass& single,
                                const model::ModelConfig& config) {
  using model::BatchSequence;
  using model::BlockCopy;
  using model::BlockId;
  EXPECT_EQ(paged.kv_blocks(), 4);
  EXPECT_EQ(paged.context(), 4 * model::kKvBlockPositions);
  EXPECT_EQ(paged.cached(), 0);
  EXPECT_EQ(paged.max_batch(), 512);
  const std::vector<int32_t> tokens = tokens_of(config, 20, 1);
  const std::vector<BlockId> two = {3, 1};
  const auto forward = [&](std::span<const int32_t> batch_tokens, std::span<const BlockId> blocks,
                           std::span<const BlockCopy> copies = {}) {
    return error_of([&] { paged.forward(std::vector<BatchSequence>{{batch_tokens, 0, blocks}}, copies); });
  };

  expect_error_naming(forward(tokens, std::vector<BlockId>{3, 4}), "block 4");
  expect_error_naming(forward(tokens, two, std::vector<BlockCopy>{{1, -1}}), "block -1");
  expect_error_naming(forward(tokens, std::vector<BlockId>{2}), "table of 1 blocks");
  // A table for more positions than the pool holds repeats its blocks.
  expect_error_naming(forward(tokens_of(config, 70, 2), std::vector<BlockId>{0, 1, 2, 3, 0}), "positions of");

  expect_error_naming(error_of([&] { paged.forward(tokens, 0, model::Logits::Last); }), "paged");
  expect_error_naming(error_of([&] { paged.truncate(0); }), "paged");

  EXPECT_EQ(paged.forward(std::vector<BatchSequence>{{tokens, 0, two}}, {}).size(),
            static_cast<size_t>(config.vocab_size));

  EXPECT_EQ(single.kv_blocks(), 0);
  expect_error_naming(error_of([&] { single.forward(std::vector<BatchSequence>{{tokens, 0, two}}, {}); }), "paged one");
}

}  // namespace rf::test
