#include "backend/cpu/vec_dot.h"

#include <array>

#include "quant/blocks.h"
#include "quant/quant.h"
#include "util/error.h"

namespace rf::cpu {
namespace {

// Which activation format each weight type's kernels read.
struct Pairing {
  TensorType weight;
  TensorType activation;
};
constexpr Pairing kPairings[] = {
    {TensorType::F32, TensorType::F32},   {TensorType::F16, TensorType::F32},   {TensorType::BF16, TensorType::F32},
    {TensorType::Q4_0, TensorType::Q8_0}, {TensorType::Q4_1, TensorType::Q8_0}, {TensorType::Q5_0, TensorType::Q8_0},
    {TensorType::Q5_1, TensorType::Q8_0}, {TensorType::Q8_0, TensorType::Q8_0}, {TensorType::IQ4_NL, TensorType::Q8_0},
    {TensorType::Q2_K, TensorType::Q8_K}, {TensorType::Q3_K, TensorType::Q8_K}, {TensorType::Q4_K, TensorType::Q8_K},
    {TensorType::Q5_K, TensorType::Q8_K}, {TensorType::Q6_K, TensorType::Q8_K}, {TensorType::IQ4_XS, TensorType::Q8_K},
};

struct Entry {
  bool supported = false;
  TensorType activation = TensorType::F32;
  VecDotFn kernel = nullptr;  // the fastest this build has
  VecDotRowsFn rows = nullptr;  // its multi-row form, if it has one
  VecDotTileFn tile = nullptr;  // its tile form, if it has one
  VecDotFn portable = nullptr;
  const char* kernel_name = "";
};

// Indexed by type id, so that vec_dot, called once per weight row, finds its kernel with one load.
constexpr size_t kTypeIds = 64;
using Table = std::array<Entry, kTypeIds>;

Table build_table() {
  Table table{};
  for (const Pairing& p : kPairings) {
    Entry& e = table[static_cast<size_t>(p.weight)];
    e.supported = true;
    e.activation = p.activation;
    e.portable = portable_vec_dot_kernel(p.weight);
    const NamedKernel simd = x86_vec_dot_kernel(p.weight);
    e.kernel = simd.kernel ? simd.kernel : e.portable;
    e.rows = simd.rows;
    e.tile = simd.tile;
    e.kernel_name = simd.kernel ? simd.name : "portable";
  }
  return table;
}

const Entry& entry(TensorType weight_type) {
  static const Table table = build_table();
  const auto id = static_cast<size_t>(weight_type);
  if (id >= kTypeIds || !table[id].supported)
    fail("CPU dot products do not support weight type {}", tensor_type_name(weight_type));
  return table[id];
}

}  // namespace

TensorType activation_type(TensorType weight_type) { return entry(weight_type).activation; }

size_t activation_bytes(TensorType weight_type, int64_t n) {
  return row_bytes(activation_type(weight_type), static_cast<uint64_t>(n));
}

void quantize_activation(TensorType weight_type, const float* x, void* dst, int64_t n) {
  const TensorType type = activation_type(weight_type);
  static const QuantizeFn q8_k_simd = x86_q8_k_quantizer();
  if (type == TensorType::Q8_K && q8_k_simd && n % quant::kSuperBlock == 0)
    q8_k_simd(x, dst, n);
  else if (type == TensorType::Q8_K)
    quant::quantize_q8_k(x, dst, n);  // also the error for a partial block
  else
    quant::quantize(type, x, dst, 1, n);
}

float vec_dot(TensorType weight_type, const void* weight_row, const void* activation, int64_t n) {
  return entry(weight_type).kernel(weight_row, activation, n);
}

VecDotFn vec_dot_kernel(TensorType weight_type) { return entry(weight_type).kernel; }

void vec_dot_rows(TensorType weight_type, const void* weight_row, const void* activations, size_t activation_stride,
                  int64_t count, int64_t n, float* out, int64_t out_stride) {
  const Entry& e = entry(weight_type);
  if (e.rows) {
    e.rows(weight_row, activations, activation_stride, count, n, out, out_stride);
    return;
  }
  const auto* rows = static_cast<const uint8_t*>(activations);
  for (int64_t t = 0; t < count; ++t) out[t * out_stride] = e.kernel(weight_row, rows + t * activation_stride, n);
}

bool has_tile_kernel(TensorType weight_type) { return entry(weight_type).tile != nullptr; }

void vec_dot_tile(TensorType weight_type, const void* weight_rows, size_t weight_row_bytes, const void* activations,
                  size_t activation_stride, int64_t count, int64_t n, float* out, int64_t out_stride) {
  const Entry& e = entry(weight_type);
  if (!e.tile) fail("no tile kernel for weight type {}", tensor_type_name(weight_type));
  e.tile(weight_rows, weight_row_bytes, activations, activation_stride, count, n, out, out_stride);
}

float vec_dot_portable(TensorType weight_type, const void* weight_row, const void* activation, int64_t n) {
  return entry(weight_type).portable(weight_row, activation, n);
}

const char* vec_dot_kernel_name(TensorType weight_type) { return entry(weight_type).kernel_name; }

}  // namespace rf::cpu
