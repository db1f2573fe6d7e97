// One-thread matrix-vector product through rf::cpu::vec_dot: a 2048 x 2048 weight matrix of each type
// times one activation row (quantized once per product, as decoding does). Reports weight bytes per second,
// the figure that bounds decode speed. The matrix (1-9 MB) mostly fits in cache, so this is the kernels'
// own speed, not the memory system's.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "backend/cpu/vec_dot.h"
#include "quant/quant.h"

namespace {

constexpr int64_t kRows = 2048;
constexpr int64_t kCols = 2048;

void matvec(benchmark::State& state, rf::TensorType type) {
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0, 0.02f);
  std::vector<float> values(static_cast<size_t>(kRows * kCols));
  for (float& v : values) v = normal(rng);
  const uint64_t row_bytes = rf::row_bytes(type, kCols);
  std::vector<uint8_t> weights(row_bytes * kRows);
  rf::quant::quantize(type, values.data(), weights.data(), kRows, kCols);

  std::vector<float> x(kCols);
  for (float& v : x) v = normal(rng);
  std::vector<uint8_t> activation(rf::cpu::activation_bytes(type, kCols));
  std::vector<float> out(kRows);

  for (auto _ : state) {
    rf::cpu::quantize_activation(type, x.data(), activation.data(), kCols);
    for (int64_t r = 0; r < kRows; ++r)
      out[r] = rf::cpu::vec_dot(type, weights.data() + r * row_bytes, activation.data(), kCols);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(weights.size()));
  state.SetLabel(rf::cpu::vec_dot_kernel_name(type));
}

int register_all() {
  for (rf::TensorType type : rf::quant::supported_types())
    benchmark::RegisterBenchmark(("matvec_2048x2048/" + std::string(rf::tensor_type_name(type))).c_str(), matvec, type)
        ->Unit(benchmark::kMicrosecond);
  return 0;
}
const int registered = register_all();

}  // namespace

BENCHMARK_MAIN();
