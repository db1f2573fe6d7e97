#include "loader/streaming_loader.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <future>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "error_of.h"
#include "loader/recording_sink.h"
#include "loader/tensor_groups.h"
#include "model/execution_plan.h"
#include "test_paths.h"
#include "util/error.h"

namespace rf::loader {
namespace {

using test::error_of;
using test::RecordingSink;

std::string model_path(const std::string& name) { return test::shared_path("models/" + name + ".gguf"); }

// Plans are built only to list the weights; nothing here materializes a LazyTensor.
class UnusedResidency final : public model::Residency {
 public:
  model::ResidentTensor materialize(const model::TensorSource& tensor) override {
    fail("tensor '{}' materialized in a loader test", tensor.name());
  }
};

std::vector<TensorGroup> groups_of(const std::shared_ptr<const gguf::File>& file) {
  return execution_order_groups(model::ExecutionPlan::build(file, std::make_shared<UnusedResidency>()));
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A copy of a shared model in the test's temporary directory, deleted with the object.
class TempCopy {
 public:
  explicit TempCopy(const std::string& model)
      : path_(::testing::TempDir() + "rf_loader_" + std::to_string(::getpid()) + "_" + model + ".gguf") {
    std::filesystem::copy_file(model_path(model), path_, std::filesystem::copy_options::overwrite_existing);
    std::filesystem::permissions(path_, std::filesystem::perms::owner_write, std::filesystem::perm_options::add);
  }
  ~TempCopy() { std::filesystem::remove(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::vector<std::string> shared_models() {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(test::shared_path("models")))
    if (entry.path().extension() == ".gguf") names.push_back(entry.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(StreamingLoaderTest, EverySharedModelArrivesIntactAndOnce) {
  const std::vector<std::string> models = shared_models();
  ASSERT_GE(models.size(), 4u);
  struct Setting {
    size_t readers;
    uint64_t chunk_bytes;
  };
  for (const std::string& model : models) {
    const std::shared_ptr<const gguf::File> file = gguf::File::open(model_path(model));
    const std::vector<TensorGroup> groups = groups_of(file);
    const std::vector<const gguf::TensorInfo*> tensors = test::tensors_of(groups);
    EXPECT_EQ(tensors.size(), file->tensors().size()) << model << ": the plan uses every tensor";
    const uint64_t total_bytes = std::accumulate(tensors.begin(), tensors.end(), uint64_t{0},
                                                 [](uint64_t sum, const gguf::TensorInfo* t) { return sum + t->bytes; });
    for (const Setting setting : {Setting{1, 1000}, Setting{2, 4096}, Setting{4, 64 << 10}, Setting{0, 0}}) {
      SCOPED_TRACE(model + ", " + std::to_string(setting.readers) + " readers, chunk " +
                   std::to_string(setting.chunk_bytes));
      RecordingSink sink(*file);
      StreamingOptions options;
      options.reader_threads = setting.readers;
      if (setting.chunk_bytes) options.chunk_bytes = setting.chunk_bytes;
      StreamingLoader loader(file, groups, sink, options);
      loader.wait_all();
      test::expect_consumed_once_and_intact(*file, sink, tensors);

      // Nobody asked for anything out of order, so groups finish in execution order.
      std::vector<size_t> in_order(groups.size());
      std::iota(in_order.begin(), in_order.end(), size_t{0});
      EXPECT_EQ(sink.done_order(), in_order);
      for (size_t g = 0; g < groups.size(); ++g) EXPECT_TRUE(loader.is_loaded(g));

      const StreamingStats stats = loader.stats();
      EXPECT_EQ(stats.bytes, total_bytes);
      EXPECT_EQ(stats.tensors, tensors.size());
      EXPECT_GE(stats.chunks, sink.allocations());
      EXPECT_GE(sink.allocations(), 1u);
      EXPECT_TRUE(sink.allocated_in_order());
      EXPECT_EQ(stats.groups, groups.size());
      EXPECT_GT(stats.wall_seconds, 0.0);
      EXPECT_GE(stats.wall_seconds, stats.first_group_seconds);
      EXPECT_GT(stats.gb_per_second(), 0.0);

      // The staging memory is back before wait_all() returns; the consumer is one thread, and prepare()
      // ran on readers only.
      EXPECT_EQ(sink.live_buffers(), 0u);
      EXPECT_EQ(sink.consume_threads().size(), 1u);
      for (std::thread::id reader : sink.prepare_threads()) EXPECT_FALSE(sink.consume_threads().contains(reader));
    }
  }
}

TEST(StreamingLoaderTest, ExecutionOrderGroupsFollowThePlan) {
  const std::shared_ptr<const gguf::File> file = gguf::File::open(model_path("stories260K"));
  const std::vector<TensorGroup> groups = groups_of(file);
  ASSERT_EQ(groups.size(), 5u + 2);
  EXPECT_EQ(groups[0].name, "embeddings");
  EXPECT_EQ(groups[0].tensors, std::vector<const gguf::TensorInfo*>{&file->tensor("token_embd.weight")});
  EXPECT_EQ(groups[layer_group(2)].name, "layer 2");
  ASSERT_EQ(groups[layer_group(2)].tensors.size(), 9u);
  EXPECT_EQ(groups[layer_group(2)].tensors.front(), &file->tensor("blk.2.attn_norm.weight"));
  EXPECT_EQ(groups[layer_group(2)].tensors.back(), &file->tensor("blk.2.ffn_down.weight"));
  EXPECT_EQ(groups.back().name, "output");
  EXPECT_EQ(groups.back().tensors, (std::vector<const gguf::TensorInfo*>{&file->tensor("output_norm.weight"),
                                                                         &file->tensor("output.weight")}));
}

TEST(StreamingLoaderTest, TiedEmbeddingsLoadOnceWithTheFirstGroup) {
  const std::shared_ptr<const gguf::File> file = gguf::File::open(model_path("TinyStories-656K-Q8_0"));
  const std::vector<TensorGroup> groups = groups_of(file);
  const gguf::TensorInfo& embeddings = file->tensor("token_embd.weight");
  ASSERT_EQ(groups.back().tensors.back(), &embeddings);
  RecordingSink sink(*file);
  StreamingOptions options;
  options.stream_all = false;
  options.chunk_bytes = 4096;
  StreamingLoader loader(file, groups, sink, options);
  EXPECT_EQ(loader.group_of(embeddings), 0u);

  // Asking for the output alone loads the embeddings it shares, and the embeddings group with them.
  loader.request(groups.size() - 1);
  EXPECT_TRUE(loader.is_loaded(0));
  EXPECT_FALSE(loader.is_loaded(layer_group(0)));
  EXPECT_EQ(sink.done_order(), (std::vector<size_t>{0, groups.size() - 1}));
  test::expect_consumed_once_and_intact(*file, sink, {&embeddings, &file->tensor("output_norm.weight")});
  loader.request(0);
  loader.request(layer_group(1));
  loader.request(layer_group(0));
  test::expect_consumed_once_and_intact(*file, sink, test::tensors_of(groups));
}

// A device that runs the last layers only (the first on the CPU) loads those, the output and the rope factors; the
// layers before keep their groups' places, empty, and tied embeddings come with the output.
TEST(StreamingLoaderTest, GroupsFromALayerOnHoldOnlyWhatItRuns) {
  const std::shared_ptr<const gguf::File> file = gguf::File::open(model_path("TinyStories-656K-Q8_0"));
  const model::ExecutionPlan plan = model::ExecutionPlan::build(file, std::make_shared<UnusedResidency>());
  const int64_t layers = plan.config().n_layers;
  ASSERT_GE(layers, 2);
  const std::vector<TensorGroup> groups = execution_order_groups(plan, layers - 1);
  ASSERT_EQ(groups.size(), static_cast<size_t>(layers) + 2);
  EXPECT_TRUE(groups[0].tensors.empty());  // no rope factors in this file
  for (int64_t l = 0; l + 1 < layers; ++l) EXPECT_TRUE(groups[layer_group(l)].tensors.empty()) << "layer " << l;
  EXPECT_EQ(groups[layer_group(layers - 1)].tensors.size(), plan.layer(layers - 1).tensors().size());
  const gguf::TensorInfo& embeddings = file->tensor("token_embd.weight");
  ASSERT_EQ(groups.back().tensors.back(), &embeddings);

  RecordingSink sink(*file);
  StreamingLoader loader(file, groups, sink);
  loader.wait_all();
  EXPECT_EQ(loader.group_of(embeddings), groups.size() - 1);
  std::vector<const gguf::TensorInfo*> held = groups[layer_group(layers - 1)].tensors;
  held.insert(held.end(), groups.back().tensors.begin(), groups.back().tensors.end());
  test::expect_consumed_once_and_intact(*file, sink, held);

  EXPECT_NE(error_of([&] { execution_order_groups(plan, layers + 1); }).find("within 0.."), std::string::npos);
}

TEST(StreamingLoaderTest, OnDemandLoadsOnlyWhatIsRequested) {
  const std::shared_ptr<const gguf::File> file = gguf::File::open(model_path("stories260K"));
  const std::vector<TensorGroup> groups = groups_of(file);
  RecordingSink sink(*file);
  StreamingOptions options;
  options.stream_all = false;
  options.chunk_bytes = 4096;
  StreamingLoader loader(file, groups, sink, options);

  loader.request(layer_group(3));
  loader.request(layer_group(1));
  EXPECT_EQ(sink.done_order(), (std::vector<size_t>{layer_group(3), layer_group(1)}));
  for (size_t g = 0; g < groups.size(); ++g)
    EXPECT_EQ(loader.is_loaded(g), g == layer_group(3) || g == layer_group(1)) << g;
  for (const test::ConsumedPiece& piece : sink.pieces())
    EXPECT_TRUE(piece.group == layer_group(3) || piece.group == layer_group(1)) << piece.tensor->name;
  std::vector<const gguf::TensorInfo*> requested = groups[layer_group(3)].tensors;
  requested.insert(requested.end(), groups[layer_group(1)].tensors.begin(), groups[layer_group(1)].tensors.end());
  test::expect_consumed_once_and_intact(*file, sink, requested);
}

TEST(StreamingLoaderTest, PrioritizedGroupJumpsTheQueue) {
  const std::shared_ptr<const gguf::File> file = gguf::File::open(model_path("stories260K"));
  const std::vector<TensorGroup> groups = groups_of(file);
  RecordingSink sink(*file);
  sink.consume_gate.close();
  StreamingOptions options;
  options.reader_threads = 1;
  options.staging_buffers = 2;
  options.chunk_bytes = 4096;  // the 128 KiB embeddings take 32 chunks
  StreamingLoader loader(file, groups, sink, options);

  // The consumer holds the first chunk, so at most two chunks of the embeddings are taken before this.
  const size_t output = groups.size() - 1;
  loader.prioritize(output);
  loader.prioritize(layer_group(2));  // the latest request goes first
  sink.consume_gate.open();
  loader.wait_all();
  std::vector<size_t> expected = {layer_group(2), output, 0};
  for (int64_t layer = 0; layer < 5; ++layer)
    if (layer != 2) expected.push_back(layer_group(layer));
  EXPECT_EQ(sink.done_order(), expected);
  test::expect_consumed_once_and_intact(*file, sink, test::tensors_of(groups));
}

class ConcurrentRequestTest : public ::testing::TestWithParam<bool> {};

TEST_P(ConcurrentRequestTest, ManyThreadsRequestingLoadEachTensorOnce) {
  const std::shared_ptr<const gguf::File> file = gguf::File::open(model_path("synth-tiny256-Q8_0"));
  const std::vector<TensorGroup> groups = groups_of(file);
  RecordingSink sink(*file);
  StreamingOptions options;
  options.stream_all = GetParam();
  options.chunk_bytes = 16 << 10;
  StreamingLoader loader(file, groups, sink, options);

  std::vector<std::thread> threads;
  for (unsigned seed = 0; seed < 16; ++seed) {
    threads.emplace_back([&, seed] {
      std::vector<size_t> order(groups.size());
      std::iota(order.begin(), order.end(), size_t{0});
      std::shuffle(order.begin(), order.end(), std::mt19937(seed));
      for (size_t g : order) {
        loader.request(g);
        // Once request() returns, the group's bytes are final.
        for (const gguf::TensorInfo* tensor : groups[g].tensors)
          EXPECT_TRUE(std::equal(sink.tensor(*tensor).begin(), sink.tensor(*tensor).end(),
                                 file->tensor_data(*tensor).begin()))
              << tensor->name;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  test::expect_consumed_once_and_intact(*file, sink, test::tensors_of(groups));
  std::vector<size_t> done = sink.done_order();
  std::sort(done.begin(), done.end());
  std::vector<size_t> each_once(groups.size());
  std::iota(each_once.begin(), each_once.end(), size_t{0});
  EXPECT_EQ(done, each_once);
}

INSTANTIATE_TEST_SUITE_P(StreamAllOrOnDemand, ConcurrentRequestTest, ::testing::Bool());

TEST(StreamingLoaderTest, TruncatedFileFailsWaitersNamingFileAndTensor) {
  const TempCopy copy("synth-tiny256-F32");
  const std::shared_ptr<const gguf::File> file = gguf::File::open(copy.path());
  const std::vector<TensorGroup> groups = groups_of(file);
  // The file shrinks after opening: the header is valid, the last layers and the output are gone.
  std::filesystem::resize_file(copy.path(), file->file_size() / 2);
  RecordingSink sink(*file);
  StreamingOptions options;
  options.stream_all = false;
  StreamingLoader loader(file, groups, sink, options);

  loader.request(0);  // the embeddings lie in the first half
  test::expect_consumed_once_and_intact(*file, sink, groups[0].tensors);
  const std::string message = error_of([&] { loader.request(groups.size() - 1); });
  EXPECT_TRUE(contains(message, copy.path())) << message;
  EXPECT_TRUE(contains(message, "short read of tensor 'output")) << message;
  // Every later waiter gets the same error instead of hanging.
  EXPECT_EQ(error_of([&] { loader.request(layer_group(3)); }), message);
  EXPECT_EQ(error_of([&] { loader.wait_all(); }), message);
  EXPECT_TRUE(loader.is_loaded(0));
}

TEST(StreamingLoaderTest, TruncatedFileFailsABackgroundLoad) {
  const TempCopy copy("synth-tiny256-F32");
  const std::shared_ptr<const gguf::File> file = gguf::File::open(copy.path());
  std::filesystem::resize_file(copy.path(), file->file_size() / 3);
  RecordingSink sink(*file);
  StreamingLoader loader(file, groups_of(file), sink);
  const std::string message = error_of([&] { loader.wait_all(); });
  EXPECT_TRUE(contains(message, copy.path())) << message;
  EXPECT_TRUE(contains(message, "short read of tensor '")) << message;
}

TEST(StreamingLoaderTest, SinkFailureReachesWaiters) {
  const std::shared_ptr<const gguf::File> file = gguf::File::open(model_path("stories260K"));
  const std::vector<TensorGroup> groups = groups_of(file);
  RecordingSink sink(*file);
  sink.fail_on_tensor = "blk.1.ffn_up.weight";
  StreamingOptions options;
  options.chunk_bytes = 4096;
  StreamingLoader loader(file, groups, sink, options);
  const std::string message = error_of([&] { loader.wait(layer_group(4)); });
  EXPECT_TRUE(contains(message, "stories260K.gguf")) << message;
  EXPECT_TRUE(contains(message, "blk.1.ffn_up.weight")) << message;
  EXPECT_TRUE(contains(message, "injected failure")) << message;
  loader.wait(layer_group(0));  // done before the failure
  EXPECT_FALSE(loader.is_loaded(layer_group(1)));
}

TEST(StreamingLoaderTest, DestructionMidLoadStopsAndReleases) {
  const std::shared_ptr<const gguf::File> file = gguf::File::open(model_path("synth-tiny256-Q8_0"));
  const std::vector<TensorGroup> groups = groups_of(file);
  RecordingSink sink(*file);
  sink.consume_delay = std::chrono::milliseconds(1);
  {
    StreamingOptions options;
    options.chunk_bytes = 4096;  // about 900 chunks, a millisecond each
    StreamingLoader loader(file, groups, sink, options);
    loader.wait(0);
  }
  EXPECT_LT(sink.done_order().size(), groups.size());
  EXPECT_EQ(sink.live_buffers(), 0u);
  EXPECT_GT(sink.allocations(), 0u);
}

TEST(StreamingLoaderTest, ImmediateDestructionNeverHangs) {
  const std::shared_ptr<const gguf::File> file = gguf::File::open(model_path("synth-tiny256-Q4_0"));
  const std::vector<TensorGroup> groups = groups_of(file);
  for (int i = 0; i < 50; ++i) {
    RecordingSink sink(*file);
    StreamingOptions options;
    options.chunk_bytes = 8192;
    options.stream_all = i % 2 == 0;
    StreamingLoader loader(file, groups, sink, options);
  }
}

TEST(StreamingLoaderTest, CancelWakesWaitersWithAnError) {
  const std::shared_ptr<const gguf::File> file = gguf::File::open(model_path("stories260K"));
  const std::vector<TensorGroup> groups = groups_of(file);
  RecordingSink sink(*file);
  StreamingOptions options;
  options.stream_all = false;
  StreamingLoader loader(file, groups, sink, options);
  loader.request(1);
  // Nobody requests layer 3, so its waiter would wait forever.
  auto waiter = std::async(std::launch::async, [&] { return error_of([&] { loader.wait(layer_group(3)); }); });
  loader.cancel();
  const std::string message = waiter.get();
  EXPECT_TRUE(contains(message, "cancelled before group 'layer 3'")) << message;
  EXPECT_TRUE(loader.is_loaded(1));
  loader.wait(1);  // loaded before the cancel: still fine
  EXPECT_EQ(sink.live_buffers(), 0u);
}

TEST(StreamingLoaderTest, StagingBuffersAreAllocatedAsReadingNeedsThem) {
  const std::shared_ptr<const gguf::File> file = gguf::File::open(model_path("stories260K"));
  {
    RecordingSink sink(*file);
    StreamingLoader loader(file, {{"norm", {&file->tensor("output_norm.weight")}}}, sink);
    loader.wait_all();
    EXPECT_EQ(sink.allocations(), 1u);  // one chunk, one buffer
  }
  RecordingSink sink(*file);
  sink.consume_gate.close();
  StreamingOptions options;
  options.reader_threads = 4;
  options.staging_buffers = 3;
  options.chunk_bytes = 4096;
  StreamingLoader loader(file, groups_of(file), sink, options);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // readers fill what buffers they may
  EXPECT_LE(sink.allocations(), 3u);
  sink.consume_gate.open();
  loader.wait_all();
  EXPECT_EQ(sink.allocations(), 3u);
  EXPECT_TRUE(sink.allocated_in_order());
}

TEST(StreamingLoaderTest, EmptyGroupsAreLoadedAtOnce) {
  const std::shared_ptr<const gguf::File> file = gguf::File::open(model_path("stories260K"));
  RecordingSink sink(*file);
  StreamingLoader loader(file, {{"nothing", {}}, {"norm", {&file->tensor("output_norm.weight")}}, {"again", {}}},
                         sink);
  loader.wait_all();
  EXPECT_EQ(sink.done_order(), (std::vector<size_t>{0, 2, 1}));
}

TEST(StreamingLoaderTest, RejectsWhatItCannotLoad) {
  const std::shared_ptr<const gguf::File> file = gguf::File::open(model_path("stories260K"));
  const std::shared_ptr<const gguf::File> other = gguf::File::open(model_path("stories260K"));
  RecordingSink sink(*file);
  const auto construct = [&](std::shared_ptr<const gguf::File> source, std::vector<TensorGroup> groups,
                              StreamingOptions options) {
    return error_of([&] { StreamingLoader loader(std::move(source), std::move(groups), sink, options); });
  };
  EXPECT_TRUE(contains(construct(file, {{"g", {&other->tensor("output.weight")}}}, {}),
                       "group 'g' lists a tensor that is not one of the file's"));

  std::ifstream in(model_path("stories260K"), std::ios::binary);
  const std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  EXPECT_TRUE(contains(construct(gguf::File::parse(bytes, "in-memory.gguf"), {}, {}), "needs a file opened from disk"));

  StreamingOptions tiny;
  tiny.chunk_bytes = 2;
  EXPECT_TRUE(contains(construct(file, groups_of(file), tiny), "cannot hold one"));

  StreamingLoader loader(file, groups_of(file), sink);
  EXPECT_TRUE(contains(error_of([&] { loader.request(99); }), "group 99 out of range"));
  EXPECT_TRUE(contains(error_of([&] { loader.group_of(other->tensor("output.weight")); }), "no group"));
}

}  // namespace
}  // namespace rf::loader
