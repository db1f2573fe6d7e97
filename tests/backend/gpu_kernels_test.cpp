// The GPU kernels one by one against CPU references on random data: products and dequantization for every
// weight type (the reference dequantizes with rf::quant and sums in double), and the norm, rotary, SwiGLU and
// attention kernels against the CPU backend's ops. Every test skips when no GPU is present.
#include <gtest/gtest.h>

#if ROCMFORGE_HAVE_GPU
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/vec_dot.h"
#include "backend/gpu/kernels.h"
#include "backend/gpu/products.h"
#include "backend/gpu/residency.h"
#include "backend/gpu/runtime.h"
#include "quant/blocks.h"
#include "quant/quant.h"
#include "random_normal.h"
#include "util/argmax.h"
#include "util/half.h"

namespace rf::gpu {
namespace {

class GpuKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!device_available()) GTEST_SKIP() << "no GPU";
    stream_ = std::make_unique<Stream>();
  }
  gpuStream_t stream() const { return stream_->get(); }
  void synchronize() const { stream_->synchronize(); }

 private:
  std::unique_ptr<Stream> stream_;
};

// A copy from pageable memory may return before it lands, and the tests' streams do not wait for the default one:
// the device is synchronized before the kernels read it.
void upload(void* device, const void* host, size_t bytes) {
  check(gpuMemcpy(device, host, bytes, gpuMemcpyHostToDevice), "test upload");
  check(gpuDeviceSynchronize(), "test upload");
}

template <typename T>
DeviceBuffer to_device(const std::vector<T>& host) {
  DeviceBuffer buffer(host.size() * sizeof(T), "test data");
  upload(buffer.data(), host.data(), buffer.bytes());
  return buffer;
}

template <typename T>
std::vector<T> to_host(const DeviceBuffer& buffer, size_t n) {
  std::vector<T> host(n);
  check(gpuMemcpy(host.data(), buffer.data(), n * sizeof(T), gpuMemcpyDeviceToHost), "test download");
  return host;
}

// ‖a - b‖ / ‖b‖ in double.
double relative_error(const std::vector<float>& a, const std::vector<double>& b) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  return std::sqrt(diff / norm);
}

// The activations a product with `weight_type` sees: for quantized weights the CPU backend's 8-bit form of
// x (cpu::quantize_activation), decoded; the GPU quantizes in the same blocks, so products agree with this up
// to summation order.
std::vector<float> activations_seen(TensorType weight_type, const std::vector<float>& x, int64_t cols) {
  if (activation_blocks(weight_type) == ActivationBlocks::None) return x;
  std::vector<float> seen(x.size());
  std::vector<uint8_t> row(cpu::activation_bytes(weight_type, cols));
  for (size_t first = 0; first < x.size(); first += static_cast<size_t>(cols)) {
    cpu::quantize_activation(weight_type, &x[first], row.data(), cols);
    if (cpu::activation_type(weight_type) == TensorType::Q8_K) {
      const auto* blocks = reinterpret_cast<const quant::BlockQ8_K*>(row.data());
      for (int64_t i = 0; i < cols; ++i) seen[first + i] = blocks[i / 256].d * blocks[i / 256].qs[i % 256];
    } else {
      quant::dequantize(TensorType::Q8_0, row.data(), &seen[first], cols);
    }
  }
  return seen;
}

// A random matrix stored as `type`, on the host (file layout) and on the device (device layout).
struct TestMatrix {
  TensorType type;
  int64_t rows;
  int64_t cols;
  std::vector<uint8_t> stored;
  std::vector<float> values;  // the stored matrix, dequantized on the CPU
  DeviceBuffer device;
  WeightView view() const { return weight_view(device.data(), type, rows, cols); }
};

TestMatrix make_matrix(TensorType type, int64_t rows, int64_t cols, gpuStream_t stream, uint32_t seed = 7) {
  TestMatrix m{type, rows, cols, {}, {}, {}};
  const std::vector<float> source =
      test::random_normal(static_cast<size_t>(rows * cols), seed + static_cast<uint32_t>(type));
  m.stored.resize(row_bytes(type, static_cast<uint64_t>(cols)) * static_cast<size_t>(rows));
  quant::quantize(type, source.data(), m.stored.data(), rows, cols);
  m.values.resize(source.size());
  quant::dequantize(type, m.stored.data(), m.values.data(), rows * cols);
  m.device = upload_weight(type, static_cast<uint64_t>(rows * cols), m.stored, stream);
  return m;
}

// y[b * rows + r] = dot(row r of the stored matrix, row b of x_seen), summed in double.
std::vector<double> reference_product(const TestMatrix& m, const std::vector<float>& x_seen, int64_t batch) {
  std::vector<double> y(static_cast<size_t>(batch * m.rows));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t r = 0; r < m.rows; ++r) {
      double sum = 0.0;
      for (int64_t c = 0; c < m.cols; ++c)
        sum += static_cast<double>(m.values[r * m.cols + c]) * x_seen[b * m.cols + c];
      y[b * m.rows + r] = sum;
    }
  return y;
}

// `batch` rows of x on the device, with the 8-bit form products with `type` weights read where they read one.
struct TestInput {
  TestInput(TensorType type, const std::vector<float>& x, int64_t batch, int64_t cols, gpuStream_t stream)
      : f32(to_device(x)),
        q(x.size(), "q"),
        scales(x.size() / kActivationBlock * sizeof(ActivationScale), "scales") {
    input.f32 = f32.as<float>();
    const ActivationBlocks blocks = activation_blocks(type);
    if (blocks == ActivationBlocks::None) return;
    quantize_rows(blocks, input.f32, batch, cols, q.as<int8_t>(), scales.as<ActivationScale>(), nullptr, stream);
    input.q = q.as<int8_t>();
    input.scales = scales.as<ActivationScale>();
  }
  DeviceBuffer f32;
  DeviceBuffer q;
  DeviceBuffer scales;
  ProductInput input;
};

class GpuWeightTypes : public GpuKernels, public ::testing::WithParamInterface<TensorType> {};

TEST_P(GpuWeightTypes, MatvecMatchesDequantizedProduct) {
  const TensorType type = GetParam();
  // 37 rows: not a multiple of the rows per thread block, and odd (one activation row of quantized weights takes two
  // rows a group of lanes: the last group's second row lies past the end). 1024 columns: several slices per lane;
  // 4096 (16 super-blocks): a whole team per row for one activation row, and for f32 activations a batch of 3 is
  // 48 KiB, just past what the staging takes (staged, it had failed to launch); 4864 (19 super-blocks): two teams
  // per row for one activation row, a group of 16 lanes for a batch, whose lanes get unequal shares, some none in
  // their second round; 9472 (37 super-blocks): two teams per row at every batch.
  for (const int64_t cols : {1024, 4096, 4864, 9472}) {
    const TestMatrix m = make_matrix(type, 37, cols, stream());
    for (int batch = 1; batch <= kMaxMatvecBatch; ++batch) {
      const std::vector<float> x = test::random_normal(static_cast<size_t>(batch * m.cols), 100 + batch);
      const std::vector<double> expected = reference_product(m, activations_seen(type, x, m.cols), batch);
      const TestInput input(type, x, batch, m.cols, stream());
      // Accumulating onto a known start checks that every output is written once, and only once.
      const std::vector<float> start(expected.size(), 1.0f);
      const DeviceBuffer y = to_device(start);
      const MatvecSegment segment{m.view(), m.rows, y.as<float>()};
      matvec(type, {&segment, 1}, m.cols, input.input, batch, true, stream());
      synchronize();
      std::vector<float> got = to_host<float>(y, expected.size());
      for (float& value : got) value -= 1.0f;
      EXPECT_LT(relative_error(got, expected), 1e-5)
          << tensor_type_name(type) << " batch " << batch << ", " << cols << " columns";
    }
  }
}

