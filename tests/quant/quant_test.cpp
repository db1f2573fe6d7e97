// Block layouts element by element: hand-built blocks with known values, exact round trips of values that lie
// on a type's grid, zero blocks, and errors for types ROCmForge does not compute with.
#include "quant/quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "quant/blocks.h"
#include "util/error.h"
#include "util/half.h"

namespace rf::quant {
namespace {

template <typename Block>
std::vector<float> dequantize_block(TensorType type, const Block& block) {
  std::vector<float> out(tensor_type_info(type).block_elements);
  dequantize(type, &block, out.data(), static_cast<int64_t>(out.size()));
  return out;
}

std::vector<uint8_t> quantize_values(TensorType type, const std::vector<float>& values) {
  std::vector<uint8_t> blocks(row_bytes(type, values.size()));
  quantize(type, values.data(), blocks.data(), 1, static_cast<int64_t>(values.size()));
  return blocks;
}

std::vector<float> round_trip(TensorType type, const std::vector<float>& values) {
  const std::vector<uint8_t> blocks = quantize_values(type, values);
  std::vector<float> out(values.size());
  dequantize(type, blocks.data(), out.data(), static_cast<int64_t>(out.size()));
  return out;
}

// ---- the supported set and its errors -------------------------------------------------------------------------

TEST(Quant, SupportedTypes) {
  EXPECT_EQ(supported_types().size(), 15u);
  for (TensorType type : supported_types()) EXPECT_TRUE(is_supported(type)) << tensor_type_name(type);
  for (TensorType type : {TensorType::Q8_1, TensorType::Q8_K, TensorType::IQ2_XXS, TensorType::I32, TensorType::MXFP4})
    EXPECT_FALSE(is_supported(type)) << tensor_type_name(type);
}

TEST(Quant, UnsupportedTypeErrorNamesTypeAndWhat) {
  try {
    require_supported(TensorType::IQ2_XXS, "tensor 'blk.0.attn_q.weight'");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("IQ2_XXS"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tensor 'blk.0.attn_q.weight'"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(require_supported(TensorType::Q4_K, "tensor 'x'"));
  float out[256];
  const uint8_t zeros[256] = {};
  EXPECT_THROW(dequantize(TensorType::IQ3_S, zeros, out, 256), Error);
  EXPECT_THROW(quantize(TensorType::TQ1_0, out, out, 1, 256), Error);
}

TEST(Quant, PartialBlocksAreErrors) {
  float values[64] = {};
  uint8_t blocks[64];
  EXPECT_THROW(dequantize(TensorType::Q4_0, blocks, values, 48), Error);
  EXPECT_THROW(quantize(TensorType::Q4_K, values, blocks, 1, 64), Error);
}

// ---- hand-built blocks ----------------------------------------------------------------------------------------

// An empty tensor (a GGUF may hold one) has no bytes, and its data pointer may be null: converting it does
// nothing (fuzz_gguf found memcpy called with null pointers; the sanitizer build checks this test).
TEST(Quant, EmptyRowsWithNullDataDoNothing) {
  for (const TensorType type : quant::supported_types()) {
    quant::dequantize(type, nullptr, nullptr, 0);
    quant::quantize(type, nullptr, nullptr, 0, 0);
  }
}

TEST(Quant, Q8_0Block) {
  BlockQ8_0 block;
  block.d = fp32_to_fp16(0.5f);
  for (int j = 0; j < 32; ++j) block.qs[j] = static_cast<int8_t>(-128 + 8 * j);
  const std::vector<float> x = dequantize_block(TensorType::Q8_0, block);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(x[j], 0.5f * static_cast<float>(-128 + 8 * j)) << j;
}

TEST(Quant, Q4_0Block) {
  BlockQ4_0 block;
  block.d = fp32_to_fp16(2.0f);
  for (int j = 0; j < 16; ++j) block.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const std::vector<float> x = dequantize_block(TensorType::Q4_0, block);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(x[j], 2.0f * static_cast<float>(j - 8)) << j;
    EXPECT_EQ(x[j + 16], 2.0f * static_cast<float>(7 - j)) << j;
  }
}

TEST(Quant, Q4_1Block) {
  BlockQ4_1 block;
  block.d = fp32_to_fp16(0.25f);
  block.m = fp32_to_fp16(-1.0f);
  for (int j = 0; j < 16; ++j) block.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const std::vector<float> x = dequantize_block(TensorType::Q4_1, block);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(x[j], 0.25f * static_cast<float>(j) - 1.0f) << j;
    EXPECT_EQ(x[j + 16], 0.25f * static_cast<float>(15 - j) - 1.0f) << j;
  }
}

// Bit j of the little-endian qh word is bit 4 of element j.
TEST(Quant, Q5_0Block) {
  BlockQ5_0 block;
  block.d = fp32_to_fp16(1.0f);
  const uint32_t qh = 0xA5F0C30Fu;
  std::memcpy(block.qh, &qh, 4);
  for (int j = 0; j < 16; ++j) block.qs[j] = static_cast<uint8_t>(j | (j << 4));
  const std::vector<float> x = dequantize_block(TensorType::Q5_0, block);
  for (int j = 0; j < 32; ++j) {
    const int q = (j % 16) | static_cast<int>(((qh >> j) & 1) << 4);
    EXPECT_EQ(x[j], static_cast<float>(q - 16)) << j;
  }
}

TEST(Quant, Q5_1Block) {
  BlockQ5_1 block;
  block.d = fp32_to_fp16(0.5f);
  block.m = fp32_to_fp16(3.0f);
  const uint32_t qh = 0x0000FFFFu;  // elements 0-15 high
  std::memcpy(block.qh, &qh, 4);
  for (int j = 0; j < 16; ++j) block.qs[j] = static_cast<uint8_t>(15 - j);
  const std::vector<float> x = dequantize_block(TensorType::Q5_1, block);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(x[j], 0.5f * static_cast<float>(16 + 15 - j) + 3.0f) << j;
    EXPECT_EQ(x[j + 16], 3.0f) << j;
  }
}

TEST(Quant, IQ4_NLBlock) {
  BlockIQ4_NL block;
  block.d = fp32_to_fp16(0.125f);
  for (int j = 0; j < 16; ++j) block.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const std::vector<float> x = dequantize_block(TensorType::IQ4_NL, block);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(x[j], 0.125f * kIQ4NLValues[j]) << j;
    EXPECT_EQ(x[j + 16], 0.125f * kIQ4NLValues[15 - j]) << j;
  }
}

