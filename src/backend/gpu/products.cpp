#include "backend/gpu/products.h"

#include <algorithm>
#include <string>
#include <vector>

#if defined(ROCMFORGE_GPU_CUDA)
#include <cublas_v2.h>
#include <dlfcn.h>
#elif defined(ROCMFORGE_HIPBLAS)
#include <hip/hip_version.h>
#if HIP_VERSION_MAJOR >= 6
#define HIPBLAS_V2  // hipblasGemmEx with hipDataType and hipblasComputeType_t (ROCm 6's opt-in, ROCm 7's only form)
#endif
#include <hipblas/hipblas.h>
#endif

#include "util/error.h"

namespace rf::gpu {

DeviceMatrix device_matrix(const model::LazyTensor& weight) {
  const auto stored_rows = static_cast<int64_t>(weight.info().rows());
  WeightView view = weight_view(weight.data(), weight.type(), stored_rows, weight.cols());
  // A slice's rows start first() rows in: its payloads and (split types) scales are those of its first block on.
  const int64_t first_block = weight.first() * weight.cols() / tensor_type_info(weight.type()).block_elements;
  view.blocks += static_cast<uint64_t>(first_block) * device_layout(weight.type(), 0).block_stride;
  if (view.scales) view.scales += first_block;
  return {weight.type(), view, weight.rows(), weight.cols()};
}

ActivationRows::ActivationRows(int64_t capacity, int64_t cols, ProductPolicy policy)
    : capacity_(capacity),
      cols_(cols),
      policy_(policy),
      f32_(static_cast<size_t>(capacity * cols) * sizeof(float), "activations"),
      f16_(static_cast<size_t>(capacity * cols) * sizeof(uint16_t), "f16 activations") {
  // Quantized weights have rows of whole blocks: only such rows meet them.
  const auto allocate = [&](Quantized& form, int64_t block) {
    if (cols % block != 0 || policy == ProductPolicy::FloatActivations) return;
    form.q = DeviceBuffer(static_cast<size_t>(capacity * cols), "8-bit activations");
    form.scales = DeviceBuffer(static_cast<size_t>(capacity * cols / kActivationBlock) * sizeof(ActivationScale),
                               "activation scales");
  };
  allocate(q8_0_, kActivationBlock);
  allocate(q8_k_, 256);
}

void ActivationRows::changed() {
  q8_0_.current = q8_k_.current = half_current_ = false;
}

ActivationOutput ActivationRows::output_for(TensorType consumer, int64_t n) {
  changed();
  ActivationOutput out;
  out.f32 = f32();
  const ActivationBlocks blocks = blocks_for(consumer);
  if (blocks == ActivationBlocks::None || !quantized(blocks).q.data()) return out;
  Quantized& form = quantized(blocks);
  form.current = true;
  out.blocks = blocks;
  out.q = form.q.as<int8_t>();
  out.scales = form.scales.as<ActivationScale>();
  if (product_path(consumer, n, policy_) == ProductPath::Gemm) {
    out.f16 = f16_.as<uint16_t>();
    half_current_ = true;
    half_blocks_ = blocks;
  }
  return out;
}

ProductInput ActivationRows::input_for(const DeviceMatrix& weight, int64_t n, bool gemm, gpuStream_t stream) {
  if (n > capacity_) fail("{} activation rows do not fit the {} reserved", n, capacity_);
  const ActivationBlocks blocks = blocks_for(weight.type);
  ProductInput input;
  input.f32 = f32();
  if (blocks != ActivationBlocks::None) {
    Quantized& form = quantized(blocks);
    if (!form.q.data()) fail("rows of {} activations cannot meet {} weights", cols_, tensor_type_name(weight.type));
    const bool make_half = gemm && !(half_current_ && half_blocks_ == blocks);
    if (!form.current || make_half)
      quantize_rows(blocks, f32(), n, cols_, form.q.as<int8_t>(), form.scales.as<ActivationScale>(),
                    make_half ? f16_.as<uint16_t>() : nullptr, stream);
    form.current = true;
    input.q = form.q.as<int8_t>();
    input.scales = form.scales.as<ActivationScale>();
  } else if (gemm && !(half_current_ && half_blocks_ == blocks)) {
    convert_to_f16(f32(), n * cols_, f16_.as<uint16_t>(), stream);
  }
  if (gemm) {
    half_current_ = true;
    half_blocks_ = blocks;
    input.f16 = f16_.as<uint16_t>();
  }
  return input;
}

#if defined(ROCMFORGE_GPU_CUDA)
// cuBLAS is opened when the first prompt GEMM needs it rather than linked: loading it relocates some 200 MB
// of tables, which every process would pay at start, `rocmforge inspect` and CPU-only runs included.
struct Products::Blas {
  void* library = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  // cublasGemmEx is overloaded in C++ (legacy cudaDataType compute types): name the one with cublasComputeType_t.
  using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                    const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                                    cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  GemmEx gemm_ex = nullptr;
  cublasHandle_t handle = nullptr;

