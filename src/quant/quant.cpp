#include "quant/quant.h"

#include <algorithm>
#include <array>
#include <string>
#include <thread>
#include <vector>

#include "quant/kernels.h"
#include "util/error.h"

namespace rf::quant {
namespace {

struct Converters {
  TensorType type;
  DequantizeFn dequantize;
  QuantizeFn quantize;
};

constexpr std::array kConverters = {
    Converters{TensorType::F32, dequantize_f32, quantize_f32},
    Converters{TensorType::F16, dequantize_f16, quantize_f16},
    Converters{TensorType::BF16, dequantize_bf16, quantize_bf16},
    Converters{TensorType::Q4_0, dequantize_q4_0, quantize_q4_0},
    Converters{TensorType::Q4_1, dequantize_q4_1, quantize_q4_1},
    Converters{TensorType::Q5_0, dequantize_q5_0, quantize_q5_0},
    Converters{TensorType::Q5_1, dequantize_q5_1, quantize_q5_1},
    Converters{TensorType::Q8_0, dequantize_q8_0, quantize_q8_0},
    Converters{TensorType::Q2_K, dequantize_q2_k, quantize_q2_k},
    Converters{TensorType::Q3_K, dequantize_q3_k, quantize_q3_k},
    Converters{TensorType::Q4_K, dequantize_q4_k, quantize_q4_k},
    Converters{TensorType::Q5_K, dequantize_q5_k, quantize_q5_k},
    Converters{TensorType::Q6_K, dequantize_q6_k, quantize_q6_k},
    Converters{TensorType::IQ4_NL, dequantize_iq4_nl, quantize_iq4_nl},
    Converters{TensorType::IQ4_XS, dequantize_iq4_xs, quantize_iq4_xs},
};

constexpr std::array kSupportedTypes = [] {
  std::array<TensorType, kConverters.size()> types{};
  for (size_t i = 0; i < kConverters.size(); ++i) types[i] = kConverters[i].type;
  return types;
}();

const Converters* find_converters(TensorType type) {
  for (const Converters& c : kConverters)
    if (c.type == type) return &c;
  return nullptr;
}

const Converters& converters(TensorType type, std::string_view what) {
  const Converters* c = find_converters(type);
  if (!c) {
    std::string supported;
    for (const Converters& s : kConverters) supported += fmt::format(" {}", tensor_type_name(s.type));
    fail("{}: type {} is not supported (supported:{})", what, tensor_type_name(type), supported);
  }
  return *c;
}

void require_whole_blocks(TensorType type, int64_t n) {
  const uint32_t block = tensor_type_info(type).block_elements;
  if (n < 0 || n % block != 0)
    fail("{} elements are not a whole number of {} blocks ({} elements each)", n, tensor_type_name(type), block);
}

}  // namespace

bool is_supported(TensorType type) { return find_converters(type) != nullptr; }

std::span<const TensorType> supported_types() { return kSupportedTypes; }

void require_supported(TensorType type, std::string_view what) { converters(type, what); }

void dequantize(TensorType type, const void* src, float* dst, int64_t n) {
  const Converters& c = converters(type, "dequantize");
  require_whole_blocks(type, n);
  c.dequantize(src, dst, n);
}

void dequantize_parallel(TensorType type, const void* src, float* dst, int64_t n, int threads) {
  const Converters& c = converters(type, "dequantize");
  require_whole_blocks(type, n);
  const TensorTypeInfo& info = tensor_type_info(type);
  // Below about a million elements per thread, starting threads costs more than it saves.
  constexpr int64_t kMinElementsPerThread = 1 << 20;
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int64_t blocks = n / info.block_elements;
  const int64_t workers = std::clamp<int64_t>(n / kMinElementsPerThread, 1, threads);
  if (workers == 1) {
    c.dequantize(src, dst, n);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(workers));
  for (int64_t w = 0; w < workers; ++w) {
    const int64_t first = blocks * w / workers;
    const int64_t last = blocks * (w + 1) / workers;
    const auto* chunk = static_cast<const uint8_t*>(src) + first * info.block_bytes;
    pool.emplace_back(c.dequantize, chunk, dst + first * info.block_elements, (last - first) * info.block_elements);
  }
  for (std::thread& t : pool) t.join();
}

void quantize(TensorType type, const float* src, void* dst, int64_t rows, int64_t n_per_row) {
  const Converters& c = converters(type, "quantize");
  require_whole_blocks(type, n_per_row);
  // No quantizer looks across a block, so the rows convert as one run.
  c.quantize(src, dst, rows * n_per_row);
}

void quantize_q8_k(const float* src, void* dst, int64_t n) {
  require_whole_blocks(TensorType::Q8_K, n);
  quantize_q8_k_unchecked(src, dst, n);
}

}  // namespace rf::quant
