// The GPU's paged forward pass evaluates many sequences at once, each through its own block table of a shared pool:
// every sequence gets the logits that the GPU's single-sequence transformer (contiguous cache, graphs, fused decode
// attention) gives it alone, and those that the CPU's paged pass gives it in the same batch, whatever its blocks, its
// starting position, the other sequences of the batch, or the passes the batch is cut into; and a sequence that asks
// for the argmax of its logits gets the index of their largest, from any mix of decoding rows that one graph replays.
// The harness and the scenarios are paged_harness.h's, as paged_batch_test.cpp runs them on the CPU.
#include <gtest/gtest.h>

#if ROCMFORGE_HAVE_GPU
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/residency.h"
#include "backend/cpu/transformer.h"
#include "backend/gpu/runtime.h"
#include "backend/gpu/transformer.h"
#include "backend/paged_harness.h"
#include "reference.h"

namespace rf::gpu {
namespace {

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
  return {.context = test::kContext,
          .max_batch = max_batch,
          .float_activations = float_activations,
          .kv_blocks = kv_blocks};
}

// The GPU's passes for test::PagedBatch.
struct GpuPasses {
  static std::shared_ptr<model::Residency> residency() { return make_residency(); }
  static std::unique_ptr<model::ForwardPass> pass(const model::ExecutionPlan& plan, int64_t kv_blocks,
                                                  int64_t max_batch, bool float_activations) {
    return std::make_unique<Transformer>(plan, gpu_options(kv_blocks, max_batch, float_activations));
  }
  static float tolerance(float largest_logit, bool float_activations) {
    return float_activations ? kRelativeTolerance * largest_logit : kTolerance8BitActivations;
  }
};

// Each batch also runs on the CPU's paged pass, whose rows the GPU's must match within the cosine bound.
class GpuPagedBatch : public test::PagedBatch<GpuPasses> {
 public:
  GpuPagedBatch(const std::string& path, int64_t max_batch, bool float_activations = true)
      : PagedBatch(path, max_batch, float_activations),
        cpu_plan_(model::ExecutionPlan::build(file(), std::make_shared<cpu::MappedResidency>())),
        cpu_paged_(cpu_plan_, test::cpu_options(test::kPoolBlocks, max_batch, float_activations)) {}

  void report(const std::string& what) const override {
    std::cout << "[ gpu paged ] " << what << ": largest difference alone " << largest_difference() << " ("
              << largest_relative_difference() << " of the row's largest logit), smallest cosine to the CPU "
              << smallest_cosine_ << " (largest difference " << largest_difference_to_cpu_ << ")\n";
  }

 protected:
  void check_batch(std::span<const model::BatchSequence> batch, std::span<const model::BlockCopy> copies,
                   std::span<const float> got) override {
    const std::span<const float> cpu = cpu_paged_.forward(batch, copies);
    const auto vocab = static_cast<size_t>(config().vocab_size);
    ASSERT_EQ(got.size(), cpu.size());
    for (size_t first = 0; first < got.size(); first += vocab) {
      const double to_cpu = test::cosine(got.subspan(first, vocab), cpu.subspan(first, vocab));
      EXPECT_GE(to_cpu, float_activations() ? kCpuCosine : kCpuCosine8BitActivations) << "row " << first / vocab;
      smallest_cosine_ = std::min(smallest_cosine_, to_cpu);
    }
    for (size_t i = 0; i < got.size(); ++i)
      largest_difference_to_cpu_ = std::max(largest_difference_to_cpu_, std::abs(got[i] - cpu[i]));
  }

 private:
  model::ExecutionPlan cpu_plan_;
  cpu::Transformer cpu_paged_;
  double smallest_cosine_ = 1.0;
  float largest_difference_to_cpu_ = 0.0f;
};

class GpuPagedBatchTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (!device_available()) GTEST_SKIP() << "no GPU";
    if (!std::filesystem::exists(test::model_path(GetParam()))) GTEST_SKIP() << GetParam() << " is not here";
  }
};

TEST_P(GpuPagedBatchTest, SequencesGetTheLogitsTheyGetAlone) {
  test::expect_sequences_get_the_logits_they_get_alone<GpuPagedBatch>(GetParam());
}

TEST_P(GpuPagedBatchTest, ForkedSequenceContinuesFromACopiedBlock) {
  test::expect_forked_sequence_continues_from_a_copied_block<GpuPagedBatch>(GetParam());
}

TEST_P(GpuPagedBatchTest, ArgmaxSequencesGetTheirLargestLogit) {
  test::expect_argmax_sequences_get_their_largest_logit<GpuPagedBatch>(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Models, GpuPagedBatchTest, test::paged_models(), test::model_name);

TEST(GpuPagedErrors, NameWhatIsWrong) {
  if (!device_available()) GTEST_SKIP() << "no GPU";
  const std::string path = test::model_path("models/stories260K");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "stories260K.gguf is not here";
  const std::shared_ptr<const gguf::File> file = gguf::File::open(path);
  const model::ExecutionPlan plan = model::ExecutionPlan::build(file, make_residency());
  Transformer paged(plan, gpu_options(4, 512, false));
  Transformer single(plan, gpu_options(0, 512, false));
  EXPECT_FALSE(paged.decodes_in_chains());
  const std::vector<float> hidden(static_cast<size_t>(plan.config().n_embd));
  test::expect_error_naming(test::error_of([&] { paged.forward(hidden, 0); }), "paged");
  test::expect_paged_errors(paged, single, plan.config());

  // The layers before a split run on the CPU with a cache of their own: a paged pass needs them all here.
  const model::ExecutionPlan later_layers = model::ExecutionPlan::build(file, make_residency(1));
  test::expect_error_naming(test::error_of([&] { Transformer split(later_layers, gpu_options(4, 512, false)); }),
                            "every layer");
}

}  // namespace
}  // namespace rf::gpu
#endif
