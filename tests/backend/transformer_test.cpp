// The forward pass's own consistency: batches, cache reuse and errors.
#include "backend/cpu/transformer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/residency.h"
#include "test_paths.h"

namespace rf {
namespace {

model::ExecutionPlan plan_of(const std::string& model) {
  return model::ExecutionPlan::build(gguf::File::open(test::shared_path("models/" + model + ".gguf")),
                                     std::make_shared<cpu::MappedResidency>());
}

cpu::TransformerOptions with_context(int64_t context, int64_t max_batch = 512, TensorType kv_type = TensorType::F16) {
  cpu::TransformerOptions options;
  options.context = context;
  options.max_batch = max_batch;
  options.kv_type = kv_type;
  return options;
}

const std::vector<int32_t> kPrompt = {1, 291, 410, 300, 17, 99, 261, 378, 403, 407, 5, 42};

// Logits of every prompt position, one token at a time.
std::vector<float> token_by_token(cpu::Transformer& transformer, const std::vector<int32_t>& tokens) {
  std::vector<float> all;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::span<const float> logits = transformer.forward({&tokens[i], 1}, static_cast<int64_t>(i));
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

void expect_close(std::span<const float> a, std::span<const float> b, float tolerance) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], tolerance) << "at " << i;
}

class BatchTest : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchTest, BatchedPromptEqualsTokenByToken) {
  const model::ExecutionPlan plan = plan_of(GetParam());
  cpu::Transformer batched(plan, with_context(64));
  const std::span<const float> all = batched.forward(kPrompt, 0, cpu::Logits::All);
  const std::vector<float> batch_logits(all.begin(), all.end());
  cpu::Transformer single(plan, with_context(64));
  expect_close(batch_logits, token_by_token(single, kPrompt), 1e-4f);

  // Several passes of at most 5 tokens give the same rows as one pass.
  cpu::Transformer chunked(plan, with_context(64, 5));
  expect_close(batch_logits, chunked.forward(kPrompt, 0, cpu::Logits::All), 1e-4f);
  // Logits::Last is the last row of Logits::All.
  cpu::Transformer last(plan, with_context(64, 5));
  const auto vocab = static_cast<size_t>(plan.config().vocab_size);
  expect_close(std::span<const float>(batch_logits).last(vocab), last.forward(kPrompt, 0), 1e-4f);
}

INSTANTIATE_TEST_SUITE_P(Models, BatchTest, ::testing::Values("stories260K", "synth-tiny256-Q4_K_M"),
                         [](const ::testing::TestParamInfo<std::string>& param) {
                           std::string name = param.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(TransformerTest, TruncatedCacheContinuesLikeAFreshRun) {
  const model::ExecutionPlan plan = plan_of("stories260K");
  const std::vector<int32_t> common = {1, 403, 407, 261};
  const std::vector<int32_t> first = {378, 432, 383};
  const std::vector<int32_t> second = {286, 261, 376};

  cpu::Transformer reused(plan, with_context(32));
  std::vector<int32_t> tokens = common;
  tokens.insert(tokens.end(), first.begin(), first.end());
  reused.forward(tokens, 0);
  EXPECT_EQ(reused.cached(), 7);
  reused.truncate(4);
  const std::span<const float> continued = reused.forward(second, 4, cpu::Logits::All);
  const std::vector<float> continued_logits(continued.begin(), continued.end());
  EXPECT_EQ(reused.cached(), 7);

  // forward() at a position inside the cache truncates by itself.
  reused.forward(first, 4);
  const std::span<const float> again = reused.forward(second, 4, cpu::Logits::All);
  expect_close(continued_logits, again, 0.0f);

  cpu::Transformer fresh(plan, with_context(32));
  tokens = common;
  tokens.insert(tokens.end(), second.begin(), second.end());
  const std::span<const float> expected = fresh.forward(tokens, 0, cpu::Logits::All);
  expect_close(continued_logits, expected.last(continued_logits.size()), 1e-4f);
}

TEST(TransformerTest, F32CacheAgreesWithF16Cache) {
  const model::ExecutionPlan plan = plan_of("synth-tiny256-F32");
  cpu::Transformer f16(plan, with_context(16));
  cpu::Transformer f32(plan, with_context(16, 512, TensorType::F32));
  const std::span<const float> a = f16.forward(kPrompt, 0);
  const std::vector<float> a_logits(a.begin(), a.end());
  expect_close(a_logits, f32.forward(kPrompt, 0), 2e-3f);
}

// The first layers alone (the CPU's part where the GPU runs the last ones): their residual stream continues from
// the cache as a whole prompt's does, and the layers' count bounds what the transformer runs.
TEST(TransformerTest, FirstLayersGiveTheirResidualStream) {
  const model::ExecutionPlan plan = plan_of("stories260K");
  const int64_t width = plan.config().n_embd;
  cpu::TransformerOptions options = with_context(16);
  options.layers = 2;
  cpu::Transformer whole_prompt(plan, options);
  const std::span<const float> all = whole_prompt.forward_hidden(kPrompt, 0);
  ASSERT_EQ(all.size(), kPrompt.size() * static_cast<size_t>(width));
  const std::vector<float> last_row(all.end() - width, all.end());

  cpu::Transformer continued(plan, options);
  const auto n = static_cast<int64_t>(kPrompt.size());
  continued.forward_hidden({kPrompt.data(), kPrompt.size() - 1}, 0);
  expect_close(continued.forward_hidden({&kPrompt.back(), 1}, n - 1), last_row, 1e-4f);

  // Two layers' stream is not the whole model's.
  options.layers = 0;
  cpu::Transformer every_layer(plan, options);
  const std::span<const float> deeper = every_layer.forward_hidden(kPrompt, 0);
  float largest_difference = 0.0f;
  for (int64_t i = 0; i < width; ++i)
    largest_difference = std::max(largest_difference, std::abs(deeper[deeper.size() - width + i] - last_row[i]));
  EXPECT_GT(largest_difference, 1e-3f);

  try {
    whole_prompt.forward(kPrompt, 0);
    FAIL() << "a transformer of the first layers has no logits";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("runs 2 of the model's 5 layers"), std::string::npos) << e.what();
  }
  options.layers = 6;
  EXPECT_THROW(cpu::Transformer(plan, options), Error);
}

TEST(TransformerTest, ErrorsNameWhatIsWrong) {
  const model::ExecutionPlan plan = plan_of("stories260K");
  cpu::Transformer transformer(plan, with_context(8));
  try {
    transformer.forward(kPrompt, 0);
    FAIL() << "a prompt longer than the context must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("context of 8"), std::string::npos) << e.what();
  }
  const std::vector<int32_t> bad = {1, 512};
  try {
    transformer.forward(bad, 0);
    FAIL() << "a token past the vocabulary must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("512"), std::string::npos) << e.what();
  }
  const std::vector<int32_t> one = {1};
  EXPECT_THROW(transformer.forward(one, 3), Error);  // nothing cached yet
  EXPECT_THROW(transformer.forward({}, 0), Error);
  EXPECT_THROW(cpu::KvCache(plan.config(), 8, TensorType::Q8_0, 1), Error);
  EXPECT_THROW(cpu::KvCache(plan.config(), 8, TensorType::F16, 0), Error);
  EXPECT_THROW(transformer.truncate(1), Error);
}

}  // namespace
}  // namespace rf
