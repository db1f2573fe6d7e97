// The CPU kernels against naive double-precision references.
#include "backend/cpu/ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "random_normal.h"
#include "util/half.h"

namespace rf {
namespace {

model::ModelConfig rope_config(int64_t head_dim, int64_t rope_dims) {
  model::ModelConfig c;
  c.head_dim = head_dim;
  c.rope_dims = rope_dims;
  c.rope_base = 10000.0f;
  return c;
}

TEST(OpsTest, RmsNorm) {
  const std::vector<float> x = test::random_normal(300, 1, 3.0f);
  const std::vector<float> w = test::random_normal(300, 2);
  std::vector<float> out(300);
  cpu::rmsnorm(out.data(), x.data(), w.data(), 300, 1e-5f);
  double ss = 0.0;
  for (float v : x) ss += static_cast<double>(v) * v;
  const double scale = 1.0 / std::sqrt(ss / 300.0 + 1e-5);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(out[i], x[i] * scale * w[i], 1e-5);
}

TEST(OpsTest, SoftmaxIsStableAndNormalized) {
  std::vector<float> x = {1000.0f, 1001.0f, 999.0f, -1e30f};
  cpu::softmax(x.data(), 4);
  const double e0 = std::exp(-1.0), e2 = std::exp(-2.0), sum = e0 + 1.0 + e2;
  EXPECT_NEAR(x[0], e0 / sum, 1e-6);
  EXPECT_NEAR(x[1], 1.0 / sum, 1e-6);
  EXPECT_NEAR(x[2], e2 / sum, 1e-6);
  EXPECT_EQ(x[3], 0.0f);
}

// Against the formula in double, to a few float ulps: random gates (a length that leaves a tail after the
// SIMD steps) and gates where e^-g over- or underflows a float.
TEST(OpsTest, SwiGlu) {
  std::vector<float> gate = test::random_normal(1003, 3, 4.0f);
  for (const float g : {0.0f, -0.0f, 1e-8f, 20.0f, -20.0f, 87.5f, -87.5f, 88.5f, -88.5f, 89.0f, -89.0f, 200.0f,
                        -200.0f, 1e30f, -1e30f})
    gate.push_back(g);
  const std::vector<float> original = gate;
  const std::vector<float> up = test::random_normal(gate.size(), 4);
  cpu::swiglu(gate.data(), up.data(), static_cast<int64_t>(gate.size()));
  for (size_t i = 0; i < gate.size(); ++i) {
    const double g = original[i];
    const double expected = g / (1.0 + std::exp(-g)) * up[i];
    EXPECT_NEAR(gate[i], expected, 4e-7 * std::fabs(expected) + 1e-30) << "gate " << g;
  }
}

// Rotates pair (a, b) of every head by position * base^(-2i / rope_dims), in double.
std::vector<float> naive_rope(std::vector<float> x, int64_t n_heads, int64_t head_dim, int64_t rope_dims,
                              int64_t position, model::RopeStyle style) {
  for (int64_t h = 0; h < n_heads; ++h) {
    for (int64_t i = 0; i < rope_dims / 2; ++i) {
      const double angle = static_cast<double>(position) * std::pow(10000.0, -2.0 * i / rope_dims);
      const int64_t a = h * head_dim + (style == model::RopeStyle::Normal ? 2 * i : i);
      const int64_t b = a + (style == model::RopeStyle::Normal ? 1 : rope_dims / 2);
      const double xa = x[a], xb = x[b];
      x[a] = static_cast<float>(xa * std::cos(angle) - xb * std::sin(angle));
      x[b] = static_cast<float>(xa * std::sin(angle) + xb * std::cos(angle));
    }
  }
  return x;
}

TEST(OpsTest, RopeBothStylesMatchNaive) {
  for (const model::RopeStyle style : {model::RopeStyle::Normal, model::RopeStyle::NeoX}) {
    for (const int64_t rope_dims : {int64_t{64}, int64_t{32}}) {  // full and partial rotation
      SCOPED_TRACE(std::string(model::rope_style_name(style)) + " rope_dims " + std::to_string(rope_dims));
      const model::ModelConfig c = rope_config(64, rope_dims);
      const std::vector<double> inverse = c.rope_inverse_frequencies(false, nullptr);
      std::vector<float> cos_sin(static_cast<size_t>(rope_dims));
      for (const int64_t position : {int64_t{0}, int64_t{1}, int64_t{17}, int64_t{3000}}) {
        std::vector<float> x = test::random_normal(3 * 64, 5);
        const std::vector<float> expected = naive_rope(x, 3, 64, rope_dims, position, style);
        cpu::rope_angles(cos_sin.data(), position, inverse);
        cpu::rope(x.data(), 3, 64, cos_sin.data(), rope_dims / 2, style);
        for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], expected[i], 2e-5) << "position " << position;
      }
    }
  }
}

TEST(OpsTest, RopeDependsOnlyOnRelativePosition) {
  const model::ModelConfig c = rope_config(16, 16);
  const std::vector<double> inverse = c.rope_inverse_frequencies(false, nullptr);
  const auto rotated_dot = [&](int64_t pq, int64_t pk) {
    std::vector<float> q = test::random_normal(16, 6), k = test::random_normal(16, 7), cs(16);
    cpu::rope_angles(cs.data(), pq, inverse);
    cpu::rope(q.data(), 1, 16, cs.data(), 8, model::RopeStyle::Normal);
    cpu::rope_angles(cs.data(), pk, inverse);
    cpu::rope(k.data(), 1, 16, cs.data(), 8, model::RopeStyle::Normal);
    double dot = 0.0;
    for (int i = 0; i < 16; ++i) dot += static_cast<double>(q[i]) * k[i];
    return dot;
  };
  EXPECT_NEAR(rotated_dot(5, 2), rotated_dot(105, 102), 1e-4);
}

