// CPU dot products against the dequantized f32 dot product. Two checks per type and length:
//  - with the activation dequantized too, the result is the same sum, so only float rounding may differ;
//  - against the original f32 activations, the difference must be explained by the 8-bit activation
//    quantization: at most sum |w_i| * |x_i - dequantized activation_i|.
// The SIMD kernels must agree with the portable ones to float rounding.
#include "backend/cpu/vec_dot.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "quant/blocks.h"
#include "quant/quant.h"
#include "util/error.h"

namespace rf::cpu {
namespace {

std::vector<float> dequantized_activation(TensorType weight_type, const std::vector<uint8_t>& act, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  const TensorType type = activation_type(weight_type);
  if (type == TensorType::Q8_K) {
    const auto* blocks = reinterpret_cast<const quant::BlockQ8_K*>(act.data());
    for (int64_t i = 0; i < n; ++i) out[i] = blocks[i / 256].d * blocks[i / 256].qs[i % 256];
  } else {
    quant::dequantize(type, act.data(), out.data(), n);
  }
  return out;
}

struct Case {
  std::vector<uint8_t> weights;
  std::vector<float> dequantized_weights;
  std::vector<float> x;
  std::vector<uint8_t> activation;
};

Case make_case(TensorType type, int64_t n, uint32_t seed, float activation_scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0, 1);
  Case c;
  std::vector<float> w(static_cast<size_t>(n));
  for (float& v : w) v = 0.02f * normal(rng);
  c.weights.resize(row_bytes(type, static_cast<uint64_t>(n)));
  quant::quantize(type, w.data(), c.weights.data(), 1, n);
  c.dequantized_weights.resize(static_cast<size_t>(n));
  quant::dequantize(type, c.weights.data(), c.dequantized_weights.data(), n);
  c.x.resize(static_cast<size_t>(n));
  for (float& v : c.x) v = activation_scale * normal(rng);
  c.activation.resize(activation_bytes(type, n));
  quantize_activation(type, c.x.data(), c.activation.data(), n);
  return c;
}

void check_type(TensorType type, int64_t n, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << tensor_type_name(type) << " n=" << n << " kernel " << vec_dot_kernel_name(type));
  const Case c = make_case(type, n, seed);
  const std::vector<float> a = dequantized_activation(type, c.activation, n);

  double same_inputs = 0;      // dequantized weights . dequantized activations
  double f32_activations = 0;  // dequantized weights . original activations
  double magnitude = 0;        // sum |w_i a_i|: the scale of float rounding
  double activation_error = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double w = c.dequantized_weights[i];
    same_inputs += w * a[i];
    f32_activations += w * c.x[i];
    magnitude += std::fabs(w * a[i]);
    activation_error += std::fabs(w) * std::fabs(static_cast<double>(c.x[i]) - a[i]);
  }
  const double rounding = 1e-5 * magnitude;
  const float simd = vec_dot(type, c.weights.data(), c.activation.data(), n);
  const float portable = vec_dot_portable(type, c.weights.data(), c.activation.data(), n);
  EXPECT_NEAR(simd, same_inputs, rounding);
  EXPECT_NEAR(portable, same_inputs, rounding);
  EXPECT_NEAR(simd, portable, rounding);
  EXPECT_NEAR(simd, f32_activations, activation_error + rounding);
}

class VecDot : public testing::TestWithParam<TensorType> {};

TEST_P(VecDot, MatchesDequantizedDotProduct) {
  uint32_t seed = 1;
  // One super-block, an odd number of them (the 32-element kernels alternate two accumulators), a long row.
  for (int64_t n : {256, 768, 4096}) check_type(GetParam(), n, seed++);
}

// Activations large enough that every quant hits its extreme (|q| = 127) exercise the 16-bit intermediate
// sums of the SIMD kernels at their largest.
TEST_P(VecDot, ExtremeQuantsDoNotOverflow) {
  const TensorType type = GetParam();
  const int64_t n = 512;
  Case c = make_case(type, n, 99);
  for (size_t i = 0; i < c.x.size(); ++i) c.x[i] = (i * 7 % 3 == 0) ? -1.0f : 1.0f;
  quantize_activation(type, c.x.data(), c.activation.data(), n);
  const float simd = vec_dot(type, c.weights.data(), c.activation.data(), n);
  const float portable = vec_dot_portable(type, c.weights.data(), c.activation.data(), n);
  double magnitude = 0;
  for (int64_t i = 0; i < n; ++i) magnitude += std::fabs(c.dequantized_weights[i]);
  EXPECT_NEAR(simd, portable, 1e-5 * magnitude) << tensor_type_name(type);
}

