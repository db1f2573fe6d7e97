// Matrix products on quantized blocks against the dequantized weights times f32 activations.
#include "backend/cpu/matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/vec_dot.h"
#include "quant/quant.h"
#include "random_normal.h"
#include "util/error.h"

namespace rf {
namespace {

class MatmulTest : public ::testing::TestWithParam<TensorType> {};

TEST_P(MatmulTest, MatchesDequantizedProduct) {
  const TensorType type = GetParam();
  constexpr int64_t kRows = 96, kCols = 2048, kTokens = 5;  // rows of two decoding pieces
  const std::vector<float> w = test::random_normal(kRows * kCols, 1);
  const std::vector<float> x = test::random_normal(kTokens * kCols, 2);
  const size_t row_bytes = rf::row_bytes(type, kCols);
  std::vector<uint8_t> blocks(row_bytes * kRows);
  quant::quantize(type, w.data(), blocks.data(), kRows, kCols);
  std::vector<float> dequantized(w.size());
  quant::dequantize(type, blocks.data(), dequantized.data(), kRows * kCols);

  cpu::ThreadPool pool(3);
  cpu::QuantizedRows input;
  input.set(x.data(), kTokens, kCols);
  std::vector<float> out(kTokens * kRows);
  cpu::matmul(pool, {type, blocks.data(), kRows, kCols, row_bytes}, input, out.data());

  // The activations are quantized to 8 bits for quantized weights: allow that noise, relative to the row norms.
  const double tolerance = type == TensorType::F32 || type == TensorType::F16 || type == TensorType::BF16 ? 1e-4 : 2e-2;
  std::vector<double> norms(kTokens * kRows);  // |w_r| |x_t|
  for (int64_t t = 0; t < kTokens; ++t) {
    for (int64_t r = 0; r < kRows; ++r) {
      double expected = 0.0, w_norm = 0.0, x_norm = 0.0;
      for (int64_t i = 0; i < kCols; ++i) {
        const double wi = dequantized[r * kCols + i], xi = x[t * kCols + i];
        expected += wi * xi;
        w_norm += wi * wi;
        x_norm += xi * xi;
      }
      norms[t * kRows + r] = std::sqrt(w_norm * x_norm);
      ASSERT_NEAR(out[t * kRows + r], expected, tolerance * norms[t * kRows + r]) << "token " << t << " row " << r;
    }
  }

  // A batch of one (decoding, which sums each row's pieces of 1024 columns) computes what the batch computed
  // for that row, to float rounding.
  std::vector<float> single(kRows);
  input.set(x.data() + 3 * kCols, 1, kCols);
  cpu::matmul(pool, {type, blocks.data(), kRows, kCols, row_bytes}, input, single.data());
  for (int64_t r = 0; r < kRows; ++r)
    EXPECT_NEAR(single[r], out[3 * kRows + r], 1e-5 * norms[3 * kRows + r]) << "row " << r;
}

INSTANTIATE_TEST_SUITE_P(Types, MatmulTest,
                         ::testing::Values(TensorType::F32, TensorType::F16, TensorType::BF16, TensorType::Q8_0,
                                           TensorType::Q4_0, TensorType::Q4_1, TensorType::Q5_0, TensorType::Q5_1,
                                           TensorType::Q2_K, TensorType::Q3_K, TensorType::Q4_K, TensorType::Q5_K,
                                           TensorType::Q6_K, TensorType::IQ4_NL, TensorType::IQ4_XS),
                         [](const ::testing::TestParamInfo<TensorType>& param) {
                           return std::string(tensor_type_name(param.param));
                         });

TEST(MatmulTest, ProductsSharingAnInputRunAsOne) {
  constexpr int64_t kCols = 256, kTokens = 3;
  const std::vector<float> x = test::random_normal(kTokens * kCols, 4);
  struct Weight {
    TensorType type;
    int64_t rows;
    std::vector<uint8_t> blocks;
  };
  std::vector<Weight> weights = {{TensorType::Q4_K, 40, {}}, {TensorType::Q6_K, 24, {}}, {TensorType::Q8_0, 8, {}}};
  for (Weight& w : weights) {
    const std::vector<float> values = test::random_normal(w.rows * kCols, static_cast<uint32_t>(w.rows));
    w.blocks.resize(row_bytes(w.type, kCols) * w.rows);
    quant::quantize(w.type, values.data(), w.blocks.data(), w.rows, kCols);
  }
  const auto matrix = [](const Weight& w) {
    return cpu::Matrix{w.type, w.blocks.data(), w.rows, kCols, row_bytes(w.type, kCols)};
  };
  cpu::ThreadPool pool(2);
  cpu::QuantizedRows input;
  input.set(x.data(), kTokens, kCols);
  std::vector<std::vector<float>> together(3), alone(3);
  std::vector<cpu::Product> products;
  for (size_t i = 0; i < 3; ++i) {
    together[i].resize(weights[i].rows * kTokens);
    alone[i].resize(weights[i].rows * kTokens);
    products.push_back({matrix(weights[i]), together[i].data()});
  }
  cpu::matmul(pool, products, input);
  for (size_t i = 0; i < 3; ++i) {
    cpu::matmul(pool, matrix(weights[i]), input, alone[i].data());
    EXPECT_EQ(together[i], alone[i]) << tensor_type_name(weights[i].type);
  }
}

TEST(QuantizedRowsTest, QuantizesOncePerActivationType) {
  // Q4_K and Q6_K both take Q8_K activations: the second matrix reuses the first one's quantized rows.
  const std::vector<float> x = test::random_normal(256, 3);
  cpu::ThreadPool pool(1);
  cpu::QuantizedRows input;
  input.set(x.data(), 1, 256);
  input.prepare(TensorType::Q4_K, pool);
  const uint8_t* for_q4k = input.quantized(TensorType::Q4_K);
  input.prepare(TensorType::Q6_K, pool);
  EXPECT_EQ(input.quantized(TensorType::Q6_K), for_q4k);
  EXPECT_THROW(input.quantized(TensorType::Q8_0), Error);
  input.prepare(TensorType::Q8_0, pool);
  EXPECT_NE(input.quantized(TensorType::Q8_0), for_q4k);
  input.set(x.data(), 1, 256);  // new rows: nothing is prepared
  EXPECT_THROW(input.quantized(TensorType::Q4_K), Error);
}

}  // namespace
}  // namespace rf