// The tensor-core products, at every batch. 37 rows: one partial row tile; 200: several. 256 columns: one K tile,
// never split; 1024, 4864: K split over thread blocks (19 tiles: unequal splits); 1056 (for blocks of 32): a partial
// last K tile. Batches of 1 to 130 take column tiles of 8, 16, 32 and 64 rows, the last partial.
TEST_P(GpuWeightTypes, MatmulQ8MatchesDequantizedProduct) {
  const TensorType type = GetParam();
  if (!has_matmul_q8(type)) GTEST_SKIP() << "no 8-bit tensor-core products for " << tensor_type_name(type);
  const TileScratch scratch;
  std::vector<int64_t> widths = {256, 1024, 4864};
  if (tensor_type_info(type).block_elements == 32) widths.push_back(1056);
  for (const int64_t rows : {37, 200})
    for (const int64_t cols : widths) {
      const TestMatrix m = make_matrix(type, rows, cols, stream());
      for (const int batch : {1, 5, 9, 16, 17, 33, 64, 130}) {
        const std::vector<float> x = test::random_normal(static_cast<size_t>(batch * m.cols), 300 + batch);
        const std::vector<double> expected = reference_product(m, activations_seen(type, x, m.cols), batch);
        const TestInput input(type, x, batch, m.cols, stream());
        // Accumulating onto a known start checks that every output is written once, and only once.
        const std::vector<float> start(expected.size(), 1.0f);
        const DeviceBuffer y = to_device(start);
        matmul_q8(type, {m.view(), m.rows, y.as<float>()}, m.cols, input.input, batch, true, scratch, stream());
        synchronize();
        std::vector<float> got = to_host<float>(y, expected.size());
        for (float& value : got) value -= 1.0f;
        EXPECT_LT(relative_error(got, expected), 1e-5)
            << tensor_type_name(type) << " batch " << batch << ", " << rows << " x " << cols;
      }
    }
}

// A row's products are the same bits whatever the rows beside it where the pass asks for that
// (ProductPolicy::BatchInvariant, paged passes): each row of a batch against the same row alone, at the widths of a
// small model (128: part of one K tile; 384) and larger ones (512: K split in two; 4864: in 19), with rows of part of
// a tile. Batches of 2 and the rows alone of the K-quants and IQ4_XS go by the matrix-vector pass in tile order, larger
// batches by tiles.
TEST_F(GpuKernels, ProductsOfARowDoNotDependOnTheBatch) {
  for (const TensorType type : {TensorType::F32, TensorType::F16, TensorType::Q8_0, TensorType::Q4_K, TensorType::Q5_K,
                                TensorType::Q6_K, TensorType::IQ4_XS})
    for (const int64_t cols : {128, 384, 512, 4864}) {
      if (cols % tensor_type_info(type).block_elements != 0) continue;
      for (const int64_t batch : {2, 3, 9, 64}) {
        const TestMatrix m = make_matrix(type, 72, cols, stream());
        const DeviceMatrix weight{type, m.view(), m.rows, m.cols};
        const std::vector<float> x = test::random_normal(static_cast<size_t>(batch * m.cols), 11);
        Products products(m.rows * m.cols);
        ActivationRows rows(batch, m.cols, ProductPolicy::BatchInvariant);
        // y for rows first .. first + n - 1 of x.
        const auto multiply = [&](int64_t first, int64_t n) {
          upload(rows.f32(), x.data() + first * m.cols, static_cast<size_t>(n * m.cols) * sizeof(float));
          const DeviceBuffer y(static_cast<size_t>(n * m.rows) * sizeof(float), "y");
          rows.changed();
          const Products::Target target{weight, y.as<float>()};
          products.multiply({&target, 1}, rows, n, false, stream());
          synchronize();
          return to_host<float>(y, static_cast<size_t>(n * m.rows));
        };
        const std::vector<float> batched = multiply(0, batch);
        float largest = 0.0f, difference = 0.0f;
        for (int64_t b = 0; b < batch; ++b) {
          const std::vector<float> alone = multiply(b, 1);
          for (int64_t r = 0; r < m.rows; ++r) {
            largest = std::max(largest, std::fabs(alone[r]));
            difference = std::max(difference, std::fabs(alone[r] - batched[b * m.rows + r]));
          }
        }
        EXPECT_EQ(difference, 0.0f) << tensor_type_name(type) << ", " << cols << " columns, batch " << batch
                                    << ": " << difference / largest << " of the largest output";
      }
    }
}

// Three matrices in one launch, with more rows than one wave of thread blocks covers and segment boundaries
// inside a thread block's rows; Q4_K at a width that goes by chunks (256) and at one that goes by slices (2304),
// where these rows take four rows a group of lanes either way.
TEST_F(GpuKernels, MatvecCoversRoundsAndSegments) {
  using Case = std::pair<TensorType, int64_t>;  // weight type, columns
  for (const auto& [type, cols] : {Case{TensorType::Q4_K, 256}, Case{TensorType::Q4_K, 2304},
                                    Case{TensorType::Q6_K, 256}, Case{TensorType::F16, 256}}) {
    const int64_t rows[kMaxMatvecSegments] = {9001, 11003, 7005};
    std::vector<TestMatrix> matrices;
    for (const int64_t r : rows) matrices.push_back(make_matrix(type, r, cols, stream()));
    for (const int batch : {1, 3}) {
      const std::vector<float> x = test::random_normal(static_cast<size_t>(batch * cols), 200 + batch);
      const std::vector<float> x_seen = activations_seen(type, x, cols);
      const DeviceBuffer x_device = to_device(x);
      DeviceBuffer q(x.size(), "q");
      DeviceBuffer scales(x.size() / kActivationBlock * sizeof(ActivationScale), "scales");
      ProductInput input;
      input.f32 = x_device.as<float>();
      if (activation_blocks(type) != ActivationBlocks::None) {
        quantize_rows(activation_blocks(type), input.f32, batch, cols, q.as<int8_t>(), scales.as<ActivationScale>(),
                      nullptr, stream());
        input.q = q.as<int8_t>();
        input.scales = scales.as<ActivationScale>();
      }
      std::vector<DeviceBuffer> outputs;
      std::vector<MatvecSegment> segments;
      for (const TestMatrix& m : matrices) {
        outputs.emplace_back(static_cast<size_t>(batch * m.rows) * sizeof(float), "y");
        segments.push_back({m.view(), m.rows, outputs.back().as<float>()});
      }
      matvec(type, segments, cols, input, batch, false, stream());
      synchronize();
      for (size_t s = 0; s < matrices.size(); ++s) {
        const TestMatrix& m = matrices[s];
        std::vector<double> expected(static_cast<size_t>(batch * m.rows));
        for (int b = 0; b < batch; ++b)
          for (int64_t r = 0; r < m.rows; ++r) {
            double sum = 0.0;
            for (int64_t c = 0; c < cols; ++c) sum += static_cast<double>(m.values[r * cols + c]) * x_seen[b * cols + c];
            expected[b * m.rows + r] = sum;
          }
        EXPECT_LT(relative_error(to_host<float>(outputs[s], expected.size()), expected), 1e-5)
            << tensor_type_name(type) << " batch " << batch << ", " << cols << " columns, segment " << s;
      }
    }
  }
}

