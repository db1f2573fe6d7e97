#include "model/lazy_tensor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <latch>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "model/execution_plan.h"
#include "model_variant.h"

namespace rf {
namespace {

// Counts materializations and makes each one slow, so that concurrent callers overlap.
class CountingResidency final : public model::Residency {
 public:
  model::ResidentTensor materialize(const model::TensorSource& tensor) override {
    calls.fetch_add(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    if (failures_left.load() > 0) {
      failures_left.fetch_sub(1);
      fail("cannot place tensor '{}'", tensor.name());
    }
    return {tensor.bytes().data(), nullptr};
  }
  std::atomic<int> calls{0};
  std::atomic<int> failures_left{0};
  int delay_ms = 0;
};

model::ExecutionPlan plan_with(const std::shared_ptr<CountingResidency>& residency, const std::string& model) {
  return model::ExecutionPlan::build(gguf::File::open(test::shared_model(model)), residency);
}

TEST(LazyTensorTest, BuildingAPlanMaterializesNothing) {
  const auto residency = std::make_shared<CountingResidency>();
  const model::ExecutionPlan plan = plan_with(residency, "stories260K");
  EXPECT_EQ(residency->calls.load(), 0);
  EXPECT_EQ(plan.loading_stats().tensors, 0u);
  EXPECT_EQ(plan.loading_stats().bytes, 0u);
  for (int64_t i = 0; i < plan.config().n_layers; ++i) EXPECT_FALSE(plan.is_layer_loaded(i));
}

TEST(LazyTensorTest, SingleFlightUnderContention) {
  const auto residency = std::make_shared<CountingResidency>();
  residency->delay_ms = 20;
  const model::ExecutionPlan plan = plan_with(residency, "stories260K");
  const model::LazyTensor& tensor = plan.layer(3).ffn_down;

  constexpr int kThreads = 32;
  std::latch start(kThreads);
  std::vector<const void*> seen(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      seen[static_cast<size_t>(i)] = tensor.data();
    });
  for (std::thread& thread : threads) thread.join();

  EXPECT_EQ(residency->calls.load(), 1);
  EXPECT_TRUE(tensor.is_loaded());
  EXPECT_EQ(std::set<const void*>(seen.begin(), seen.end()).size(), 1u);
  EXPECT_EQ(seen[0], plan.file().tensor_data(tensor.info()).data());
  EXPECT_EQ(plan.loading_stats().tensors, 1u);
  EXPECT_EQ(plan.loading_stats().bytes, tensor.bytes());
}

TEST(LazyTensorTest, ManyThreadsPreloadingAllLoadEachTensorOnce) {
  const auto residency = std::make_shared<CountingResidency>();
  residency->delay_ms = 1;
  const model::ExecutionPlan plan = plan_with(residency, "stories260K");
  constexpr int kThreads = 8;
  std::latch start(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&] {
      start.arrive_and_wait();
      plan.preload_all();
    });
  for (std::thread& thread : threads) thread.join();
  const size_t n_tensors = plan.file().tensors().size();
  EXPECT_EQ(static_cast<size_t>(residency->calls.load()), n_tensors);
  EXPECT_EQ(plan.loading_stats().tensors, n_tensors);
  uint64_t bytes = 0;
  for (const gguf::TensorInfo& info : plan.file().tensors()) bytes += info.bytes;
  EXPECT_EQ(plan.loading_stats().bytes, bytes);
}

TEST(LazyTensorTest, PreloadLayersLoadsExactlyThoseLayers) {
  const auto residency = std::make_shared<CountingResidency>();
  const model::ExecutionPlan plan = plan_with(residency, "stories260K");
  plan.preload_layers(1, 2);
  EXPECT_FALSE(plan.is_layer_loaded(0));
  EXPECT_TRUE(plan.is_layer_loaded(1));
  EXPECT_TRUE(plan.is_layer_loaded(2));
  EXPECT_FALSE(plan.is_layer_loaded(3));
  EXPECT_EQ(residency->calls.load(), 2 * 9);
  EXPECT_FALSE(plan.token_embd().is_loaded());
  EXPECT_THROW(plan.preload_layers(4, 5), Error);
}

TEST(LazyTensorTest, TiedOutputLoadsOnce) {
  const auto residency = std::make_shared<CountingResidency>();
  const model::ExecutionPlan plan = plan_with(residency, "TinyStories-656K-Q8_0");
  plan.output().data();
  EXPECT_TRUE(plan.token_embd().is_loaded());
  plan.token_embd().data();
  EXPECT_EQ(residency->calls.load(), 1);
}

TEST(LazyTensorTest, AFailedMaterializationIsRetried) {
  const auto residency = std::make_shared<CountingResidency>();
  residency->failures_left = 1;
  const model::ExecutionPlan plan = plan_with(residency, "stories260K");
  EXPECT_THROW(plan.output_norm().data(), Error);
  EXPECT_FALSE(plan.output_norm().is_loaded());
  EXPECT_NE(plan.output_norm().data(), nullptr);
  EXPECT_TRUE(plan.output_norm().is_loaded());
  EXPECT_EQ(residency->calls.load(), 2);
  EXPECT_EQ(plan.loading_stats().tensors, 1u);
}

}  // namespace
}  // namespace rf
