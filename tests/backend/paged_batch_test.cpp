// A paged forward pass evaluates many sequences at once, each through its own block table of a shared pool: every
// sequence gets the logits that a single-sequence transformer (contiguous cache) gives it alone, whatever its
// blocks, its starting position, the other sequences of the batch, or the passes the batch is cut into, and a
// sequence that asks for the argmax of its logits gets the index of their largest. The harness and the scenarios are
// paged_harness.h's.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/residency.h"
#include "backend/cpu/transformer.h"
#include "backend/paged_harness.h"

namespace rf {
namespace {

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

// The CPU's passes for test::PagedBatch.
struct CpuPasses {
  static std::shared_ptr<model::Residency> residency() { return std::make_shared<cpu::MappedResidency>(); }
  static std::unique_ptr<model::ForwardPass> pass(const model::ExecutionPlan& plan, int64_t kv_blocks,
                                                  int64_t max_batch, bool float_activations) {
    return std::make_unique<cpu::Transformer>(plan, test::cpu_options(kv_blocks, max_batch, float_activations));
  }
  static float tolerance(float /*largest_logit*/, bool float_activations) {
    return float_activations ? kTolerance : kTolerance8BitActivations;
  }
};

using PagedBatch = test::PagedBatch<CpuPasses>;

class PagedBatchTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PagedBatchTest, SequencesGetTheLogitsTheyGetAlone) {
  test::expect_sequences_get_the_logits_they_get_alone<PagedBatch>(GetParam());
}

TEST_P(PagedBatchTest, ForkedSequenceContinuesFromACopiedBlock) {
  test::expect_forked_sequence_continues_from_a_copied_block<PagedBatch>(GetParam());
}

TEST_P(PagedBatchTest, ArgmaxSequencesGetTheirLargestLogit) {
  test::expect_argmax_sequences_get_their_largest_logit<PagedBatch>(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Models, PagedBatchTest, test::paged_models(), test::model_name);

TEST(PagedBatchErrors, NameWhatIsWrong) {
  const model::ExecutionPlan plan = model::ExecutionPlan::build(
      gguf::File::open(test::model_path("models/stories260K")), std::make_shared<cpu::MappedResidency>());
  cpu::Transformer paged(plan, test::cpu_options(4));
  cpu::Transformer single(plan, test::cpu_options(0));
  const std::vector<int32_t> tokens = test::tokens_of(plan.config(), 20, 1);
  test::expect_error_naming(test::error_of([&] { paged.forward_hidden(tokens, 0); }), "paged");
  test::expect_paged_errors(paged, single, plan.config());
}

}  // namespace
}  // namespace rf