// q and k in one type and v in another in one launch (the _M mixes' v): every output equals, bit for bit, what
// a launch per type gives; at widths that go by slices (4096) and by chunks (2048, where q + k have rows enough
// for four rows a group of lanes on a device of up to 144 multiprocessors). A pair without such a kernel
// launches nothing.
TEST_F(GpuKernels, MatvecTakesTwoTypesInOneLaunch) {
  const std::pair<TensorType, TensorType> pairs[] = {{TensorType::Q4_K, TensorType::Q6_K},
                                                     {TensorType::Q5_K, TensorType::Q6_K}};
  for (const auto& [type, last_type] : pairs) {
    for (const int64_t cols : {2048, 4096}) {
      const TestMatrix q = make_matrix(type, cols == 2048 ? 8209 : 1031, cols, stream());
      const TestMatrix k = make_matrix(type, 1021, cols, stream());
      const TestMatrix v = make_matrix(last_type, 1021, cols, stream());
      const std::vector<float> x = test::random_normal(static_cast<size_t>(cols), 300);
      const DeviceBuffer x_device = to_device(x);
      DeviceBuffer levels(x.size(), "q");
      DeviceBuffer scales(x.size() / kActivationBlock * sizeof(ActivationScale), "scales");
      quantize_rows(activation_blocks(type), x_device.as<float>(), 1, cols, levels.as<int8_t>(),
                    scales.as<ActivationScale>(), nullptr, stream());
      const ProductInput input{x_device.as<float>(), levels.as<int8_t>(), scales.as<ActivationScale>(), nullptr};
      const auto outputs = [&](bool together) {
        std::vector<DeviceBuffer> y;
        for (const TestMatrix* m : {&q, &k, &v}) y.emplace_back(static_cast<size_t>(m->rows) * sizeof(float), "y");
        const MatvecSegment first[] = {{q.view(), q.rows, y[0].as<float>()}, {k.view(), k.rows, y[1].as<float>()}};
        const MatvecSegment last{v.view(), v.rows, y[2].as<float>()};
        if (together) {
          EXPECT_TRUE(matvec_two_types(type, first, last_type, last, cols, input, false, stream()));
        } else {
          matvec(type, first, cols, input, 1, false, stream());
          matvec(last_type, {&last, 1}, cols, input, 1, false, stream());
        }
        synchronize();
        std::vector<std::vector<float>> host;
        for (size_t i = 0; i < y.size(); ++i) host.push_back(to_host<float>(y[i], static_cast<size_t>(y[i].bytes() / 4)));
        return host;
      };
      EXPECT_EQ(outputs(true), outputs(false)) << tensor_type_name(type) << " + " << tensor_type_name(last_type)
                                              << ", " << cols << " columns";
    }
  }
  const TestMatrix m = make_matrix(TensorType::Q8_0, 64, 256, stream());
  const MatvecSegment segment{m.view(), m.rows, nullptr};
  EXPECT_FALSE(matvec_two_types(TensorType::Q8_0, {&segment, 1}, TensorType::Q6_K, segment, 256, {}, false, stream()));
}

TEST_P(GpuWeightTypes, DequantizeAndEmbedMatchCpu) {
  const TensorType type = GetParam();
  // Rows 2 .. 10 of 2048 values: several thread blocks' tiles for every type, the last one partial.
  const TestMatrix m = make_matrix(type, 11, 2048, stream());
  constexpr int64_t kFirstRow = 2, kRows = 9;
  DeviceBuffer half_rows(static_cast<size_t>(kRows * m.cols) * sizeof(uint16_t), "f16 rows");
  dequantize_to_f16(type, m.view(), m.cols, kFirstRow, kRows, half_rows.as<uint16_t>(), stream());
  const std::vector<int32_t> tokens{5, 0, 10};
  const DeviceBuffer tokens_device = to_device(tokens);
  DeviceBuffer embedded(static_cast<size_t>(3 * m.cols) * sizeof(float), "embeddings");
  embed_tokens(type, m.view(), m.cols, tokens_device.as<int32_t>(), 3, embedded.as<float>(), stream());
  synchronize();

  const std::vector<uint16_t> halves = to_host<uint16_t>(half_rows, static_cast<size_t>(kRows * m.cols));
  for (int64_t i = 0; i < kRows * m.cols; ++i) {
    const float expected = m.values[kFirstRow * m.cols + i];
    ASSERT_NEAR(fp16_to_fp32(halves[i]), expected, 1e-3 * std::fabs(expected) + 1e-6)
        << tensor_type_name(type) << " element " << i;
  }
  const std::vector<float> rows = to_host<float>(embedded, static_cast<size_t>(3 * m.cols));
  for (int t = 0; t < 3; ++t)
    for (int64_t c = 0; c < m.cols; ++c) {
      const float expected = m.values[tokens[t] * m.cols + c];
      ASSERT_NEAR(rows[t * m.cols + c], expected, 1e-6 * std::fabs(expected) + 1e-7)
          << tensor_type_name(type) << " token " << t << " column " << c;
    }
}

std::vector<TensorType> kernel_types() {
  std::vector<TensorType> types;
  for (const TensorType type : quant::supported_types())
    if (has_kernels(type)) types.push_back(type);
  return types;
}

std::string type_name(const ::testing::TestParamInfo<TensorType>& param) {
  return std::string(tensor_type_name(param.param));
}

INSTANTIATE_TEST_SUITE_P(AllTypes, GpuWeightTypes, ::testing::ValuesIn(kernel_types()), type_name);

TEST(GpuKernelCoverage, EverySupportedTypeHasKernels) {
  for (const TensorType type : quant::supported_types()) EXPECT_TRUE(has_kernels(type)) << tensor_type_name(type);
}

TEST_F(GpuKernels, RmsnormMatchesCpu) {
  const int64_t rows = 3, cols = 4096;
  const std::vector<float> x = test::random_normal(static_cast<size_t>(rows * cols), 1);
  const std::vector<float> weight = test::random_normal(static_cast<size_t>(cols), 2);
  const DeviceBuffer x_device = to_device(x);
  const DeviceBuffer w_device = to_device(weight);
  DeviceBuffer out(x.size() * sizeof(float), "out");
  ActivationOutput output;
  output.f32 = out.as<float>();
  rmsnorm(x_device.as<float>(), w_device.as<float>(), rows, cols, 1e-5f, output, stream());
  synchronize();
  const std::vector<float> got = to_host<float>(out, x.size());
  std::vector<float> expected(x.size());
  for (int64_t r = 0; r < rows; ++r) cpu::rmsnorm(&expected[r * cols], &x[r * cols], weight.data(), cols, 1e-5f);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(got[i], expected[i], 1e-4f * std::fabs(expected[i]) + 1e-6f) << i;
}