// The multi-row kernels do the same arithmetic per row as vec_dot: equal results, not merely close ones.
// Nine rows cover two full groups of the kernels and a remainder; every third output slot is written.
TEST_P(VecDot, RowsMatchVecDotExactly) {
  const TensorType type = GetParam();
  const int64_t n = 768;  // an odd number of 32-element blocks, three super-blocks
  constexpr int64_t kRows = 9, kOutStride = 3;
  const Case weight = make_case(type, n, 7);
  const size_t stride = activation_bytes(type, n);
  std::vector<uint8_t> activations(stride * kRows);
  for (int64_t t = 0; t < kRows; ++t) {
    const Case c = make_case(type, n, static_cast<uint32_t>(100 + t));
    std::copy(c.activation.begin(), c.activation.end(), activations.begin() + static_cast<ptrdiff_t>(t * stride));
  }
  std::vector<float> out(kRows * kOutStride, -1.0f);
  vec_dot_rows(type, weight.weights.data(), activations.data(), stride, kRows, n, out.data(), kOutStride);
  for (int64_t t = 0; t < kRows; ++t) {
    EXPECT_EQ(out[t * kOutStride], vec_dot(type, weight.weights.data(), activations.data() + t * stride, n))
        << tensor_type_name(type) << " row " << t;
    EXPECT_EQ(out[t * kOutStride + 1], -1.0f);
  }
}

// The tile kernels apply the scales in another order than vec_dot: the same sums to float rounding. Eight
// weight rows with padding between them (a stride longer than a row); 15 tokens, since the kernels take
// tokens eight, then four, then one at a time; activations scaled so that quants reach their extremes for
// every other token. The output slot after the tile's 8 must stay untouched.
TEST_P(VecDot, TileMatchesVecDot) {
  const TensorType type = GetParam();
  if (!has_tile_kernel(type)) GTEST_SKIP() << "no tile kernel for " << tensor_type_name(type) << " in this build";
  const int64_t n = 768;
  constexpr int64_t kTokens = 15, kOutStride = kTileRows + 1;
  const size_t row = row_bytes(type, n), padded_row = row + 64;
  std::vector<uint8_t> weights(padded_row * kTileRows, 0xAB);
  for (int r = 0; r < kTileRows; ++r) {
    const Case c = make_case(type, n, static_cast<uint32_t>(200 + r));
    std::copy(c.weights.begin(), c.weights.end(), weights.begin() + static_cast<ptrdiff_t>(r * padded_row));
  }
  const size_t stride = activation_bytes(type, n);
  std::vector<uint8_t> activations(stride * kTokens);
  for (int64_t t = 0; t < kTokens; ++t) {
    const Case c = make_case(type, n, static_cast<uint32_t>(300 + t), t % 2 ? 100.0f : 1.0f);
    std::copy(c.activation.begin(), c.activation.end(), activations.begin() + static_cast<ptrdiff_t>(t * stride));
  }
  std::vector<float> out(kTokens * kOutStride, -1.0f);
  vec_dot_tile(type, weights.data(), padded_row, activations.data(), stride, kTokens, n, out.data(), kOutStride);
  for (int64_t t = 0; t < kTokens; ++t) {
    for (int r = 0; r < kTileRows; ++r) {
      const uint8_t* w = weights.data() + r * padded_row;
      const uint8_t* a = activations.data() + t * stride;
      const float expected = vec_dot(type, w, a, n);
      // Float rounding relative to the sum of |products|, which the dot product with |w| bounds.
      const std::vector<float> dw = [&] {
        std::vector<float> v(static_cast<size_t>(n));
        quant::dequantize(type, w, v.data(), n);
        return v;
      }();
      const std::vector<float> da = dequantized_activation(type, {a, a + stride}, n);
      double magnitude = 0;
      for (int64_t i = 0; i < n; ++i) magnitude += std::fabs(static_cast<double>(dw[i]) * da[i]);
      EXPECT_NEAR(out[t * kOutStride + r], expected, 1e-5 * magnitude) << "token " << t << " row " << r;
    }
    EXPECT_EQ(out[t * kOutStride + kTileRows], -1.0f);
  }
}