  Blas() {
    const std::string name = fmt::format("libcublas.so.{}", CUBLAS_VER_MAJOR);
    library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!library) fail("cannot load cuBLAS ({}): {}", name, dlerror());
    const auto create = symbol<decltype(&cublasCreate_v2)>("cublasCreate_v2");
    destroy = symbol<decltype(destroy)>("cublasDestroy_v2");
    set_stream = symbol<decltype(set_stream)>("cublasSetStream_v2");
    gemm_ex = symbol<GemmEx>("cublasGemmEx");
    if (create(&handle) != CUBLAS_STATUS_SUCCESS) fail("cannot initialize cuBLAS");
  }
  ~Blas() {
    destroy(handle);
    dlclose(library);
  }
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  template <typename Function>
  Function symbol(const char* name) {
    void* address = dlsym(library, name);
    if (!address) fail("cuBLAS lacks {}", name);
    return reinterpret_cast<Function>(address);
  }

  // Column-major c (m x n, leading dimension ldc) = a^T b + beta c, with a (k x m) and b (k x n) f16 and c f32,
  // summed in f32.
  void multiply_transposed(int m, int n, int k, const void* a, const void* b, float* c, int ldc, float beta,
                           gpuStream_t stream) {
    if (set_stream(handle, stream) != CUBLAS_STATUS_SUCCESS) fail("cublasSetStream failed");
    const float alpha = 1.0f;
    const cublasStatus_t status = gemm_ex(handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, a, CUDA_R_16F, k, b,
                                          CUDA_R_16F, k, &beta, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT);
    if (status != CUBLAS_STATUS_SUCCESS) fail("cublasGemmEx failed ({})", static_cast<int>(status));
  }
};
#elif defined(ROCMFORGE_HIPBLAS)
// hipBLAS is linked (CMake found it): its GEMM's symbol and types differ between ROCm releases, which the header
// settles at compile time.
struct Products::Blas {
#if HIP_VERSION_MAJOR >= 6
  static constexpr hipDataType kHalf = HIP_R_16F;
  static constexpr hipDataType kFloat = HIP_R_32F;
  static constexpr hipblasComputeType_t kCompute = HIPBLAS_COMPUTE_32F;
#else
  static constexpr hipblasDatatype_t kHalf = HIPBLAS_R_16F;
  static constexpr hipblasDatatype_t kFloat = HIPBLAS_R_32F;
  static constexpr hipblasDatatype_t kCompute = HIPBLAS_R_32F;
#endif
  hipblasHandle_t handle = nullptr;

  Blas() {
    if (hipblasCreate(&handle) != HIPBLAS_STATUS_SUCCESS) fail("cannot initialize hipBLAS");
  }
  ~Blas() { hipblasDestroy(handle); }
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  // As cuBLAS's above.
  void multiply_transposed(int m, int n, int k, const void* a, const void* b, float* c, int ldc, float beta,
                           gpuStream_t stream) {
    if (hipblasSetStream(handle, stream) != HIPBLAS_STATUS_SUCCESS) fail("hipblasSetStream failed");
    const float alpha = 1.0f;
    const hipblasStatus_t status = hipblasGemmEx(handle, HIPBLAS_OP_T, HIPBLAS_OP_N, m, n, k, &alpha, a, kHalf, k, b,
                                                 kHalf, k, &beta, c, kFloat, ldc, kCompute, HIPBLAS_GEMM_DEFAULT);
    if (status != HIPBLAS_STATUS_SUCCESS) fail("hipblasGemmEx failed ({})", static_cast<int>(status));
  }
};
#endif

#if ROCMFORGE_GPU_BLAS
Products::Products(int64_t scratch_elements) : scratch_elements_(scratch_elements) {}
#else
Products::Products(int64_t) {}
#endif

Products::~Products() = default;

ProductPath product_path(TensorType type, int64_t n, ProductPolicy policy) {
  if (ROCMFORGE_GPU_BLAS && policy == ProductPolicy::FloatActivations) return ProductPath::Gemm;
  const bool float_weights = activation_blocks(type) == ActivationBlocks::None;
  if (policy == ProductPolicy::BatchInvariant) {
    if (float_weights) return ProductPath::Matvec;
    if (has_matmul_q8(type)) return ProductPath::Tiles;
  }
  if (n <= kMaxMatvecBatch) return ProductPath::Matvec;
  if (has_matmul_q8(type) && n <= kMaxTiledRows) return ProductPath::Tiles;
  return ROCMFORGE_GPU_BLAS ? ProductPath::Gemm : ProductPath::Matvec;
}