// The first of equal largest values (index_of_largest) however a row is shared out among the kernel's threads: ties
// between threads, warps and one thread's rounds of loads, rows shorter than the threads and as long as Llama 3's
// vocabulary, a row of one value repeated, and a row of -infinity.
TEST_F(GpuKernels, ArgmaxRowsTakesTheFirstLargest) {
  for (const int64_t cols : {1, 7, 1000, 1024, 1025, 8195, 128256}) {
    SCOPED_TRACE(cols);
    const auto width = static_cast<size_t>(cols);
    std::vector<float> x;
    const auto planted = [&](uint32_t seed, std::initializer_list<int64_t> positions) {
      std::vector<float> row = test::random_normal(width, seed);
      for (const int64_t p : positions)
        if (p < cols) row[static_cast<size_t>(p)] = 10.0f;
      x.insert(x.end(), row.begin(), row.end());
    };
    planted(1, {});
    planted(2, {cols - 1, cols / 2, cols / 3, 1});
    planted(3, {cols / 5 + 8192, cols / 5 + 1024, cols / 5});
    x.insert(x.end(), width, 0.5f);
    x.insert(x.end(), width, -std::numeric_limits<float>::infinity());
    const int64_t rows = static_cast<int64_t>(x.size()) / cols;
    const DeviceBuffer x_device = to_device(x);
    DeviceBuffer out(static_cast<size_t>(rows) * sizeof(int32_t), "out");
    argmax_rows(x_device.as<float>(), rows, cols, out.as<int32_t>(), stream());
    synchronize();
    const std::vector<int32_t> got = to_host<int32_t>(out, static_cast<size_t>(rows));
    for (size_t r = 0; r < got.size(); ++r)
      EXPECT_EQ(got[r], index_of_largest(std::span(x).subspan(r * width, width))) << "row " << r;
  }
}

TEST_F(GpuKernels, SwigluMatchesCpu) {
  std::vector<float> gate = test::random_normal(1024, 3);
  const std::vector<float> up = test::random_normal(1024, 4);
  DeviceBuffer gate_device = to_device(gate);
  const DeviceBuffer up_device = to_device(up);
  ActivationOutput output;
  output.f32 = gate_device.as<float>();
  activate(Activation::Silu, gate_device.as<float>(), up_device.as<float>(), 4, 256, output, stream());
  synchronize();
  const std::vector<float> got = to_host<float>(gate_device, gate.size());
  cpu::swiglu(gate.data(), up.data(), static_cast<int64_t>(gate.size()));
  for (size_t i = 0; i < gate.size(); ++i) ASSERT_NEAR(got[i], gate[i], 1e-5f * std::fabs(gate[i]) + 1e-6f) << i;
}

std::vector<double> times(const TestMatrix& m, const std::vector<double>& x) {
  std::vector<double> y(static_cast<size_t>(m.rows), 0.0);
  for (int64_t r = 0; r < m.rows; ++r)
    for (int64_t c = 0; c < m.cols; ++c) y[r] += m.values[r * m.cols + c] * x[c];
  return y;
}