// Sub-block j of 32 has the 6-bit scale[j] and min[j] below, spread over the 12 packed bytes as ggml packs
// them; element 64p + l is the low nibble of qs[32p + l], element 64p + 32 + l its high nibble.
TEST(Quant, Q4_KBlock) {
  BlockQ4_K block{};
  block.d = fp32_to_fp16(1.0f);
  block.dmin = fp32_to_fp16(0.5f);
  const int scale[8] = {1, 2, 3, 4, 37, 46, 55, 63};  // 4-7 use the packed high bits
  const int min[8] = {0, 2, 4, 6, 40, 50, 60, 17};
  for (int j = 0; j < 4; ++j) {
    block.scales[j] = static_cast<uint8_t>(scale[j] | ((scale[j + 4] >> 4) << 6));
    block.scales[j + 4] = static_cast<uint8_t>(min[j] | ((min[j + 4] >> 4) << 6));
    block.scales[j + 8] = static_cast<uint8_t>((scale[j + 4] & 0xF) | ((min[j + 4] & 0xF) << 4));
  }
  for (int i = 0; i < 128; ++i) block.qs[i] = static_cast<uint8_t>((i % 16) | ((i / 8 % 16) << 4));
  const std::vector<float> x = dequantize_block(TensorType::Q4_K, block);
  for (int e = 0; e < 256; ++e) {
    const int p = e / 64;
    const int l = e % 32;
    const bool high = e % 64 >= 32;
    const int byte = 32 * p + l;
    const int q = high ? byte / 8 % 16 : byte % 16;
    const int sub = e / 32;
    EXPECT_EQ(x[e], static_cast<float>(scale[sub] * q) - 0.5f * static_cast<float>(min[sub])) << e;
  }
}

// Element 128h + 32k + l: low 4 bits in ql[64h + 32(k & 1) + l] (high nibble for k >= 2), top 2 bits at
// bit 2k of qh[32h + l]; sub-blocks of 16 with signed 8-bit scales.
TEST(Quant, Q6_KBlock) {
  BlockQ6_K block{};
  block.d = fp32_to_fp16(0.25f);
  for (int s = 0; s < 16; ++s) block.scales[s] = static_cast<int8_t>(s % 2 ? -(s + 1) : s + 1);
  std::vector<int> level(256);
  for (int e = 0; e < 256; ++e) level[e] = (e * 7 + 3) % 64;
  for (int e = 0; e < 256; ++e) {
    const int h = e / 128;
    const int k = e % 128 / 32;
    const int l = e % 32;
    block.ql[64 * h + 32 * (k & 1) + l] |= static_cast<uint8_t>((level[e] & 0xF) << (k >= 2 ? 4 : 0));
    block.qh[32 * h + l] |= static_cast<uint8_t>((level[e] >> 4) << (2 * k));
  }
  const std::vector<float> x = dequantize_block(TensorType::Q6_K, block);
  for (int e = 0; e < 256; ++e)
    EXPECT_EQ(x[e], 0.25f * static_cast<float>(block.scales[e / 16] * (level[e] - 32))) << e;
}

// ---- exact round trips ----------------------------------------------------------------------------------------