INSTANTIATE_TEST_SUITE_P(Types, VecDot,
                         testing::ValuesIn(quant::supported_types().begin(), quant::supported_types().end()),
                         [](const testing::TestParamInfo<TensorType>& p) {
                           return std::string(tensor_type_name(p.param));
                         });

TEST(VecDotFormats, ActivationTypes) {
  EXPECT_EQ(activation_type(TensorType::F32), TensorType::F32);
  EXPECT_EQ(activation_type(TensorType::BF16), TensorType::F32);
  EXPECT_EQ(activation_type(TensorType::Q4_0), TensorType::Q8_0);
  EXPECT_EQ(activation_type(TensorType::IQ4_NL), TensorType::Q8_0);
  EXPECT_EQ(activation_type(TensorType::Q4_K), TensorType::Q8_K);
  EXPECT_EQ(activation_type(TensorType::IQ4_XS), TensorType::Q8_K);
  EXPECT_EQ(activation_bytes(TensorType::Q6_K, 512), 2u * sizeof(quant::BlockQ8_K));
  EXPECT_EQ(activation_bytes(TensorType::Q5_1, 64), 2u * sizeof(quant::BlockQ8_0));
  EXPECT_EQ(activation_bytes(TensorType::F16, 10), 40u);
  EXPECT_THROW(activation_type(TensorType::IQ2_XXS), Error);
  EXPECT_THROW(vec_dot(TensorType::Q8_1, nullptr, nullptr, 0), Error);
}

// Float weights take rows of any length: stories260K's FFN rows have 172 elements.
TEST(VecDotFormats, FloatRowsOfAnyLength) {
  for (TensorType type : {TensorType::F32, TensorType::F16, TensorType::BF16})
    for (int64_t n : {1, 7, 172, 333}) check_type(type, n, static_cast<uint32_t>(n));
}

// The SIMD Q8_K quantization writes quant::quantize_q8_k's bytes: on random rows at several scales, and on the
// blocks where the choice of scale has edge cases (all zero, a largest magnitude of both signs, a negative
// extreme, values that round half-way).
TEST(VecDotFormats, SimdQ8KQuantizationMatchesQuant) {
  const QuantizeFn simd = x86_q8_k_quantizer();
  if (!simd) GTEST_SKIP() << "no SIMD Q8_K quantization in this build";
  constexpr int64_t kBlock = quant::kSuperBlock;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> x;
  for (const float scale : {1e-3f, 1.0f, 300.0f})
    for (int b = 0; b < 4; ++b)
      for (int e = 0; e < kBlock; ++e) x.push_back(scale * normal(rng));
  const auto add_block = [&](auto value_of) {
    for (int e = 0; e < kBlock; ++e) x.push_back(value_of(e));
  };
  add_block([](int) { return 0.0f; });
  add_block([](int e) { return e == 17 ? -2.0f : e == 200 ? 2.0f : 0.5f; });   // tie, negative first
  add_block([](int e) { return e == 17 ? 2.0f : e == 200 ? -2.0f : -0.5f; });  // tie, positive first
  add_block([](int e) { return e == 100 ? -3.0f : 1.0f; });                    // negative extreme
  // A tie again (-4 first), and levels half-way between integers: iscale = 31.75, so 2 -> 63.5.
  add_block([](int e) { return static_cast<float>(e % 9) - 4.0f + (e == 5 ? 0.5f : 0.0f); });
  add_block([](int e) { return e % 2 ? 127.0f : -127.0f; });
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> expected(row_bytes(TensorType::Q8_K, n)), got(expected.size());
  quant::quantize_q8_k(x.data(), expected.data(), n);
  simd(x.data(), got.data(), n);
  for (int64_t b = 0; b < n / kBlock; ++b) {
    const size_t offset = static_cast<size_t>(b) * sizeof(quant::BlockQ8_K);
    EXPECT_TRUE(std::equal(got.begin() + offset, got.begin() + offset + sizeof(quant::BlockQ8_K),
                           expected.begin() + offset))
        << "block " << b;
  }
}

TEST(VecDotFormats, PartialActivationBlocksAreErrors) {
  std::vector<float> x(300, 1.0f);
  std::vector<uint8_t> out(4096);
  EXPECT_THROW(quantize_activation(TensorType::Q4_K, x.data(), out.data(), 300), Error);
  EXPECT_THROW(quantize_activation(TensorType::Q4_0, x.data(), out.data(), 300), Error);
}

}  // namespace
}  // namespace rf::cpu
