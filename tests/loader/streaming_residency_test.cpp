// A plan whose residency streams ahead of use, as the GPU's does, but into host memory (HostSink), so that
// CI checks on the CPU what the GPU backend relies on: ExecutionPlan::build hands the residency the plan
// (Residency::bind), is_layer_loaded() and loading_stats() see what the loader placed before anyone asked,
// and threads racing for the same weights get one materialization and one copy each.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "loader/host_sink.h"
#include "loader/streaming_loader.h"
#include "loader/tensor_groups.h"
#include "model/execution_plan.h"
#include "test_paths.h"

namespace rf::loader {
namespace {

class StreamingHostResidency final : public model::Residency {
 public:
  void bind(const model::ExecutionPlan& plan) override {
    sink_ = std::make_unique<HostSink>(plan.file());
    loader_ = std::make_unique<StreamingLoader>(plan.file_handle(), execution_order_groups(plan), *sink_);
  }
  model::ResidentTensor materialize(const model::TensorSource& tensor) override {
    materializations_.fetch_add(1);
    loader_->request(loader_->group_of(*tensor.info));
    return {sink_->tensor(*tensor.info).data(), nullptr};
  }
  bool is_resident(const model::TensorSource& tensor) const override {
    return loader_->is_loaded(loader_->group_of(*tensor.info));
  }
  void report(model::LoadingStats& stats) const override {
    const StreamingStats loaded = loader_->stats();
    stats.bytes = loaded.bytes;
    stats.tensors = loaded.tensors;
    stats.wall_seconds = loaded.wall_seconds;
    stats.phases = {{"read", loaded.read_seconds}};
  }

  StreamingLoader& loader() { return *loader_; }
  int materializations() const { return materializations_.load(); }

 private:
  std::unique_ptr<HostSink> sink_;
  std::unique_ptr<StreamingLoader> loader_;  // destroyed before the sink it writes to
  std::atomic<int> materializations_{0};
};

TEST(StreamingResidencyTest, PlanSeesWhatTheLoaderPlacedAhead) {
  const std::shared_ptr<const gguf::File> file = gguf::File::open(test::shared_path("models/stories260K.gguf"));
  auto residency = std::make_shared<StreamingHostResidency>();
  const model::ExecutionPlan plan = model::ExecutionPlan::build(file, residency);
  residency->loader().wait_all();

  // Nothing was asked for, yet every layer is there and the stats are the loader's.
  for (int64_t l = 0; l < plan.config().n_layers; ++l) EXPECT_TRUE(plan.is_layer_loaded(l)) << "layer " << l;
  EXPECT_EQ(residency->materializations(), 0);
  const model::LoadingStats stats = plan.loading_stats();
  EXPECT_EQ(stats.bytes, file->tensor_bytes());
  EXPECT_EQ(stats.tensors, file->tensors().size());
  EXPECT_GT(stats.gb_per_second(), 0.0);
  ASSERT_EQ(stats.phases.size(), 1u);
  EXPECT_EQ(stats.phases[0].name, "read");

  // Threads racing for every weight: one materialization per weight, all seeing the same copy, equal to the
  // file's bytes.
  const model::LayerPlan& layer = plan.layer(1);
  const std::vector<const model::LazyTensor*> weights = layer.tensors();
  std::vector<std::vector<const void*>> seen(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < seen.size(); ++t)
    threads.emplace_back([&, t] {
      for (const model::LazyTensor* weight : weights) seen[t].push_back(weight->data());
    });
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(residency->materializations(), static_cast<int>(weights.size()));
  for (size_t t = 1; t < seen.size(); ++t) EXPECT_EQ(seen[t], seen[0]);
  for (size_t w = 0; w < weights.size(); ++w) {
    const std::span<const uint8_t> stored = file->tensor_data(weights[w]->info());
    EXPECT_TRUE(std::equal(stored.begin(), stored.end(), static_cast<const uint8_t*>(seen[0][w])))
        << weights[w]->name();
  }
}

}  // namespace
}  // namespace rf::loader