std::vector<double> rms_normalized(const std::vector<double>& x, const std::vector<float>& weight, float eps) {
  double squares = 0.0;
  for (const double v : x) squares += v * v;
  const double scale = 1.0 / std::sqrt(squares / static_cast<double>(x.size()) + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * scale * weight[i];
  return y;
}

// One decode step's products after the attention as product_chain runs them, against the same steps in double:
// the output projection added to the residual stream, the normalized stream through gate and up into SwiGLU, down
// added to the stream, and q, k and v of the normalized stream. `width` is the stream's, `attention` the attention
// output's, `hidden` the feed-forward block's.
void check_product_chain(TensorType type, int64_t width, int64_t attention, int64_t hidden, gpuStream_t stream) {
  const float eps = 1e-5f;
  const TestMatrix o = make_matrix(type, width, attention, stream, 11);
  const TestMatrix gate = make_matrix(type, hidden, width, stream, 12);
  const TestMatrix up = make_matrix(type, hidden, width, stream, 13);
  const TestMatrix down = make_matrix(type, width, hidden, stream, 14);
  const TestMatrix q = make_matrix(type, width, width, stream, 15);
  const TestMatrix k = make_matrix(type, width / 4, width, stream, 16);
  const TestMatrix v = make_matrix(type, width / 4, width, stream, 17);
  const std::vector<float> stream_in = test::random_normal(static_cast<size_t>(width), 18);
  const std::vector<float> attention_out = test::random_normal(static_cast<size_t>(attention), 19);
  const std::vector<float> ffn_norm = test::random_normal(static_cast<size_t>(width), 20);
  const std::vector<float> attn_norm = test::random_normal(static_cast<size_t>(width), 21);

  const DeviceBuffer a_device = to_device(attention_out);
  const DeviceBuffer x_device = to_device(stream_in);
  const DeviceBuffer ffn_norm_device = to_device(ffn_norm);
  const DeviceBuffer attn_norm_device = to_device(attn_norm);
  DeviceBuffer hidden_device(static_cast<size_t>(hidden) * sizeof(float), "hidden");
  DeviceBuffer q_device(static_cast<size_t>(q.rows) * sizeof(float), "q");
  DeviceBuffer k_device(static_cast<size_t>(k.rows) * sizeof(float), "k");
  DeviceBuffer v_device(static_cast<size_t>(v.rows) * sizeof(float), "v");
  DeviceBuffer arrivals(sizeof(unsigned), "arrivals");
  check(gpuMemsetAsync(arrivals.data(), 0, sizeof(unsigned), stream), "test clear");

  ProductChain chain;
  chain.type = type;
  chain.eps = eps;
  chain.steps = 4;
  chain.step[0] = {a_device.as<float>(), nullptr, attention, ChainOutput::Accumulate, 1, {o.device.data()},
                   {width}, {x_device.as<float>()}};
  chain.step[1] = {x_device.as<float>(), ffn_norm_device.as<float>(), width, ChainOutput::Swiglu, 2,
                   {gate.device.data(), up.device.data()}, {hidden, hidden}, {hidden_device.as<float>(), nullptr}};
  chain.step[2] = {hidden_device.as<float>(), nullptr, hidden, ChainOutput::Accumulate, 1, {down.device.data()},
                   {width}, {x_device.as<float>()}};
  chain.step[3] = {x_device.as<float>(), attn_norm_device.as<float>(), width, ChainOutput::Store, 3,
                   {q.device.data(), k.device.data(), v.device.data()}, {q.rows, k.rows, v.rows},
                   {q_device.as<float>(), k_device.as<float>(), v_device.as<float>()}};
  if (!product_chain_runs(chain)) GTEST_SKIP() << "this device runs no product chains";
  product_chain(chain, arrivals.as<unsigned>(), stream);
  check(gpuStreamSynchronize(stream), "test chain");

  std::vector<double> x(stream_in.begin(), stream_in.end());
  const std::vector<double> projected = times(o, std::vector<double>(attention_out.begin(), attention_out.end()));
  for (int64_t i = 0; i < width; ++i) x[i] += projected[i];
  const std::vector<double> normalized = rms_normalized(x, ffn_norm, eps);
  const std::vector<double> g = times(gate, normalized), u = times(up, normalized);
  std::vector<double> swiglu_out(static_cast<size_t>(hidden));
  for (int64_t i = 0; i < hidden; ++i) swiglu_out[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
  const std::vector<double> down_out = times(down, swiglu_out);
  for (int64_t i = 0; i < width; ++i) x[i] += down_out[i];
  const std::vector<double> attn_in = rms_normalized(x, attn_norm, eps);

  const auto expect_close = [](const DeviceBuffer& got, const std::vector<double>& expected, const char* what) {
    EXPECT_LT(relative_error(to_host<float>(got, expected.size()), expected), 1e-5) << what;
  };
  expect_close(hidden_device, swiglu_out, "silu(gate) * up");
  expect_close(x_device, x, "residual stream");
  expect_close(q_device, times(q, attn_in), "q");
  expect_close(k_device, times(k, attn_in), "k");
  expect_close(v_device, times(v, attn_in), "v");
}

// The two shapes take every number of rows that a stage holds (16 rows of 1024 values, 8 of 2048, 4 of 3072 or
// 4096, 2 of 8192, 1 of 9216).
TEST_F(GpuKernels, ProductChainMatchesCpu) {
  check_product_chain(TensorType::F16, 1024, 8192, 9216, stream());
  check_product_chain(TensorType::BF16, 4096, 2048, 3072, stream());
}

// The 8-bit forms are the CPU backend's, level for level: Q8_0 for a 32-element weight type, Q8_K for a
// K-quant. Values span several magnitudes so that every block has its own scale.
TEST_F(GpuKernels, QuantizedActivationsMatchCpu) {
  const int64_t rows = 3, cols = 1024;
  std::vector<float> x = test::random_normal(static_cast<size_t>(rows * cols), 5);
  for (size_t i = 0; i < x.size(); ++i) x[i] *= std::ldexp(1.0f, static_cast<int>(i / 256 % 5) - 2);
  const DeviceBuffer x_device = to_device(x);
  for (const TensorType weight_type : {TensorType::Q4_0, TensorType::Q4_K}) {
    DeviceBuffer q(x.size(), "q");
    DeviceBuffer scales(x.size() / kActivationBlock * sizeof(ActivationScale), "scales");
    quantize_rows(activation_blocks(weight_type), x_device.as<float>(), rows, cols, q.as<int8_t>(),
                  scales.as<ActivationScale>(), nullptr, stream());
    synchronize();
    const std::vector<int8_t> levels = to_host<int8_t>(q, x.size());
    const std::vector<ActivationScale> got_scales = to_host<ActivationScale>(scales, x.size() / kActivationBlock);
    std::vector<uint8_t> expected(cpu::activation_bytes(weight_type, cols));
    for (int64_t r = 0; r < rows; ++r) {
      cpu::quantize_activation(weight_type, &x[r * cols], expected.data(), cols);
      for (int64_t i = 0; i < cols; ++i) {
        const int64_t e = r * cols + i;
        const ActivationScale& scale = got_scales[e / kActivationBlock];
        int expected_level;
        float expected_d;
        if (weight_type == TensorType::Q4_K) {
          const auto& block = reinterpret_cast<const quant::BlockQ8_K*>(expected.data())[i / 256];
          expected_level = block.qs[i % 256];
          expected_d = block.d;
        } else {
          const auto& block = reinterpret_cast<const quant::BlockQ8_0*>(expected.data())[i / 32];
          expected_level = block.qs[i % 32];
          expected_d = fp16_to_fp32(block.d);
        }
        ASSERT_EQ(levels[e], expected_level) << tensor_type_name(weight_type) << " element " << e;
        ASSERT_EQ(scale.d, expected_d) << tensor_type_name(weight_type) << " element " << e;
        int sum = 0;
        for (int64_t j = e / 16 * 16; j < e / 16 * 16 + 16; ++j) sum += levels[j];
        ASSERT_EQ(scale.sum[e / 16 % 2], sum) << tensor_type_name(weight_type) << " element " << e;
      }
    }
  }
}

// A small model configuration for the rotary and attention kernels: by default 8 query heads sharing 2 kv
// heads.
model::ModelConfig attention_config(model::RopeStyle style, int64_t n_heads = 8, int64_t n_kv_heads = 2,
                                    int64_t head_dim = 64) {
  model::ModelConfig c;
  c.n_heads = n_heads;
  c.n_kv_heads = n_kv_heads;
  c.head_dim = head_dim;
  c.n_embd = c.n_heads * c.head_dim;
  c.rope_dims = head_dim * 3 / 4;  // fewer than head_dim: the tail passes through
  c.rope_base = 10000.0f;
  c.rope_style = style;
  return c;
}

AttentionShape shape_of(const model::ModelConfig& c) {
  return {c.n_heads, c.n_kv_heads, c.head_dim, c.rope_dims / 2, c.rope_style == model::RopeStyle::NeoX,
          1.0f / std::sqrt(static_cast<float>(c.head_dim))};
}

// A cache of `context` random rows, and one partials buffer for every decoding run on it, as a transformer
// keeps one for all its layers and steps: each run must leave the buffer's counters as it found them. With
// `extras`, decoding also adds q/k/v biases and normalizes the q and k heads (QkvExtras) before it rotates them.
class AttentionCheck {
 public:
  AttentionCheck(const model::ModelConfig& c, int64_t context, gpuStream_t stream, bool extras = false)
      : c_(c),
        extras_(extras),
        shape_(shape_of(c)),
        context_(context),
        stream_(stream),
        partials_(static_cast<size_t>(attention_partials_floats(shape_, context)) * sizeof(float), "partials") {
    const std::vector<float> cache_values = test::random_normal(static_cast<size_t>(2 * context * shape_.kv_dim()), 14);
    key_cache_.resize(static_cast<size_t>(context * shape_.kv_dim()));
    value_cache_.resize(key_cache_.size());
    for (size_t i = 0; i < key_cache_.size(); ++i) {
      key_cache_[i] = fp32_to_fp16(cache_values[i]);
      value_cache_[i] = fp32_to_fp16(cache_values[key_cache_.size() + i]);
    }
    check(gpuMemsetAsync(partials_.data(), 0, partials_.bytes(), stream), "clearing the partials");
  }

  // Tokens at positions `position`.. attend over the cache; the GPU's rotation, cache write and attention
  // are compared with the CPU's rope and attend. Decoding (one launch that also rotates and stores the token)
  // runs once for each form of its output, each time from the cache as it was before the token: f32 only,
  // and with the 8-bit form of a Q4_0 and of a Q4_K consumer, which must be, level for level, what
  // quantize_rows makes of the f32 output.
  void run(int64_t position, int64_t n_tokens) const {
    const int64_t q_dim = shape_.q_dim(), kv_dim = shape_.kv_dim();
    const auto seed = static_cast<uint32_t>(position);
    const std::vector<float> q = test::random_normal(static_cast<size_t>(n_tokens * q_dim), 11 + seed);
    const std::vector<float> k = test::random_normal(static_cast<size_t>(n_tokens * kv_dim), 12 + seed);
    const std::vector<float> v = test::random_normal(static_cast<size_t>(n_tokens * kv_dim), 13 + seed);
    const bool with_extras = extras_ && n_tokens == 1;
    const std::vector<float> q_bias = test::random_normal(static_cast<size_t>(q_dim), 15 + seed);
    const std::vector<float> k_bias = test::random_normal(static_cast<size_t>(kv_dim), 16 + seed);
    const std::vector<float> v_bias = test::random_normal(static_cast<size_t>(kv_dim), 17 + seed);
    std::vector<float> q_norm = test::random_normal(static_cast<size_t>(c_.head_dim), 18 + seed, 0.2f);
    std::vector<float> k_norm = test::random_normal(static_cast<size_t>(c_.head_dim), 19 + seed, 0.2f);
    for (float& w : q_norm) w += 1.0f;
    for (float& w : k_norm) w += 1.0f;
    constexpr float kEps = 1e-6f;

    // CPU: biases and head norms where asked, rotate, store as f16, attend.
    const std::vector<double> inverse = c_.rope_inverse_frequencies(false, nullptr);
    std::vector<float> q_cpu = q, k_cpu = k, v_cpu = v;
    if (with_extras) {
      cpu::add_rows(q_cpu.data(), q_bias.data(), 1, q_dim);
      cpu::add_rows(k_cpu.data(), k_bias.data(), 1, kv_dim);
      cpu::add_rows(v_cpu.data(), v_bias.data(), 1, kv_dim);
      for (int64_t h = 0; h < c_.n_heads; ++h)
        cpu::rmsnorm(&q_cpu[h * c_.head_dim], &q_cpu[h * c_.head_dim], q_norm.data(), c_.head_dim, kEps);
      for (int64_t h = 0; h < c_.n_kv_heads; ++h)
        cpu::rmsnorm(&k_cpu[h * c_.head_dim], &k_cpu[h * c_.head_dim], k_norm.data(), c_.head_dim, kEps);
    }
    std::vector<uint16_t> keys_cpu = key_cache_, values_cpu = value_cache_;
    std::vector<float> cos_sin(static_cast<size_t>(c_.rope_dims));
    std::vector<float> expected(static_cast<size_t>(n_tokens * q_dim));
    std::vector<float> scores(static_cast<size_t>(context_));
    for (int64_t t = 0; t < n_tokens; ++t) {
      cpu::rope_angles(cos_sin.data(), position + t, inverse);
      cpu::rope(&q_cpu[t * q_dim], c_.n_heads, c_.head_dim, cos_sin.data(), c_.rope_dims / 2, c_.rope_style);
      cpu::rope(&k_cpu[t * kv_dim], c_.n_kv_heads, c_.head_dim, cos_sin.data(), c_.rope_dims / 2, c_.rope_style);
      for (int64_t i = 0; i < kv_dim; ++i) {
        keys_cpu[(position + t) * kv_dim + i] = fp32_to_fp16(k_cpu[t * kv_dim + i]);
        values_cpu[(position + t) * kv_dim + i] = fp32_to_fp16(v_cpu[t * kv_dim + i]);
      }
    }
    for (int64_t t = 0; t < n_tokens; ++t)
      for (int64_t h = 0; h < c_.n_heads; ++h) {
        const int64_t kv_offset = h / (c_.n_heads / c_.n_kv_heads) * c_.head_dim;
        const int64_t offset = t * q_dim + h * c_.head_dim;
        const cpu::RowRange seen{0, position + t + 1};
        cpu::attend(&expected[offset], &q_cpu[offset], keys_cpu.data() + kv_offset, values_cpu.data() + kv_offset,
                    {&seen, 1}, kv_dim, c_.head_dim, 1.0f / std::sqrt(static_cast<float>(c_.head_dim)), 0.0f,
                    scores.data());
      }

    // GPU.
    std::vector<int32_t> step(static_cast<size_t>(1 + n_tokens), 0);
    step[0] = static_cast<int32_t>(position);
    const DeviceBuffer step_device = to_device(step);
    const DeviceBuffer inverse_device = to_device(inverse);
    DeviceBuffer rope_device(static_cast<size_t>((position + n_tokens) * c_.rope_dims) * sizeof(float), "angles");
    DeviceBuffer q_device = to_device(q), k_device = to_device(k);
    const DeviceBuffer v_device = to_device(v);
    DeviceBuffer keys_device = to_device(key_cache_), values_device = to_device(value_cache_);
    const DeviceBuffer q_bias_device = to_device(q_bias), k_bias_device = to_device(k_bias);
    const DeviceBuffer v_bias_device = to_device(v_bias);
    const DeviceBuffer q_norm_device = to_device(q_norm), k_norm_device = to_device(k_norm);
    QkvExtras extras;
    if (with_extras)
      extras = {q_bias_device.as<float>(), k_bias_device.as<float>(), v_bias_device.as<float>(),
                q_norm_device.as<float>(), k_norm_device.as<float>(), kEps};
    DeviceBuffer out(expected.size() * sizeof(float), "out");
    rope_table(inverse_device.as<double>(), c_.rope_dims / 2, position + n_tokens, rope_device.as<float>(), stream_);

    // The rotation may round differently (FMA contraction), so the cached halves agree to within an ulp or so.
    const auto expect_same_cache = [](const std::vector<uint16_t>& got_cache,
                                      const std::vector<uint16_t>& expected_cache) {
      for (size_t i = 0; i < expected_cache.size(); ++i) {
        const float e = fp16_to_fp32(expected_cache[i]);
        ASSERT_NEAR(fp16_to_fp32(got_cache[i]), e, 2e-3f * std::fabs(e) + 1e-6f) << i;
      }
    };
    const auto expect_cache_matches_cpu = [&] {
      expect_same_cache(to_host<uint16_t>(keys_device, keys_cpu.size()), keys_cpu);
      expect_same_cache(to_host<uint16_t>(values_device, values_cpu.size()), values_cpu);
    };
    // Scoring with f16 queries and weights (attention_decode_rounds_to_f16, attention_prompt_rounds_to_f16) differs
    // from the CPU's f32 by up to about 1e-3 on these values (N(0, 1): 7.5e-4 measured on an H200 for decoding), f32
    // scoring by rounding only.
    const auto expect_output_matches_cpu = [&](const std::string& what, float tolerance) {
      const std::vector<float> got = to_host<float>(out, expected.size());
      for (size_t i = 0; i < expected.size(); ++i)
        ASSERT_NEAR(got[i], expected[i], tolerance) << what << ", position " << position << ", value " << i;
    };

    if (n_tokens > 1) {
      rope_and_store(shape_, q_device.as<float>(), k_device.as<float>(), v_device.as<float>(),
                     rope_device.as<float>(), n_tokens, step_device.as<int32_t>(), keys_device.as<uint16_t>(),
                     values_device.as<uint16_t>(), stream_);
      check(gpuStreamSynchronize(stream_), "rotary test");
      expect_cache_matches_cpu();
      if (::testing::Test::HasFatalFailure()) return;
      attention_prompt(shape_, q_device.as<float>(), keys_device.as<uint16_t>(), values_device.as<uint16_t>(),
                       n_tokens, step_device.as<int32_t>(), out.as<float>(), stream_);
      check(gpuStreamSynchronize(stream_), "attention test");
      expect_output_matches_cpu("prompt", attention_prompt_rounds_to_f16(shape_) ? 4e-3f : 2e-5f);
      return;
    }
    const size_t n = expected.size();
    for (const TensorType consumer : {TensorType::F16, TensorType::Q4_0, TensorType::Q4_K}) {
      const std::string what = "decoding for " + std::string(tensor_type_name(consumer));
      DeviceBuffer levels(n, "levels"), expected_levels(n, "levels");
      DeviceBuffer scales(n / kActivationBlock * sizeof(ActivationScale), "scales");
      DeviceBuffer expected_scales(scales.bytes(), "scales");
      ActivationOutput output;
      output.f32 = out.as<float>();
      output.blocks = activation_blocks(consumer);
      if (output.blocks != ActivationBlocks::None) {
        output.q = levels.as<int8_t>();
        output.scales = scales.as<ActivationScale>();
      }
      // All bits set where the kernel writes (NaN floats and scales), so that what it leaves out shows; the
      // cache as it was before the token.
      for (const DeviceBuffer* buffer : {&out, &levels, &scales})
        check(gpuMemsetAsync(buffer->data(), 0xff, buffer->bytes(), stream_), "attention test");
      keys_device = to_device(key_cache_);
      values_device = to_device(value_cache_);
      attention_decode(shape_, q_device.as<float>(), k_device.as<float>(), v_device.as<float>(), extras,
                       rope_device.as<float>(), keys_device.as<uint16_t>(), values_device.as<uint16_t>(), context_,
                       step_device.as<int32_t>(), partials_.as<float>(), output, stream_);
      check(gpuStreamSynchronize(stream_), "attention test");
      expect_cache_matches_cpu();
      if (::testing::Test::HasFatalFailure()) return;
      expect_output_matches_cpu(what, attention_decode_rounds_to_f16(shape_, output.blocks) ? 4e-3f : 2e-5f);
      if (::testing::Test::HasFatalFailure() || output.blocks == ActivationBlocks::None) continue;

      quantize_rows(output.blocks, out.as<float>(), 1, q_dim, expected_levels.as<int8_t>(),
                    expected_scales.as<ActivationScale>(), nullptr, stream_);
      check(gpuStreamSynchronize(stream_), "attention test");
      const std::vector<int8_t> got = to_host<int8_t>(levels, n);
      const std::vector<int8_t> want = to_host<int8_t>(expected_levels, n);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], want[i]) << what << ", position " << position << ", level " << i;
      const std::vector<ActivationScale> got_scales = to_host<ActivationScale>(scales, n / kActivationBlock);
      const std::vector<ActivationScale> want_scales = to_host<ActivationScale>(expected_scales, n / kActivationBlock);
      for (size_t b = 0; b < want_scales.size(); ++b) {
        ASSERT_EQ(got_scales[b].d, want_scales[b].d) << what << ", position " << position << ", block " << b;
        ASSERT_EQ(got_scales[b].sum[0], want_scales[b].sum[0]) << what << ", position " << position << ", block " << b;
        ASSERT_EQ(got_scales[b].sum[1], want_scales[b].sum[1]) << what << ", position " << position << ", block " << b;
      }
    }
  }

 private:
  model::ModelConfig c_;
  bool extras_;
  AttentionShape shape_;
  int64_t context_;
  gpuStream_t stream_;
  DeviceBuffer partials_;
  std::vector<uint16_t> key_cache_;
  std::vector<uint16_t> value_cache_;
};

