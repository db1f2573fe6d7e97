// The GPU forward pass end to end: for every reference pair in ../shared/reference, the GPU's logits over the
// prompt and the greedy continuation have cosine >= 0.9999 to the CPU backend's (0.9995 with 8-bit
// activations, see below) and >= 0.999 to llama.cpp's (../shared/arch/reference: see the test),
// row by row, both when all tokens run as one batch (prompt path: GEMMs and flash attention) and when the
// continuation runs token by token (decode path: matrix-vector products, split-K attention, graph replay).
// On the trained models the GPU's own greedy continuation is the reference's, token for token. All of this holds
// as well with the first half of the layers on the CPU and the rest on the GPU (the engine's --gpu-layers).
// Sliding-window layers that keep rings of their window and one pass give the logits of the full layout.
// Loading: weights stream to the device behind the Transformer's constructor, each exactly once, byte for byte
// in the device layout; a model that does not fit is refused before anything is uploaded, and one whose long
// passes' activations do not fit takes shorter passes; destroying the model gives the device memory back.
#include <gtest/gtest.h>

#if ROCMFORGE_HAVE_GPU
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/residency.h"
#include "backend/cpu/transformer.h"
#include "backend/gpu/residency.h"
#include "backend/gpu/runtime.h"
#include "backend/gpu/streaming_upload.h"
#include "backend/gpu/transformer.h"
#include "backend/gpu/weight_layout.h"
#include "error_of.h"
#include "reference.h"
#include "test_paths.h"
#include "util/argmax.h"

namespace rf::gpu {
namespace {

using test::cosine;
using test::read_reference;
using test::Reference;
using test::reference_files;

using Rows = std::vector<std::vector<float>>;

void append_rows(Rows& rows, std::span<const float> logits, int64_t vocab) {
  for (size_t i = 0; i < logits.size(); i += static_cast<size_t>(vocab))
    rows.emplace_back(logits.begin() + static_cast<ptrdiff_t>(i), logits.begin() + static_cast<ptrdiff_t>(i + vocab));
}

// Worst cosine over the rows and where it is.
struct Agreement {
  double min_cosine = 1.0;
  int64_t worst_row = 0;
};

Agreement compare(const Rows& got, const std::function<std::span<const float>(int64_t)>& expected) {
  Agreement a;
  for (size_t i = 0; i < got.size(); ++i) {
    const double c = cosine(got[i], expected(static_cast<int64_t>(i)));
    if (c < a.min_cosine) a = {c, static_cast<int64_t>(i)};
  }
  return a;
}

// The GPU's forward pass over every layer, or from first_layer on with the CPU running the layers before it
// and handing over the residual stream, as the engine does for --gpu-layers.
class GpuPass {
 public:
  GpuPass(const std::shared_ptr<const gguf::File>& file, int64_t first_layer, int64_t context,
          TransformerOptions::Chains chains, bool float_activations)
      : plan_(model::ExecutionPlan::build(file, make_residency(first_layer))),
        transformer_(plan_, {.context = context, .chains = chains, .float_activations = float_activations}) {
    if (first_layer == 0) return;
    cpu_plan_.emplace(model::ExecutionPlan::build(file, std::make_shared<cpu::MappedResidency>()));
    cpu::TransformerOptions options;
    options.context = context;
    options.layers = first_layer;
    options.float_activations = float_activations;
    front_.emplace(*cpu_plan_, options);
  }
  std::span<const float> forward(std::span<const int32_t> tokens, int64_t position, Logits which = Logits::Last) {
    if (!front_) return transformer_.forward(tokens, position, which);
    return transformer_.forward(front_->forward_hidden(tokens, position), position, which);
  }
  bool decodes_in_chains() const { return transformer_.decodes_in_chains(); }