TEST(Quant, FloatTypesRoundTripRepresentableValues) {
  std::vector<float> values;
  for (int k = -128; k < 128; ++k) values.push_back(static_cast<float>(k) / 8);
  EXPECT_EQ(round_trip(TensorType::F32, values), values);
  EXPECT_EQ(round_trip(TensorType::F16, values), values);
  EXPECT_EQ(round_trip(TensorType::BF16, values), values);
}

TEST(Quant, HalfTypesRoundToNearest) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> values(1024);
  for (float& v : values) v = normal(rng);
  const std::vector<float> f16 = round_trip(TensorType::F16, values);
  const std::vector<float> bf16 = round_trip(TensorType::BF16, values);
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(f16[i], fp16_to_fp32(fp32_to_fp16(values[i]))) << i;
    EXPECT_EQ(bf16[i], bf16_to_fp32(fp32_to_bf16(values[i]))) << i;
  }
}

// Values on a block's own grid (the extreme levels present, so absmax / min-max pick exactly that grid)
// come back unchanged.
TEST(Quant, LegacyTypesRoundTripValuesOnTheirGrid) {
  std::vector<float> symmetric(64);  // Q8_0: d = 0.5, levels -127..127
  for (int j = 0; j < 64; ++j) symmetric[j] = 0.5f * static_cast<float>((j * 37) % 255 - 127);
  symmetric[5] = -63.5f;
  symmetric[40] = 63.5f;
  EXPECT_EQ(round_trip(TensorType::Q8_0, symmetric), symmetric);

  for (auto [type, nmax] : {std::pair{TensorType::Q4_0, 8}, std::pair{TensorType::Q5_0, 16}}) {
    std::vector<float> values(64);  // d = -0.25, levels -nmax..nmax-1, largest magnitude at -nmax
    for (int j = 0; j < 64; ++j) values[j] = -0.25f * static_cast<float>((j * 5) % (2 * nmax) - nmax);
    EXPECT_EQ(round_trip(type, values), values) << tensor_type_name(type);
  }
  for (auto [type, nmax] : {std::pair{TensorType::Q4_1, 15}, std::pair{TensorType::Q5_1, 31}}) {
    std::vector<float> values(64);  // d = 0.5, m = -2, both ends of 0..nmax present in each block
    for (int j = 0; j < 64; ++j) values[j] = 0.5f * static_cast<float>((j * 7) % (nmax + 1)) - 2.0f;
    values[0] = values[32] = -2.0f;
    values[1] = values[33] = 0.5f * static_cast<float>(nmax) - 2.0f;
    EXPECT_EQ(round_trip(type, values), values) << tensor_type_name(type);
  }
}

TEST(Quant, ZerosStayZeroInEveryType) {
  const std::vector<float> zeros(512, 0.0f);
  for (TensorType type : supported_types()) {
    const std::vector<float> out = round_trip(type, zeros);
    for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], 0.0f) << tensor_type_name(type) << " element " << i;
  }
}

// Constant rows, positive-only rows and a single spike are where scale searches divide by zero or lose the
// minimum; every type must still come back finite and close.
TEST(Quant, DegenerateBlocksStayFiniteAndClose) {
  std::vector<std::vector<float>> cases;
  cases.emplace_back(256, 0.75f);
  std::vector<float> ramp(256);
  for (int i = 0; i < 256; ++i) ramp[i] = 1.0f + static_cast<float>(i) / 256;
  cases.push_back(ramp);
  std::vector<float> spike(256, 0.0f);
  spike[77] = -3.0f;
  cases.push_back(spike);
  for (TensorType type : supported_types()) {
    for (const std::vector<float>& values : cases) {
      const std::vector<float> out = round_trip(type, values);
      double max_abs = 0;
      double err = 0;
      for (size_t i = 0; i < values.size(); ++i) {
        ASSERT_TRUE(std::isfinite(out[i])) << tensor_type_name(type);
        max_abs = std::max(max_abs, std::fabs(static_cast<double>(values[i])));
        err = std::max(err, std::fabs(static_cast<double>(out[i]) - values[i]));
      }
      EXPECT_LE(err, 0.35 * max_abs) << tensor_type_name(type);
    }
  }
}

TEST(Quant, ParallelDequantizeMatchesSerial) {
  const int64_t n = (int64_t{5} << 20) + 32 * 7;  // enough for several threads, and an uneven split
  std::vector<float> values(static_cast<size_t>(n));
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> uniform(-1, 1);
  for (float& v : values) v = uniform(rng);
  std::vector<uint8_t> blocks(row_bytes(TensorType::Q8_0, static_cast<uint64_t>(n)));
  quantize(TensorType::Q8_0, values.data(), blocks.data(), 1, n);
  std::vector<float> serial(values.size());
  std::vector<float> parallel(values.size());
  dequantize(TensorType::Q8_0, blocks.data(), serial.data(), n);
  dequantize_parallel(TensorType::Q8_0, blocks.data(), parallel.data(), n, 3);
  EXPECT_EQ(serial, parallel);
}

}  // namespace
}  // namespace rf::quant
