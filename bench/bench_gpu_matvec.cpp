// The decode products of an 8B llama (Q4_K_M and F16, and its gate + up and down in other types) and of a 1B
// (Q4_K_M), one launch at a time on the GPU: each product is launched back to back on one stream and timed
// with events, which is how a captured decode step replays them. Reports microseconds per product and the weight
// bytes it streams per second. The weights are a constant byte pattern (the kernels' speed does not depend on
// the values), so nothing is quantized on the host. Skips when no GPU is present.
#include <benchmark/benchmark.h>

#if ROCMFORGE_HAVE_GPU
#include <string>
#include <vector>

#include "backend/gpu/kernels.h"
#include "backend/gpu/runtime.h"

namespace {

using rf::TensorType;
using namespace rf::gpu;

constexpr int64_t kDim = 4096;
constexpr int64_t kHidden = 14336;
constexpr int64_t kVocab = 128256;
constexpr int64_t k1bDim = 2048;
constexpr int64_t k1bHidden = 8192;

// Matrices of one type and width read in one launch (q and k; gate and up), and the batch of input rows.
void products(benchmark::State& state, TensorType type, std::vector<int64_t> rows, int64_t cols, int batch) {
  if (!device_available()) {
    state.SkipWithError("no GPU");
    return;
  }
  const Stream stream;
  const int64_t block_elements = rf::tensor_type_info(type).block_elements;
  std::vector<DeviceBuffer> weights;
  std::vector<DeviceBuffer> outputs;
  std::vector<MatvecSegment> segments;
  uint64_t bytes = 0;
  for (const int64_t r : rows) {
    const DeviceLayout layout = device_layout(type, static_cast<uint64_t>(r * cols / block_elements));
    weights.emplace_back(layout.bytes, "weights");
    check(gpuMemsetAsync(weights.back().data(), 0x11, layout.bytes, stream.get()), "filling weights");
    outputs.emplace_back(static_cast<size_t>(r * batch) * sizeof(float), "outputs");
    segments.push_back({weight_view(weights.back().data(), type, r, cols), r, outputs.back().as<float>()});
    bytes += layout.bytes;
  }
  const DeviceBuffer x(static_cast<size_t>(batch * cols) * sizeof(float), "activations");
  const DeviceBuffer q(static_cast<size_t>(batch * cols), "8-bit activations");
  const DeviceBuffer scales(static_cast<size_t>(batch * cols / kActivationBlock) * sizeof(ActivationScale), "scales");
  check(gpuMemsetAsync(x.data(), 0, x.bytes(), stream.get()), "clearing activations");
  check(gpuMemsetAsync(q.data(), 0, q.bytes(), stream.get()), "clearing activations");
  check(gpuMemsetAsync(scales.data(), 0, scales.bytes(), stream.get()), "clearing activations");
  ProductInput input;
  input.f32 = x.as<float>();
  if (activation_blocks(type) != ActivationBlocks::None) {
    input.q = q.as<int8_t>();
    input.scales = scales.as<ActivationScale>();
  }

  // One iteration is kLaunches products; the counters give one product's time and rate.
  constexpr int kLaunches = 100;
  const Event start(true);
  const Event end(true);
  double seconds = 0.0;
  for (auto _ : state) {
    start.record(stream.get());
    for (int i = 0; i < kLaunches; ++i) matvec(type, segments, cols, input, batch, false, stream.get());
    end.record(stream.get());
    end.synchronize();
    const double elapsed = end.milliseconds_since(start) / 1e3;
    state.SetIterationTime(elapsed);
    seconds += elapsed;
  }
  const double products = static_cast<double>(state.iterations()) * kLaunches;
  state.counters["us_per_product"] = seconds / products * 1e6;
  state.counters["weight_GB/s"] = static_cast<double>(bytes) * products / seconds / 1e9;
}

void register_products() {
  struct Case {
    const char* name;
    TensorType type;
    std::vector<int64_t> rows;
    int64_t cols;
  };
  const std::vector<Case> cases{
      {"q_k/Q4_K", TensorType::Q4_K, {kDim, kDim / 4}, kDim},
      {"v/Q6_K", TensorType::Q6_K, {kDim / 4}, kDim},
      {"attn_output/Q4_K", TensorType::Q4_K, {kDim}, kDim},
      {"gate_up/Q4_K", TensorType::Q4_K, {kHidden, kHidden}, kDim},
      {"down/Q6_K", TensorType::Q6_K, {kDim}, kHidden},
      {"down/Q4_K", TensorType::Q4_K, {kDim}, kHidden},
      {"output/Q6_K", TensorType::Q6_K, {kVocab}, kDim},
      {"q_k_v/F16", TensorType::F16, {kDim, kDim / 4, kDim / 4}, kDim},
      {"attn_output/F16", TensorType::F16, {kDim}, kDim},
      {"gate_up/F16", TensorType::F16, {kHidden, kHidden}, kDim},
      {"down/F16", TensorType::F16, {kDim}, kHidden},
      {"gate_up/Q8_0", TensorType::Q8_0, {kHidden, kHidden}, kDim},
      {"gate_up/Q4_0", TensorType::Q4_0, {kHidden, kHidden}, kDim},
      {"gate_up/Q5_K", TensorType::Q5_K, {kHidden, kHidden}, kDim},
      {"gate_up/Q3_K", TensorType::Q3_K, {kHidden, kHidden}, kDim},
      {"gate_up/IQ4_XS", TensorType::IQ4_XS, {kHidden, kHidden}, kDim},
      {"down/Q8_0", TensorType::Q8_0, {kDim}, kHidden},
      {"down/Q4_0", TensorType::Q4_0, {kDim}, kHidden},
      {"down/Q5_K", TensorType::Q5_K, {kDim}, kHidden},
      {"down/IQ4_XS", TensorType::IQ4_XS, {kDim}, kHidden},
      {"1b_q_k/Q4_K", TensorType::Q4_K, {k1bDim, k1bDim / 4}, k1bDim},
      {"1b_v/Q6_K", TensorType::Q6_K, {k1bDim / 4}, k1bDim},
      {"1b_attn_output/Q4_K", TensorType::Q4_K, {k1bDim}, k1bDim},
      {"1b_gate_up/Q4_K", TensorType::Q4_K, {k1bHidden, k1bHidden}, k1bDim},
      {"1b_down/Q6_K", TensorType::Q6_K, {k1bDim}, k1bHidden},
  };
  for (const Case& c : cases)
    for (const int batch : {1, 4})
      benchmark::RegisterBenchmark((std::string(c.name) + "/batch" + std::to_string(batch)).c_str(), products, c.type,
                                   c.rows, c.cols, batch)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
}

const int registered = (register_products(), 0);

}  // namespace
#endif

BENCHMARK_MAIN();