void Products::multiply(std::span<const Target> targets, ActivationRows& x, int64_t n, bool accumulate,
                        gpuStream_t stream) {
  for (const Target& target : targets)
    if (x.cols() != target.weight.cols)
      fail("product: activation rows have {} values, the weight rows {}", x.cols(), target.weight.cols);
  const auto path = [&](const Target& target) { return product_path(target.weight.type, n, x.policy()); };
  for (size_t first = 0; first < targets.size();) {
    const Target& target = targets[first];
    switch (path(target)) {
      case ProductPath::Matvec: {
        size_t end = first + 1;
        while (end < targets.size() && path(targets[end]) == ProductPath::Matvec) ++end;
        matvec_products(targets.subspan(first, end - first), x, n, accumulate, stream);
        first = end;
        continue;
      }
      case ProductPath::Tiles:
        if (!tile_scratch_) tile_scratch_ = std::make_unique<TileScratch>();
        matmul_q8(target.weight.type, {target.weight.view, target.weight.rows, target.y}, x.cols(),
                  x.input_for(target.weight, n, false, stream), n, accumulate, *tile_scratch_, stream);
        break;
      case ProductPath::Gemm:
#if ROCMFORGE_GPU_BLAS
        gemm(target.weight, x.input_for(target.weight, n, true, stream), n, target.y, accumulate, stream);
        ++gemms_;
#endif
        break;
    }
    ++first;
  }
}

void Products::matvec_products(std::span<const Target> targets, ActivationRows& x, int64_t n, bool accumulate,
                               gpuStream_t stream) {
  // Runs of consecutive targets of one type share a launch; for one activation row, so does a last target of
  // another type where a kernel takes the pair (matvec_two_types).
  const auto segment_of = [](const Target& target) {
    return MatvecSegment{target.weight.view, target.weight.rows, target.y};
  };
  for (size_t first = 0; first < targets.size();) {
    const TensorType type = targets[first].weight.type;
    std::vector<MatvecSegment> segments;
    size_t next = first;
    for (; next < targets.size() && targets[next].weight.type == type && segments.size() < kMaxMatvecSegments; ++next)
      segments.push_back(segment_of(targets[next]));
    const ProductInput input = x.input_for(targets[first].weight, n, false, stream);
    if (n == 1 && next < targets.size() && segments.size() < kMaxMatvecSegments &&
        matvec_two_types(type, segments, targets[next].weight.type, segment_of(targets[next]), x.cols(), input,
                         accumulate, stream)) {
      first = next + 1;
      continue;
    }
    for (int64_t row = 0; row < n; row += kMaxMatvecBatch) {
      const auto batch = static_cast<int>(std::min<int64_t>(kMaxMatvecBatch, n - row));
      ProductInput rows = input;
      rows.f32 = input.f32 + row * x.cols();
      rows.q = input.q ? input.q + row * x.cols() : nullptr;
      rows.scales = input.scales ? input.scales + row * x.cols() / kActivationBlock : nullptr;
      std::vector<MatvecSegment> shifted = segments;
      for (MatvecSegment& segment : shifted) segment.y += row * segment.rows;
      matvec(type, shifted, x.cols(), rows, batch, accumulate, stream);
    }
    first = next;
  }
}

#if ROCMFORGE_GPU_BLAS
void Products::gemm(const DeviceMatrix& weight, const ProductInput& x, int64_t n, float* y, bool accumulate,
                    gpuStream_t stream) {
  if (!blas_) blas_ = std::make_unique<Blas>();
  const bool stored_f16 = weight.type == TensorType::F16;
  const int64_t tile_rows =
      stored_f16 ? weight.rows : std::max<int64_t>(1, std::min(weight.rows, scratch_elements_ / weight.cols));
  if (!stored_f16 && !scratch_.data())
    scratch_ = DeviceBuffer(static_cast<size_t>(scratch_elements_) * sizeof(uint16_t), "the dequantization scratch");
  for (int64_t first = 0; first < weight.rows; first += tile_rows) {
    const int64_t rows = std::min(tile_rows, weight.rows - first);
    const void* tile = weight.view.blocks + first * weight.cols * 2;
    if (!stored_f16) {
      dequantize_to_f16(weight.type, weight.view, weight.cols, first, rows, scratch_.as<uint16_t>(), stream);
      tile = scratch_.data();
    }
    // Column-major view: Y^T (rows x n, leading dimension weight.rows) = W_tile (rows x cols) * X^T (cols x n).
    blas_->multiply_transposed(static_cast<int>(rows), static_cast<int>(n), static_cast<int>(weight.cols), tile, x.f16,
                               y + first, static_cast<int>(weight.rows), accumulate ? 1.0f : 0.0f, stream);
  }
}
#endif

}  // namespace rf::gpu