// Long enough that at its end every decoding thread block takes several chunks (the grid has a few thread
// blocks per multiprocessor), on GPUs of up to some 250 multiprocessors.
constexpr int64_t kLongContext = 16384;

// Decoding at the first position, inside the first chunk, past it, and at the end of a long context: all on
// one partials buffer, as the replays of a captured step are. Between them, the last position that one thread
// block of a part takes alone and the first past it (attention.cu, lone_block_chunks()): four chunks where a lane
// holds 8 values of a row (255, 256), one where it holds 16 (63, 64).
void check_decoding(const model::ModelConfig& c, gpuStream_t stream, bool extras = false) {
  const AttentionCheck check(c, kLongContext, stream, extras);
  for (const int64_t position : {0, 5, 63, 64, 127, 128, 255, 256, 300, static_cast<int>(kLongContext - 1)}) {
    check.run(position, 1);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST_F(GpuKernels, DecodeAttentionMatchesCpu) {
  check_decoding(attention_config(model::RopeStyle::Normal), stream());
}
TEST_F(GpuKernels, DecodeAttentionNeoxMatchesCpu) {
  check_decoding(attention_config(model::RopeStyle::NeoX), stream());
}
// 2 query heads of 32 values per kv head: a Q8_K block takes the heads of 4 kv heads, and so does its combining.
TEST_F(GpuKernels, DecodeAttentionQuantizesAcrossKvHeads) {
  check_decoding(attention_config(model::RopeStyle::Normal, 16, 8, 32), stream());
}
// Heads of 36 values: cache rows are not whole 16-byte pieces, so keys are read 4 bytes at a time and not asked
// for in L2 ahead (and a Q8_K block takes the heads of 32 kv heads).
TEST_F(GpuKernels, DecodeAttentionReadsRowsOfOddPieces) {
  check_decoding(attention_config(model::RopeStyle::Normal, 64, 32, 36), stream());
}
// Llama 3's heads: 128 values, 4 query heads per kv head, taken 2 a thread block.
TEST_F(GpuKernels, DecodeAttentionTakesLlama3Heads) {
  check_decoding(attention_config(model::RopeStyle::Normal, 8, 2, 128), stream());
}
// 3 query heads per kv head: the team's lanes are split among 4 head slots, one of which idles.
TEST_F(GpuKernels, DecodeAttentionTakesGroupsOfThree) {
  check_decoding(attention_config(model::RopeStyle::Normal, 12, 4, 64), stream());
}
// Qwen2.5-7B's 7 query heads of 128 values per kv head: no divisor of the group fills whole Q8_K blocks, so a thread
// block takes two consecutive heads, which in two parts of 14 belong to two kv heads (whose newest rows the block
// stores and reads); with biases and head norms, as Qwen's layers have them.
TEST_F(GpuKernels, DecodeAttentionTakesGroupsOfSeven) {
  check_decoding(attention_config(model::RopeStyle::NeoX, 28, 4, 128), stream(), true);
}
// Llama 3's shape with the extras, in parts of 2 heads.
TEST_F(GpuKernels, DecodeAttentionAddsBiasesAndNormsHeads) {
  check_decoding(attention_config(model::RopeStyle::NeoX, 8, 2, 128), stream(), true);
}
// 16 query heads of 256 values per kv head: one head a thread block.
TEST_F(GpuKernels, DecodeAttentionTakesTheWidestGroups) {
  check_decoding(attention_config(model::RopeStyle::Normal, 32, 2, 256), stream());
}
// 16 query heads of 200 values per kv head. For a Q8_K output no fewer heads fill whole blocks: a thread block
// takes the whole group (a lane holds 128 values of a row, and one team a block scores), and the blocks of two kv
// heads combine; for a Q8_0 output a block takes 4 heads, for f32 only 2.
TEST_F(GpuKernels, DecodeAttentionTakesWholeGroupsOfWideHeads) {
  check_decoding(attention_config(model::RopeStyle::Normal, 32, 2, 200), stream());
}
TEST_F(GpuKernels, PromptAttentionMatchesCpu) {
  AttentionCheck(attention_config(model::RopeStyle::Normal), 600, stream()).run(300, 5);
}
TEST_F(GpuKernels, PromptAttentionNeoxMatchesCpu) {
  AttentionCheck(attention_config(model::RopeStyle::NeoX), 600, stream()).run(300, 5);
}
// Prompts of several tiles of tokens and of positions (64 each on tensor cores), from the first position and from
// one inside a tile, so that rows meet the causal edge anywhere in a tile.
TEST_F(GpuKernels, PromptAttentionTakesLongPrompts) {
  const AttentionCheck check(attention_config(model::RopeStyle::Normal), 600, stream());
  check.run(0, 200);
  if (::testing::Test::HasFatalFailure()) return;
  check.run(100, 150);
}
// Llama 3's heads of 128 values, 4 query heads per kv head.
TEST_F(GpuKernels, PromptAttentionTakesLlama3Heads) {
  AttentionCheck(attention_config(model::RopeStyle::Normal, 8, 2, 128), 600, stream()).run(37, 130);
}
// Heads of 36 values: scored by lanes (rows of odd pieces) on every device.
TEST_F(GpuKernels, PromptAttentionReadsRowsOfOddPieces) {
  AttentionCheck(attention_config(model::RopeStyle::Normal, 64, 32, 36), 600, stream()).run(10, 40);
}

// A sliding-window layer's cache as a ring of its window and one pass (AttentionShape::ring): passes of 1 and 3
// tokens at positions whose windows wrap past the ring's last row store and read the same keys and values as the
// full layout, so the outputs are the full layout's, bit for bit (the same kernel sums the same values in order).
TEST_F(GpuKernels, WindowedAttentionReadsARing) {
  const model::ModelConfig c = attention_config(model::RopeStyle::Normal);
  constexpr int64_t kWindow = 8, kContext = 64;
  const int64_t kv_dim = c.kv_dim();
  const std::vector<double> inverse = c.rope_inverse_frequencies(false, nullptr);
  const DeviceBuffer inverse_device = to_device(inverse);
  DeviceBuffer angles(static_cast<size_t>(kContext * c.rope_dims) * sizeof(float), "angles");
  rope_table(inverse_device.as<double>(), c.rope_dims / 2, kContext, angles.as<float>(), stream());
  const std::vector<float> cache_values = test::random_normal(static_cast<size_t>(2 * kContext * kv_dim), 21);
  std::vector<uint16_t> keys(static_cast<size_t>(kContext * kv_dim)), values(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    keys[i] = fp32_to_fp16(cache_values[i]);
    values[i] = fp32_to_fp16(cache_values[keys.size() + i]);
  }
  for (const int64_t n_tokens : {1, 3}) {
    const int64_t ring = kWindow + n_tokens;
    for (const int64_t position : {int64_t{5}, 2 * ring - 2, int64_t{40}}) {
      SCOPED_TRACE(std::to_string(n_tokens) + " tokens at " + std::to_string(position));
      // The ring holds the positions before `position` that the rows of the pass do not overwrite.
      std::vector<uint16_t> ring_keys(static_cast<size_t>(ring * kv_dim)), ring_values(ring_keys.size());
      for (int64_t p = std::max<int64_t>(0, position + n_tokens - ring); p < position; ++p)
        for (int64_t i = 0; i < kv_dim; ++i) {
          ring_keys[static_cast<size_t>(p % ring * kv_dim + i)] = keys[static_cast<size_t>(p * kv_dim + i)];
          ring_values[static_cast<size_t>(p % ring * kv_dim + i)] = values[static_cast<size_t>(p * kv_dim + i)];
        }
      const std::vector<int32_t> step = {static_cast<int32_t>(position), 0, 0, 0};
      const DeviceBuffer step_device = to_device(step);
      const std::vector<float> q = test::random_normal(static_cast<size_t>(n_tokens * c.q_dim()), 22);
      const std::vector<float> k = test::random_normal(static_cast<size_t>(n_tokens * kv_dim), 23);
      const std::vector<float> v = test::random_normal(static_cast<size_t>(n_tokens * kv_dim), 24);
      // Rotates, stores and attends in the layout of `shape`, from `cache`; returns the output and the cache.
      const auto store_and_attend = [&](const AttentionShape& shape, const std::vector<uint16_t>& cache_keys,
                                        const std::vector<uint16_t>& cache_values_f16) {
        DeviceBuffer q_device = to_device(q), k_device = to_device(k);
        const DeviceBuffer v_device = to_device(v);
        DeviceBuffer keys_device = to_device(cache_keys), values_device = to_device(cache_values_f16);
        DeviceBuffer out(static_cast<size_t>(n_tokens * c.q_dim()) * sizeof(float), "out");
        rope_and_store(shape, q_device.as<float>(), k_device.as<float>(), v_device.as<float>(), angles.as<float>(),
                       n_tokens, step_device.as<int32_t>(), keys_device.as<uint16_t>(), values_device.as<uint16_t>(),
                       stream());
        attention_prompt(shape, q_device.as<float>(), keys_device.as<uint16_t>(), values_device.as<uint16_t>(),
                         n_tokens, step_device.as<int32_t>(), out.as<float>(), stream());
        check(gpuStreamSynchronize(stream()), "windowed attention test");
        return std::pair{to_host<float>(out, static_cast<size_t>(n_tokens * c.q_dim())),
                         to_host<uint16_t>(keys_device, cache_keys.size())};
      };
      AttentionShape full = shape_of(c);
      full.window = kWindow;
      AttentionShape in_ring = full;
      in_ring.ring = ring;
      const auto [expected, full_keys] = store_and_attend(full, keys, values);
      const auto [got, stored_keys] = store_and_attend(in_ring, ring_keys, ring_values);
      EXPECT_EQ(got, expected);
      for (int64_t p = position; p < position + n_tokens; ++p)
        for (int64_t i = 0; i < kv_dim; ++i)
          ASSERT_EQ(stored_keys[static_cast<size_t>(p % ring * kv_dim + i)],
                    full_keys[static_cast<size_t>(p * kv_dim + i)])
              << "position " << p << ", value " << i;
    }
  }
}

}  // namespace
}  // namespace rf::gpu
#endif