 private:
  model::ExecutionPlan plan_;
  Transformer transformer_;
  std::optional<model::ExecutionPlan> cpu_plan_;
  std::optional<cpu::Transformer> front_;
};

class GpuReferenceTest : public ::testing::TestWithParam<std::string> {};

// The GPU's logits against the CPU's (>= cpu_bound) and the reference's (>= ref_bound), both backends with float
// or 8-bit activations, as the header describes.
void check_against_cpu_and_reference(const Reference& ref, bool float_activations, double cpu_bound,
                                     double ref_bound) {
  const std::shared_ptr<const gguf::File> file = gguf::File::open(ref.model_path);
  const auto n_prompt = static_cast<int64_t>(ref.prompt_tokens.size());
  const auto n_greedy = static_cast<int64_t>(ref.greedy_tokens.size());
  ASSERT_EQ(ref.rows, n_prompt + n_greedy);
  // Every token the reference evaluated: the prompt, then the continuation but its last token.
  std::vector<int32_t> tokens = ref.prompt_tokens;
  tokens.insert(tokens.end(), ref.greedy_tokens.begin(), ref.greedy_tokens.end() - 1);

  const model::ExecutionPlan cpu_plan = model::ExecutionPlan::build(file, std::make_shared<cpu::MappedResidency>());
  cpu::TransformerOptions cpu_options;
  cpu_options.context = ref.rows;
  cpu_options.float_activations = float_activations;
  cpu::Transformer cpu_transformer(cpu_plan, cpu_options);
  Rows cpu_rows;
  append_rows(cpu_rows, cpu_transformer.forward(tokens, 0, cpu::Logits::All), ref.n_vocab);

  // The reference repeats the last prompt row as the row that chose the first generated token.
  const auto repeat_last_prompt_row = [&](Rows& rows) {
    ASSERT_EQ(static_cast<int64_t>(rows.size()), ref.rows - 1);
    rows.insert(rows.begin() + n_prompt, rows[static_cast<size_t>(n_prompt - 1)]);
  };
  repeat_last_prompt_row(cpu_rows);
  const auto cpu_row = [&](int64_t i) { return std::span<const float>(cpu_rows[static_cast<size_t>(i)]); };
  const auto ref_row = [&](int64_t i) { return ref.row(i); };

  const int64_t layers = cpu_plan.config().n_layers;
  // Every layer on the GPU, decoding with a launch a product and (16-bit float weights on a Hopper device) in
  // chains; the first half of the layers on the CPU.
  using Chains = TransformerOptions::Chains;
  const std::pair<int64_t, Chains> passes[] = {
      {0, Chains::Never}, {0, Chains::Always}, {std::max<int64_t>(1, layers / 2), Chains::Always}};
  for (const auto& [first_layer, chains] : passes) {
    SCOPED_TRACE(first_layer == 0 ? "every layer on the GPU" : "the first layers on the CPU");
    GpuPass gpu(file, first_layer, ref.rows, chains, float_activations);
    if (chains == Chains::Always && !gpu.decodes_in_chains() && first_layer == 0) continue;  // the pass before
    // All tokens in one batch.
    Rows batch_rows;
    append_rows(batch_rows, gpu.forward(tokens, 0, Logits::All), ref.n_vocab);
    // The prompt in one batch, then the continuation token by token (the decode graph).
    Rows step_rows;
    append_rows(step_rows, gpu.forward(ref.prompt_tokens, 0, Logits::All), ref.n_vocab);
    for (int64_t i = n_prompt; i < static_cast<int64_t>(tokens.size()); ++i)
      append_rows(step_rows, gpu.forward({&tokens[static_cast<size_t>(i)], 1}, i), ref.n_vocab);
    repeat_last_prompt_row(batch_rows);
    repeat_last_prompt_row(step_rows);

    const Agreement batch_cpu = compare(batch_rows, cpu_row);
    const Agreement batch_ref = compare(batch_rows, ref_row);
    const Agreement step_cpu = compare(step_rows, cpu_row);
    const Agreement step_ref = compare(step_rows, ref_row);
    std::cout << "[ gpu reference ] " << ref.model_path << (float_activations ? " (float activations)" : "") << " ("
              << ref.rows << " rows, the GPU from layer " << first_layer << " of " << layers << (gpu.decodes_in_chains() ? ", decoding in chains" : "") << "): batch vs CPU "
              << batch_cpu.min_cosine << ", vs llama.cpp " << batch_ref.min_cosine << "; token by token vs CPU "
              << step_cpu.min_cosine << ", vs llama.cpp " << step_ref.min_cosine << "\n";
    EXPECT_GE(batch_cpu.min_cosine, cpu_bound) << "worst row " << batch_cpu.worst_row;
    EXPECT_GE(batch_ref.min_cosine, ref_bound) << "worst row " << batch_ref.worst_row;
    EXPECT_GE(step_cpu.min_cosine, cpu_bound) << "worst row " << step_cpu.worst_row;
    EXPECT_GE(step_ref.min_cosine, ref_bound) << "worst row " << step_ref.worst_row;

    // Trained models have sharp distributions: the GPU's own greedy continuation is the reference's.
    if (ref.model == "stories260K.gguf" || ref.model == "TinyStories-656K-Q8_0.gguf") {
      std::vector<int32_t> generated;
      std::span<const float> logits = gpu.forward(ref.prompt_tokens, 0);
      for (int64_t i = 0; i < n_greedy; ++i) {
        generated.push_back(index_of_largest(logits));
        if (i + 1 < n_greedy) logits = gpu.forward({&generated.back(), 1}, n_prompt + i);
      }
      EXPECT_EQ(generated, ref.greedy_tokens);
    }
  }
}

TEST_P(GpuReferenceTest, LogitsMatchCpuAndLlamaCpp) {
  if (!device_available()) GTEST_SKIP() << "no GPU";
  const Reference ref = read_reference(GetParam());
  if (!std::filesystem::exists(ref.model_path)) GTEST_SKIP() << ref.model << " is not here";
  // Where products quantize activations to 8 bits (any quantized weight), results are chaotic below 1e-4:
  // a last-bit difference before a quantization step moves a level, and the levels' errors grow through the
  // layers. The CPU backend against itself with an F32 instead of an F16 KV cache measures that floor:
  // min cosine 0.99978 on synth-tiny256-Q4_K_M, 0.99986 on Q4_0, 0.99990 on Q8_0 (F16: 1.0). The GPU
  // cannot agree with the CPU more closely than that without bit-identical arithmetic.
  bool eight_bit_activations = false;
  const std::shared_ptr<const gguf::File> file = gguf::File::open(ref.model_path);
  for (const gguf::TensorInfo& tensor : file->tensors())
    eight_bit_activations |= tensor.type_info->block_elements > 1;
  if (!GetParam().starts_with("arch/")) {
    check_against_cpu_and_reference(ref, false, eight_bit_activations ? 0.9995 : 0.9999, 0.999);
    return;
  }
  // As in reference_test.cpp: these references were computed on the dequantized weights in F32, and these models'
  // sharp attention magnifies the rounding of 8-bit activations, so the architecture is proven with float
  // activations, and the file's 8-bit path is held to looser bounds.
  check_against_cpu_and_reference(ref, true, 0.9999, 0.9999);
  check_against_cpu_and_reference(ref, false, 0.995, 0.995);
}

std::string test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param.substr(0, info.param.size() - std::string(".json").size());
  std::replace_if(name.begin(), name.end(), [](char c) { return !std::isalnum(static_cast<unsigned char>(c)); }, '_');
  return name;
}

INSTANTIATE_TEST_SUITE_P(Shared, GpuReferenceTest, ::testing::ValuesIn(reference_files()), test_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(GpuReferenceTest);

TEST(GpuTransformer, RejectsWhatTheKernelsCannotRun) {
  if (!device_available()) GTEST_SKIP() << "no GPU";
  const std::string path = test::shared_path("models/stories260K.gguf");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "stories260K.gguf is not here";
  const model::ExecutionPlan plan = model::ExecutionPlan::build(gguf::File::open(path), make_residency());
  Transformer transformer(plan, {.context = 16});
  const int32_t too_large = static_cast<int32_t>(plan.config().vocab_size);
  EXPECT_THROW(transformer.forward({&too_large, 1}, 0), Error);
  const std::vector<int32_t> many(17, 1);
  EXPECT_THROW(transformer.forward(many, 0), Error);
  EXPECT_THROW(transformer.forward({&many[0], 1}, 1), Error);  // nothing cached yet
}

// A transformer with its own plan (a plan's residency serves one transformer).
struct OwnPlan {
  OwnPlan(const std::shared_ptr<const gguf::File>& file, const TransformerOptions& options)
      : plan(model::ExecutionPlan::build(file, make_residency())), transformer(plan, options) {}
  model::ExecutionPlan plan;
  Transformer transformer;
};

// The logits of `tokens` at positions position, position + 1, ..., fed in passes of `pass` tokens, row after row
// (Logits::Last of single tokens, as decoding runs them, where `pass` is 0).
Rows in_passes(Transformer& transformer, std::span<const int32_t> tokens, int64_t position, size_t pass) {
  Rows rows;
  const int64_t vocab = transformer.config().vocab_size;
  const size_t step = std::max<size_t>(pass, 1);
  for (size_t start = 0; start < tokens.size(); start += step) {
    const std::span<const int32_t> part = tokens.subspan(start, std::min(step, tokens.size() - start));
    const Logits which = pass > 0 ? Logits::All : Logits::Last;
    append_rows(rows, transformer.forward(part, position + static_cast<int64_t>(start), which), vocab);
  }
  return rows;
}

// Rows that come from the same kernels on the same inputs: equal but for the order of floating-point sums.
void expect_same_rows(const Rows& got, const Rows& expected) {
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i)
    for (size_t j = 0; j < got[i].size(); ++j)
      ASSERT_NEAR(got[i][j], expected[i][j], 1e-5f) << "row " << i << ", logit " << j;
}

// Sliding-window layers keep rings of their window and one pass (model::kv_cache_rows), which rope_and_store writes
// and attention_prompt reads: passes of 1, 2, 3 and 5 tokens wrap rings of 16 rows (a window of 8 and one pass, in
// whole blocks) twice over the reference's tokens, and give the logits of the full layout (passes of up to 64 tokens
// leave a row for each position) fed the same passes, also token by token through the decode graph; truncation keeps
// a prefix only while the rings hold the keys that the next query sees.
TEST(GpuSlidingWindow, RingGivesTheLogitsOfTheFullLayout) {
  if (!device_available()) GTEST_SKIP() << "no GPU";
  for (const std::string name : {"synth-gemma2-Q4_K_M", "synth-gemma3-Q4_K_M"}) {
    SCOPED_TRACE(name);
    const Reference ref = read_reference("arch/reference/" + name + ".p2.json");
    if (!std::filesystem::exists(ref.model_path)) continue;
    const std::shared_ptr<const gguf::File> file = gguf::File::open(ref.model_path);
    std::vector<int32_t> tokens = ref.prompt_tokens;
    tokens.insert(tokens.end(), ref.greedy_tokens.begin(), ref.greedy_tokens.end());
    const auto n = static_cast<int64_t>(tokens.size());
    for (const int64_t max_batch : {1, 2, 3, 5}) {
      SCOPED_TRACE("passes of " + std::to_string(max_batch));
      OwnPlan full(file, {.context = n, .max_batch = 64});
      OwnPlan ring(file, {.context = n, .max_batch = max_batch});
      expect_same_rows(in_passes(ring.transformer, tokens, 0, static_cast<size_t>(n)),
                       in_passes(full.transformer, tokens, 0, static_cast<size_t>(max_batch)));
    }
    OwnPlan full(file, {.context = n, .max_batch = 64});
    OwnPlan ring(file, {.context = n, .max_batch = 2});
    expect_same_rows(in_passes(ring.transformer, tokens, 0, 0), in_passes(full.transformer, tokens, 0, 0));

    // Rings of 16 rows hold positions 20..35: a query at 34 sees 27..34, one at 26 sees 19..26.
    ring.transformer.truncate(34);
    EXPECT_EQ(ring.transformer.cached(), 34);
    const std::vector<int32_t> tail = {5, 77};
    const Rows continued = in_passes(ring.transformer, tail, 34, 0);
    full.transformer.truncate(34);
    expect_same_rows(continued, in_passes(full.transformer, tail, 34, 0));
    ring.transformer.truncate(26);
    EXPECT_EQ(ring.transformer.cached(), 0);
    EXPECT_THROW(ring.transformer.forward(tail, 26), Error);
  }
}

// Every weight of a plan, each once (the output matrix is the embedding table when they are tied).
std::vector<const model::LazyTensor*> weights_of(const model::ExecutionPlan& plan) {
  std::vector<const model::LazyTensor*> weights{&plan.token_embd(), &plan.output_norm()};
  if (!plan.config().tied_embeddings) weights.push_back(&plan.output());
  if (plan.rope_freqs()) weights.push_back(&plan.rope_freqs());
  for (const model::LayerPlan& layer : plan.layers())
    for (const model::LazyTensor* tensor : layer.tensors()) weights.push_back(tensor);
  return weights;
}

std::vector<uint8_t> to_host(const void* device, size_t bytes) {
  std::vector<uint8_t> host(bytes);
  check(gpuMemcpy(host.data(), device, bytes, gpuMemcpyDeviceToHost), "copying a weight back");
  return host;
}

// A shared model, or empty when it is not here.
std::shared_ptr<const gguf::File> open_shared(const std::string& model) {
  const std::string path = test::shared_path("models/" + model);
  return std::filesystem::exists(path) ? gguf::File::open(path) : nullptr;
}

TEST(GpuLoading, StreamsEveryWeightOnceInTheDeviceLayout) {
  if (!device_available()) GTEST_SKIP() << "no GPU";
  // Q4_K_M mixes whole-block and split types (Q6_K); stories260K ties its embeddings; Q8_0 is split only.
  for (const std::string name : {"synth-tiny256-Q4_K_M.gguf", "stories260K.gguf", "synth-tiny256-Q8_0.gguf"}) {
    const std::shared_ptr<const gguf::File> file = open_shared(name);
    if (!file) continue;
    SCOPED_TRACE(name);
    const model::ExecutionPlan plan = model::ExecutionPlan::build(file, make_residency());
    EXPECT_EQ(plan.loading_stats().bytes, 0u);
    Transformer transformer(plan, {.context = 16});
    // Several threads want every weight at once, in opposite orders; each weight still uploads once, and
    // everyone gets the same placement.
    const std::vector<const model::LazyTensor*> weights = weights_of(plan);
    std::vector<std::vector<const void*>> seen(4);
    std::vector<std::thread> threads;
    for (size_t t = 0; t < seen.size(); ++t)
      threads.emplace_back([&, t] {
        for (size_t i = 0; i < weights.size(); ++i) {
          const size_t w = t % 2 == 0 ? i : weights.size() - 1 - i;
          seen[t].push_back(weights[w]->data());
        }
        if (t % 2 == 1) std::reverse(seen[t].begin(), seen[t].end());
      });
    for (std::thread& thread : threads) thread.join();
    for (size_t t = 1; t < seen.size(); ++t) EXPECT_EQ(seen[t], seen[0]);

    const model::LoadingStats stats = plan.loading_stats();
    EXPECT_EQ(stats.tensors, file->tensors().size());
    EXPECT_EQ(stats.bytes, file->tensor_bytes());
    EXPECT_GT(stats.gb_per_second(), 0.0);
    EXPECT_GT(stats.wall_seconds, 0.0);
    EXPECT_FALSE(stats.phases.empty());
    for (int64_t l = 0; l < plan.config().n_layers; ++l) EXPECT_TRUE(plan.is_layer_loaded(l)) << "layer " << l;

    // Each weight as streamed in pieces equals the whole tensor uploaded at once.
    const Stream stream;
    for (const model::LazyTensor* weight : weights) {
      const uint64_t blocks = weight->bytes() / weight->info().type_info->block_bytes;
      const size_t device_bytes = device_layout(weight->type(), blocks).bytes;
      const DeviceBuffer whole = upload_weight(weight->type(), weight->info().elements(),
                                               file->tensor_data(weight->info()), stream.get());
      EXPECT_EQ(to_host(weight->data(), device_bytes), to_host(whole.data(), device_bytes)) << weight->name();
    }
  }
}

TEST(GpuLoading, RefusesAModelThatDoesNotFitBeforeUploading) {
  if (!device_available()) GTEST_SKIP() << "no GPU";
  const std::shared_ptr<const gguf::File> file = open_shared("synth-tiny256-Q4_K_M.gguf");
  if (!file) GTEST_SKIP() << "synth-tiny256-Q4_K_M.gguf is not here";
  const model::ExecutionPlan plan = model::ExecutionPlan::build(file, make_residency());

  // A KV cache no device holds.
  const std::string kv_error = test::error_of([&] { Transformer refused(plan, {.context = int64_t{1} << 36}); });
  EXPECT_NE(kv_error.find("does not fit in device memory"), std::string::npos) << kv_error;
  EXPECT_NE(kv_error.find("of KV cache (68719476736 positions)"), std::string::npos) << kv_error;

  // Room for the weights but not for the KV cache and activations besides.
  const uint64_t weights = device_weight_bytes(loader::execution_order_groups(plan));
  const std::string limit_error =
      test::error_of([&] { Transformer refused(plan, {.context = 16, .device_memory = weights}); });
  EXPECT_NE(limit_error.find("does not fit in device memory"), std::string::npos) << limit_error;
  EXPECT_NE(limit_error.find("of weights"), std::string::npos) << limit_error;

  EXPECT_EQ(plan.loading_stats().bytes, 0u);
  EXPECT_FALSE(plan.is_layer_loaded(0));

  // With room enough the same plan loads and runs.
  Transformer transformer(plan, {.context = 16, .device_memory = weights + (uint64_t{1} << 30)});
  const int32_t token = 1;
  EXPECT_EQ(transformer.forward({&token, 1}, 0).size(), static_cast<size_t>(plan.config().vocab_size));
  EXPECT_EQ(plan.loading_stats().bytes, file->tensor_bytes());
}

// Passes of kDefaultPassTokens where their activations fit, else of kShortPassTokens; a prompt longer than a pass runs
// as several, with the logits of one pass.
TEST(GpuLoading, TakesShorterPassesWhereLongOnesDoNotFit) {
  if (!device_available()) GTEST_SKIP() << "no GPU";
  const std::shared_ptr<const gguf::File> file = open_shared("synth-tiny256-F16.gguf");
  if (!file) GTEST_SKIP() << "synth-tiny256-F16.gguf is not here";
  constexpr int64_t kContext = 1024;
  std::vector<int32_t> prompt(600);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(i * 7 % 512);

  // Everything a model of short passes takes (weights, KV cache, activations); the default passes' activations
  // take tens of MiB more.
  uint64_t short_pass_bytes = 0;
  {
    const model::ExecutionPlan plan = model::ExecutionPlan::build(file, make_residency());
    const uint64_t free_before = memory_info().free_bytes;
    Transformer transformer(plan, {.context = kContext, .max_batch = kShortPassTokens});
    plan.preload_all();
    short_pass_bytes = free_before - memory_info().free_bytes;
    EXPECT_EQ(transformer.max_batch(), kShortPassTokens);
  }
  const model::ExecutionPlan roomy_plan = model::ExecutionPlan::build(file, make_residency());
  Transformer roomy(roomy_plan, {.context = kContext});
  EXPECT_EQ(roomy.max_batch(), kDefaultPassTokens);
  const std::span<const float> roomy_logits = roomy.forward(prompt, 0);
  const std::vector<float> one_pass(roomy_logits.begin(), roomy_logits.end());

  const model::ExecutionPlan tight_plan = model::ExecutionPlan::build(file, make_residency());
  Transformer tight(tight_plan, {.context = kContext, .device_memory = short_pass_bytes + (uint64_t{8} << 20)});
  EXPECT_EQ(tight.max_batch(), kShortPassTokens);
  EXPECT_GE(cosine(tight.forward(prompt, 0), one_pass), 0.9999);
}

TEST(GpuLoading, GivesTheDeviceMemoryBackWithTheModel) {
  if (!device_available()) GTEST_SKIP() << "no GPU";
  const std::shared_ptr<const gguf::File> file = open_shared("synth-tiny256-Q4_K_M.gguf");
  if (!file) GTEST_SKIP() << "synth-tiny256-Q4_K_M.gguf is not here";
  // Free memory is the device's, which other processes change too: sizes here are in GiB, far above that.
  // A KV cache of 2 GiB: 4 layers, 128 f16 values per position for keys and for values, 2^20 positions.
  constexpr int64_t kContext = int64_t{1} << 20;
  constexpr uint64_t kGiB = uint64_t{1} << 30;
  const uint64_t free_before = memory_info().free_bytes;
  for (int round = 0; round < 3; ++round) {
    const model::ExecutionPlan plan = model::ExecutionPlan::build(file, make_residency());
    Transformer transformer(plan, {.context = kContext});
    const int32_t token = 1;
    transformer.forward({&token, 1}, 0);
    transformer.forward({&token, 1}, 1);  // captures and replays the decode graph
    EXPECT_LT(memory_info().free_bytes + kGiB, free_before) << "round " << round;
  }
  // Three models that kept their 2 GiB would have taken 6.
  EXPECT_GE(memory_info().free_bytes + kGiB, free_before);
}

}  // namespace
}  // namespace rf::gpu
#endif
