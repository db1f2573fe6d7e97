// One-thread matrix products on a 2048 x 2048 weight matrix of each type:
//  - matvec: times one activation row through vec_dot (quantized once per product, as decoding does).
//    Reports weight bytes per second, the figure that bounds decode speed. The matrix (1-9 MB) mostly fits
//    in cache, so this is the kernels' own speed, not the memory system's.
//  - batch64: times 64 activation rows through vec_dot_rows (prompt processing), a weight row against all
//    rows at a time. Reports dot products (weight row x activation row) per second.
//  - tile64: the same through vec_dot_tile, 8 weight rows at a time, for the types that have tile kernels.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "backend/cpu/vec_dot.h"
#include "quant/quant.h"

namespace {

constexpr int64_t kRows = 2048;
constexpr int64_t kCols = 2048;

struct Matrix {
  std::vector<uint8_t> weights;
  uint64_t row_bytes;
};

Matrix random_matrix(rf::TensorType type, std::mt19937& rng) {
  std::normal_distribution<float> normal(0, 0.02f);
  std::vector<float> values(static_cast<size_t>(kRows * kCols));
  for (float& v : values) v = normal(rng);
  Matrix m{std::vector<uint8_t>(rf::row_bytes(type, kCols) * kRows), rf::row_bytes(type, kCols)};
  rf::quant::quantize(type, values.data(), m.weights.data(), kRows, kCols);
  return m;
}

void matvec(benchmark::State& state, rf::TensorType type) {
  std::mt19937 rng(42);
  const Matrix m = random_matrix(type, rng);
  std::normal_distribution<float> normal(0, 0.02f);
  std::vector<float> x(kCols);
  for (float& v : x) v = normal(rng);
  std::vector<uint8_t> activation(rf::cpu::activation_bytes(type, kCols));
  std::vector<float> out(kRows);

  for (auto _ : state) {
    rf::cpu::quantize_activation(type, x.data(), activation.data(), kCols);
    for (int64_t r = 0; r < kRows; ++r)
      out[r] = rf::cpu::vec_dot(type, m.weights.data() + r * m.row_bytes, activation.data(), kCols);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(m.weights.size()));
  state.SetLabel(rf::cpu::vec_dot_kernel_name(type));
}

enum class BatchKernel { Rows, Tiles };

void batch(benchmark::State& state, rf::TensorType type, BatchKernel kernel) {
  constexpr int64_t kTokens = 64;
  std::mt19937 rng(42);
  const Matrix m = random_matrix(type, rng);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> x(kCols);
  const size_t stride = rf::cpu::activation_bytes(type, kCols);
  std::vector<uint8_t> activations(stride * kTokens);
  for (int64_t t = 0; t < kTokens; ++t) {
    for (float& v : x) v = normal(rng);
    rf::cpu::quantize_activation(type, x.data(), activations.data() + t * stride, kCols);
  }
  std::vector<float> out(kRows * kTokens);
  for (auto _ : state) {
    if (kernel == BatchKernel::Tiles) {
      for (int64_t r = 0; r < kRows; r += rf::cpu::kTileRows)
        rf::cpu::vec_dot_tile(type, m.weights.data() + r * m.row_bytes, m.row_bytes, activations.data(), stride,
                              kTokens, kCols, out.data() + r, kRows);
    } else {
      for (int64_t r = 0; r < kRows; ++r)
        rf::cpu::vec_dot_rows(type, m.weights.data() + r * m.row_bytes, activations.data(), stride, kTokens, kCols,
                              out.data() + r, kRows);
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * kRows * kTokens);
  state.SetLabel(rf::cpu::vec_dot_kernel_name(type));
}

int register_all() {
  for (rf::TensorType type : rf::quant::supported_types())
    benchmark::RegisterBenchmark(("matvec_2048x2048/" + std::string(rf::tensor_type_name(type))).c_str(), matvec, type)
        ->Unit(benchmark::kMicrosecond);
  for (rf::TensorType type : rf::quant::supported_types())
    benchmark::RegisterBenchmark(("batch64_2048x2048/" + std::string(rf::tensor_type_name(type))).c_str(), batch, type,
                                 BatchKernel::Rows)
        ->Unit(benchmark::kMillisecond);
  for (rf::TensorType type : rf::quant::supported_types())
    if (rf::cpu::has_tile_kernel(type))
      benchmark::RegisterBenchmark(("tile64_2048x2048/" + std::string(rf::tensor_type_name(type))).c_str(), batch,
                                   type, BatchKernel::Tiles)
          ->Unit(benchmark::kMillisecond);
  return 0;
}
const int registered = register_all();

}  // namespace

BENCHMARK_MAIN();