TEST(OpsTest, RopeScaling) {
  model::ModelConfig c = rope_config(8, 8);
  const std::vector<double> plain = c.rope_inverse_frequencies(false, nullptr);
  c.rope_scaling = model::RopeScaling::Linear;
  c.rope_scale_factor = 4.0f;
  const std::vector<double> linear = c.rope_inverse_frequencies(false, nullptr);
  c.rope_scaling = model::RopeScaling::Llama3;
  const float factors[4] = {1.0f, 2.0f, 8.0f, 16.0f};
  const std::vector<double> llama3 = c.rope_inverse_frequencies(false, factors);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_DOUBLE_EQ(plain[i], std::pow(10000.0, -2.0 * static_cast<double>(i) / 8.0));
    EXPECT_DOUBLE_EQ(linear[i], plain[i] / 4.0);
    EXPECT_DOUBLE_EQ(llama3[i], plain[i] / factors[i]);
  }
}

// softmax(scale q.k_j) weighted sum of v_j, in double.
std::vector<double> naive_attention(const std::vector<float>& q, const std::vector<float>& keys,
                                    const std::vector<float>& values, int64_t n, int64_t stride, int64_t dim,
                                    double scale) {
  std::vector<double> scores(static_cast<size_t>(n));
  double max = -1e300;
  for (int64_t j = 0; j < n; ++j) {
    double s = 0.0;
    for (int64_t d = 0; d < dim; ++d) s += static_cast<double>(q[d]) * keys[j * stride + d];
    scores[j] = s * scale;
    max = std::max(max, scores[j]);
  }
  double sum = 0.0;
  for (double& s : scores) sum += (s = std::exp(s - max));
  std::vector<double> out(static_cast<size_t>(dim), 0.0);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t d = 0; d < dim; ++d) out[d] += scores[j] / sum * values[j * stride + d];
  return out;
}

TEST(OpsTest, AttentionF32AndF16MatchNaive) {
  // head_dim 20 exercises the 8-wide loop and its scalar tail; stride 40 places the head inside a wider row.
  constexpr int64_t kDim = 20, kStride = 40, kPositions = 37;
  const std::vector<float> q = test::random_normal(kDim, 8);
  std::vector<float> keys = test::random_normal(kPositions * kStride, 9), values = test::random_normal(kPositions * kStride, 10);
  std::vector<uint16_t> keys16(keys.size()), values16(values.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    keys16[i] = fp32_to_fp16(keys[i]);
    values16[i] = fp32_to_fp16(values[i]);
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(kDim));
  const std::vector<double> expected = naive_attention(q, keys, values, kPositions, kStride, kDim, scale);
  std::vector<float> out(kDim), scores(kPositions);
  const cpu::RowRange all{0, kPositions};
  cpu::attend(out.data(), q.data(), keys.data(), values.data(), {&all, 1}, kStride, kDim, static_cast<float>(scale),
              0.0f, scores.data());
  for (int64_t d = 0; d < kDim; ++d) EXPECT_NEAR(out[d], expected[d], 1e-5);

  // The f16 cache holds rounded keys and values: compare with the naive result on those.
  for (size_t i = 0; i < keys.size(); ++i) {
    keys[i] = fp16_to_fp32(keys16[i]);
    values[i] = fp16_to_fp32(values16[i]);
  }
  const std::vector<double> expected16 = naive_attention(q, keys, values, kPositions, kStride, kDim, scale);
  cpu::attend(out.data(), q.data(), keys16.data(), values16.data(), {&all, 1}, kStride, kDim, static_cast<float>(scale),
              0.0f, scores.data());
  for (int64_t d = 0; d < kDim; ++d) EXPECT_NEAR(out[d], expected16[d], 1e-5);
}

// Positions scattered over several ranges of rows, out of order (a ring that wraps past its last row, a paged
// block table): the same output, bit for bit, as the same rows laid out in order from row 0.
TEST(OpsTest, AttentionOverRangesEqualsTheRowsInOrder) {
  constexpr int64_t kDim = 16, kStride = 32, kPositions = 11, kRows = 20;
  const std::vector<cpu::RowRange> ranges = {{16, 3}, {2, 5}, {9, 1}, {0, 2}};
  const std::vector<float> q = test::random_normal(kDim, 15);
  const std::vector<float> keys = test::random_normal(kPositions * kStride, 16);
  const std::vector<float> values = test::random_normal(kPositions * kStride, 17);
  std::vector<float> scattered_keys = test::random_normal(kRows * kStride, 18), scattered_values = scattered_keys;
  int64_t j = 0;
  for (const cpu::RowRange& range : ranges)
    for (int64_t row = range.first; row < range.first + range.count; ++row, ++j) {
      std::copy_n(&keys[j * kStride], kStride, &scattered_keys[row * kStride]);
      std::copy_n(&values[j * kStride], kStride, &scattered_values[row * kStride]);
    }
  ASSERT_EQ(j, kPositions);
  std::vector<float> expected(kDim), out(kDim), scores(kPositions);
  const cpu::RowRange in_order{0, kPositions};
  cpu::attend(expected.data(), q.data(), keys.data(), values.data(), {&in_order, 1}, kStride, kDim, 0.25f, 5.0f,
              scores.data());
  cpu::attend(out.data(), q.data(), scattered_keys.data(), scattered_values.data(), ranges, kStride, kDim, 0.25f, 5.0f,
              scores.data());
  EXPECT_EQ(out, expected);
}

}  // namespace
}  // namespace rf
