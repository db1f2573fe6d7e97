// The GPU's paged forward pass evaluates many sequences at once, each through its own block table of a shared pool:
// every sequence gets the logits that the GPU's single-sequence transformer (contiguous cache, graphs, fused decode
// attention) gives it alone, and those that the CPU's paged pass gives it in the same batch, whatever its blocks, its
// starting position, the other sequences of the batch, or the passes the batch is cut into. The scenarios are
// paged_batch_test.cpp's.
#include <gtest/gtest.h>

#if ROCMFORGE_HAVE_GPU
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/residency.h"
#include "backend/cpu/transformer.h"
#include "backend/gpu/runtime.h"
#include "backend/gpu/transformer.h"
#include "error_of.h"
#include "reference.h"
#include "test_paths.h"

namespace rf::gpu {
namespace {

using model::BatchSequence;
using model::BlockCopy;
using model::BlockId;
using model::kKvBlockPositions;
using test::cosine;

constexpr int64_t kPoolBlocks = 64;
constexpr int64_t kContext = 128;  // of the single-sequence transformers

// A sequence's rows, batched or alone, differ in how they are computed: alone, a prompt's attention runs on tensor
// cores where the head allows (queries and softmax weights rounded to f16) and a decoding token's in the split-K
// decode kernel, a paged pass's in the scalar kernel; products of more rows take other GEMM tilings. With float
// activations (every product a GEMM of f16 inputs with f32 sums) that stays rounding: the tolerance is four f16 steps
// (2^-11 each) of the row's largest logit. Measured: up to 9.3e-4 of it (stories260K; synth-tiny256 7e-4), 0 on
// Gemma 2 (soft caps: the same kernels both ways).
constexpr float kRelativeTolerance = 2e-3f;
// With 8-bit activations a rounding difference can move a value across an 8-bit step when the next product quantizes
// it, and a product's rows run as matrix-vector passes (the 8-bit levels summed exactly) up to 8 rows and as GEMMs
// (their f16 values) beyond, so one row alone and in a batch takes different ones: the CPU's bound
// (paged_batch_test.cpp's kTolerance8BitActivations), measured up to 2.5e-2 on synth-tiny256 (logits up to 1.2).
constexpr float kTolerance8BitActivations = 5e-2f;
// Against the CPU's paged pass, row by row. With float activations, gpu_transformer_test.cpp's bound for the GPU
// against the CPU (measured 0.999994). With 8-bit activations the GPU's GEMMs multiply the f16 values of the 8-bit
// levels where the CPU sums the levels exactly: the synthetic Gemmas, whose logits are a few hundredths, measured
// cosines down to 0.9977 (Gemma 2, prompts as GEMMs; 0.99955 in passes of 5, matrix-vector products) and 0.9991
// (Gemma 3), the others 0.9997 and more.
constexpr double kCpuCosine = 0.9999;
constexpr double kCpuCosine8BitActivations = 0.995;

TransformerOptions gpu_options(int64_t kv_blocks, int64_t max_batch, bool float_activations) {
  return {.context = kContext, .max_batch = max_batch, .float_activations = float_activations, .kv_blocks = kv_blocks};
}

cpu::TransformerOptions cpu_options(int64_t kv_blocks, int64_t max_batch, bool float_activations) {
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

// A sequence evaluated three times over: in the batches of the GPU's paged pass and of the CPU's, through its block
// table, and alone on the GPU.
struct Sequence {
  std::vector<BlockId> blocks;
  std::vector<int32_t> tokens;  // evaluated so far
  std::unique_ptr<Transformer> alone;
};

// One sequence's part of a step: its next tokens, and the logits it asks for.
struct Part {
  Sequence* sequence;
  std::vector<int32_t> tokens;
  Logits logits = Logits::Last;
};

// How far a paged pass's rows were from the same rows alone (largest difference, and largest relative to the row's
// largest logit) and from the CPU's paged pass (smallest cosine, largest difference).
struct Agreement {
  float largest_difference = 0.0f;
  float largest_relative_difference = 0.0f;
  double smallest_cosine = 1.0;
  float largest_difference_to_cpu = 0.0f;
};

class GpuPagedBatch {
 public:
  GpuPagedBatch(const std::string& path, int64_t max_batch, bool float_activations = true)
      : file_(gguf::File::open(path)),
        plan_(model::ExecutionPlan::build(file_, make_residency())),
        cpu_plan_(model::ExecutionPlan::build(file_, std::make_shared<cpu::MappedResidency>())),
        float_activations_(float_activations),
        paged_(plan_, gpu_options(kPoolBlocks, max_batch, float_activations)),
        cpu_paged_(cpu_plan_, cpu_options(kPoolBlocks, max_batch, float_activations)) {
    // Blocks handed out in a shuffled order: tables of non-consecutive ids, with a run of consecutive ones at times.
    free_.resize(kPoolBlocks);
    std::iota(free_.begin(), free_.end(), 0);
    std::shuffle(free_.begin(), free_.end(), std::mt19937(7));
  }

  const model::ModelConfig& config() const { return plan_.config(); }
  const Agreement& agreement() const { return agreement_; }

  Sequence& start() {
    sequences_.push_back(std::make_unique<Sequence>());
    sequences_.back()->alone = std::make_unique<Transformer>(plan_, gpu_options(0, 512, float_activations_));
    return *sequences_.back();
  }

  // Adds blocks to the sequence's table until it holds `positions`.
  void reserve(Sequence& sequence, int64_t positions) {
    while (static_cast<int64_t>(sequence.blocks.size()) * kKvBlockPositions < positions) {
      sequence.blocks.push_back(free_.back());
      free_.pop_back();
    }
  }

  // Runs the parts as one batch after `copies` on both paged passes, and each part alone on its sequence's own
  // transformer; expects the GPU's batch to give the rows alone within the tolerance and the CPU's batch's rows within
  // the cosine bound.
  void step(const std::vector<Part>& parts, const std::vector<BlockCopy>& copies = {}) {
    std::vector<BatchSequence> batch;
    for (const Part& part : parts) {
      Sequence& sequence = *part.sequence;
      const auto position = static_cast<int64_t>(sequence.tokens.size());
      reserve(sequence, position + static_cast<int64_t>(part.tokens.size()));
      batch.push_back({part.tokens, position, sequence.blocks, part.logits});
    }
    const std::span<const float> got = paged_.forward(batch, copies);
    const std::span<const float> cpu = cpu_paged_.forward(batch, copies);

    const auto vocab = static_cast<size_t>(config().vocab_size);
    ASSERT_EQ(got.size(), cpu.size());
    for (size_t first = 0; first < got.size(); first += vocab) {
      const double to_cpu = cosine(got.subspan(first, vocab), cpu.subspan(first, vocab));
      EXPECT_GE(to_cpu, float_activations_ ? kCpuCosine : kCpuCosine8BitActivations) << "row " << first / vocab;
      agreement_.smallest_cosine = std::min(agreement_.smallest_cosine, to_cpu);
    }
    for (size_t i = 0; i < got.size(); ++i)
      agreement_.largest_difference_to_cpu = std::max(agreement_.largest_difference_to_cpu, std::abs(got[i] - cpu[i]));

    size_t row = 0;
    for (const Part& part : parts) {
      Sequence& sequence = *part.sequence;
      const auto position = static_cast<int64_t>(sequence.tokens.size());
      const std::span<const float> expected =
          sequence.alone->forward(part.tokens, position, part.logits == Logits::All ? Logits::All : Logits::Last);
      sequence.tokens.insert(sequence.tokens.end(), part.tokens.begin(), part.tokens.end());
      if (part.logits == Logits::None) continue;
      ASSERT_LE(row * vocab + expected.size(), got.size()) << "the batch returned " << got.size() / vocab << " rows";
      for (size_t first = 0; first < expected.size(); first += vocab, ++row) {
        float largest_logit = 0.0f;
        float difference = 0.0f;
        for (size_t i = 0; i < vocab; ++i) {
          largest_logit = std::max(largest_logit, std::abs(expected[first + i]));
          difference = std::max(difference, std::abs(got[row * vocab + i] - expected[first + i]));
        }
        if (float_activations_)
          EXPECT_LE(difference, kRelativeTolerance * largest_logit) << "row " << row;
        else
          EXPECT_LE(difference, kTolerance8BitActivations) << "row " << row;
        agreement_.largest_difference = std::max(agreement_.largest_difference, difference);
        agreement_.largest_relative_difference =
            std::max(agreement_.largest_relative_difference, difference / largest_logit);
      }
    }
    EXPECT_EQ(row * vocab, got.size());
  }

 private:
  std::shared_ptr<const gguf::File> file_;
  model::ExecutionPlan plan_;
  model::ExecutionPlan cpu_plan_;
  bool float_activations_;
  Transformer paged_;
  cpu::Transformer cpu_paged_;
  std::vector<BlockId> free_;
  std::vector<std::unique_ptr<Sequence>> sequences_;
  Agreement agreement_;
};

// `model`: the model file's path under ../shared, without ".gguf".
std::string model_path(const std::string& model) { return test::shared_path(model + ".gguf"); }

void report(const std::string& what, const Agreement& agreement) {
  std::cout << "[ gpu paged ] " << what << ": largest difference alone " << agreement.largest_difference << " ("
            << agreement.largest_relative_difference << " of the row's largest logit), smallest cosine to the CPU "
            << agreement.smallest_cosine << " (largest difference " << agreement.largest_difference_to_cpu << ")\n";
}

class GpuPagedBatchTest : public ::testing::TestWithParam<std::string> {};

// Prompts of different lengths, one of them in two chunks (None, then Last) and one with every row's logits; then
// continuations at the positions the prompts reached, with a new prompt beside them; then decode steps of a token
// each, crossing block boundaries. With max_batch 5 the same batches run in passes that cut sequences apart. With
// float activations, then with 8-bit ones.
TEST_P(GpuPagedBatchTest, SequencesGetTheLogitsTheyGetAlone) {
  if (!device_available()) GTEST_SKIP() << "no GPU";
  if (!std::filesystem::exists(model_path(GetParam()))) GTEST_SKIP() << GetParam() << " is not here";
  for (const bool float_activations : {true, false})
    for (const int64_t max_batch : {512, 5}) {
      const std::string run =
          std::string(float_activations ? "float" : "8-bit") + " activations, max_batch " + std::to_string(max_batch);
      SCOPED_TRACE(run);
      GpuPagedBatch runs(model_path(GetParam()), max_batch, float_activations);
      const model::ModelConfig& c = runs.config();
      Sequence& a = runs.start();
      Sequence& b = runs.start();
      Sequence& chunked = runs.start();
      Sequence& late = runs.start();
      runs.step({{&a, tokens_of(c, 21, 1)},
                 {&b, tokens_of(c, 5, 2), Logits::All},
                 {&chunked, tokens_of(c, 12, 3), Logits::None}});
      runs.step({{&a, tokens_of(c, 7, 4)},
                 {&chunked, tokens_of(c, 9, 5)},
                 {&late, tokens_of(c, 30, 6)},
                 {&b, tokens_of(c, 3, 7), Logits::All}});
      for (uint32_t token = 0; token < 12; ++token)
        runs.step({{&late, tokens_of(c, 1, 10 + token)},
                   {&a, tokens_of(c, 1, 30 + token)},
                   {&b, tokens_of(c, 1, 50 + token)},
                   {&chunked, tokens_of(c, 1, 70 + token)}});
      report(GetParam() + ", " + run, runs.agreement());
    }
}

// Copy on write: B starts as a fork of A, sharing A's full first block and taking a copy of its partly filled
// second one; then both continue with different tokens in one batch (A into its own second block), and decode.
// The block B copies into held another sequence's keys before, so a copy not made shows.
TEST_P(GpuPagedBatchTest, ForkedSequenceContinuesFromACopiedBlock) {
  if (!device_available()) GTEST_SKIP() << "no GPU";
  if (!std::filesystem::exists(model_path(GetParam()))) GTEST_SKIP() << GetParam() << " is not here";
  GpuPagedBatch runs(model_path(GetParam()), 512);
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
  runs.step({{&a, tokens_of(c, 3, 2)}, {&b, tokens_of(c, 4, 3), Logits::All}}, {{a.blocks[1], copy}});
  for (uint32_t token = 0; token < 4; ++token)
    runs.step({{&b, tokens_of(c, 1, 10 + token)}, {&a, tokens_of(c, 1, 20 + token)}});
  report(GetParam() + ", fork", runs.agreement());
}

// Llama models, sliding windows (Gemma 2 with soft caps and Gemma 3 with q/k norms: windows of 8 positions) and
// learned positions (GPT-2).
INSTANTIATE_TEST_SUITE_P(Models, GpuPagedBatchTest,
                         ::testing::Values("models/stories260K", "models/synth-tiny256-Q4_K_M",
                                           "arch/models/synth-gemma2-Q4_K_M", "arch/models/synth-gemma3-Q4_K_M",
                                           "arch/models/synth-gpt2-Q4_K_M"),
                         [](const ::testing::TestParamInfo<std::string>& param) {
                           std::string name = param.param.substr(param.param.rfind('/') + 1);
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

void expect_error_naming(const std::string& message, const std::string& part) {
  EXPECT_NE(message.find(part), std::string::npos) << "expected an error naming \"" << part << "\", got \""
                                                   << message << "\"";
}

TEST(GpuPagedErrors, NameWhatIsWrong) {
  if (!device_available()) GTEST_SKIP() << "no GPU";
  const std::string path = model_path("models/stories260K");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "stories260K.gguf is not here";
  const std::shared_ptr<const gguf::File> file = gguf::File::open(path);
  const model::ExecutionPlan plan = model::ExecutionPlan::build(file, make_residency());
  Transformer paged(plan, gpu_options(4, 512, false));
  EXPECT_EQ(paged.kv_blocks(), 4);
  EXPECT_EQ(paged.context(), 4 * kKvBlockPositions);
  EXPECT_EQ(paged.cached(), 0);
  EXPECT_EQ(paged.max_batch(), 512);
  EXPECT_FALSE(paged.decodes_in_chains());
  const std::vector<int32_t> tokens = tokens_of(plan.config(), 20, 1);
  const std::vector<BlockId> two = {3, 1};
  const auto forward = [&](std::span<const int32_t> batch_tokens, std::span<const BlockId> blocks,
                           std::span<const BlockCopy> copies = {}) {
    return test::error_of([&] { paged.forward(std::vector<BatchSequence>{{batch_tokens, 0, blocks}}, copies); });
  };

  expect_error_naming(forward(tokens, std::vector<BlockId>{3, 4}), "block 4");
  expect_error_naming(forward(tokens, two, std::vector<BlockCopy>{{1, -1}}), "block -1");
  expect_error_naming(forward(tokens, std::vector<BlockId>{2}), "table of 1 blocks");
  // A table for more positions than the pool holds repeats its blocks.
  expect_error_naming(forward(tokens_of(plan.config(), 70, 2), std::vector<BlockId>{0, 1, 2, 3, 0}), "positions of");

  expect_error_naming(test::error_of([&] { paged.forward(tokens, 0); }), "paged");
  const std::vector<float> hidden(static_cast<size_t>(plan.config().n_embd));
  expect_error_naming(test::error_of([&] { paged.forward(hidden, 0); }), "paged");
  expect_error_naming(test::error_of([&] { paged.truncate(0); }), "paged");

  // Nothing was computed: a valid batch still runs.
  EXPECT_EQ(paged.forward(std::vector<BatchSequence>{{tokens, 0, two}}, {}).size(),
            static_cast<size_t>(plan.config().vocab_size));

  // A single-sequence transformer takes no batches.
  Transformer single(plan, gpu_options(0, 512, false));
  EXPECT_EQ(single.kv_blocks(), 0);
  expect_error_naming(test::error_of([&] { single.forward(std::vector<BatchSequence>{{tokens, 0, two}}, {}); }),
                      "paged one");

  // The layers before a split run on the CPU with a cache of their own: a paged pass needs them all here.
  const model::ExecutionPlan later_layers = model::ExecutionPlan::build(file, make_residency(1));
  expect_error_naming(test::error_of([&] { Transformer split(later_layers, gpu_options(4, 512, false)); }),
                      "every layer");
}

}  // namespace
}  // namespace rf::gpu
#endif
