// Matrix products of the forward pass: y (+)= x W^T for a batch of n activation rows. Up to kMaxMatvecBatch
// rows run as one matrix-vector pass over the stored weights (decoding). Larger batches (prompts) run on the
// tensor cores through cuBLAS: the weight is dequantized to f16, a tile of rows at a time, into a scratch
// buffer that every matrix reuses, and multiplied with the f16 form of the activations, accumulating in f32.
// On AMD the same runs through hipBLAS where CMake found it (ROCMFORGE_HIPBLAS; Debian's ROCm has none); without
// it large batches run as matrix-vector passes of kMaxMatvecBatch rows.
#pragma once
#include <cstdint>
#include <memory>
#include <span>

#include "backend/gpu/kernels.h"
#include "backend/gpu/runtime.h"
#include "model/lazy_tensor.h"

namespace rf::gpu {

// A weight matrix in device memory: `rows` rows (outputs) of `cols` values (inputs).
struct DeviceMatrix {
  TensorType type;
  WeightView view;
  int64_t rows;
  int64_t cols;
};

// The matrix of a weight, materializing it (uploading it) on first use.
DeviceMatrix device_matrix(const model::LazyTensor& weight);

// Up to `capacity` rows of `cols` f32 activations in device memory, and the 8-bit and f16 forms of them that
// products read, each made at most once per content: the q, k and v projections (or gate and up) read the
// same rows. Whoever rewrites the rows calls changed().
class ActivationRows {
 public:
  // `float_activations`: products take the f16 form of the f32 rows whatever the weight type, as GEMMs
  // (TransformerOptions::float_activations); there is no 8-bit form.
  ActivationRows(int64_t capacity, int64_t cols, bool float_activations = false);
  float* f32() const { return f32_.as<float>(); }
  int64_t cols() const { return cols_; }
  bool float_activations() const { return float_activations_; }
  // The rows are about to be rewritten: every other form is stale.
  void changed();
  // Where a kernel writes n new rows that products with `consumer` weights read next: the f32 rows and, made
  // by the same kernel, the 8-bit form those products take, and its f16 form where they run as GEMMs.
  ActivationOutput output_for(TensorType consumer, int64_t n);
  // The forms of the first n rows that a product with `weight` reads (as matvec or as GEMM).
  ProductInput input_for(const DeviceMatrix& weight, int64_t n, bool gemm, gpuStream_t stream);

 private:
  struct Quantized {
    DeviceBuffer q;
    DeviceBuffer scales;
    bool current = false;
  };
  Quantized& quantized(ActivationBlocks blocks) { return blocks == ActivationBlocks::Q8_K ? q8_k_ : q8_0_; }
  // The 8-bit blocks products with `weight_type` weights read: None with float activations.
  ActivationBlocks blocks_for(TensorType weight_type) const {
    return float_activations_ ? ActivationBlocks::None : activation_blocks(weight_type);
  }

  int64_t capacity_;
  int64_t cols_;
  bool float_activations_;
  DeviceBuffer f32_;
  Quantized q8_0_;
  Quantized q8_k_;
  DeviceBuffer f16_;
  bool half_current_ = false;
  ActivationBlocks half_blocks_ = ActivationBlocks::None;  // what the f16 form holds: x, or its 8-bit form
};

// Whether this build has a BLAS for prompts: cuBLAS, or hipBLAS where CMake found it.
#if defined(ROCMFORGE_GPU_CUDA) || defined(ROCMFORGE_HIPBLAS)
#define ROCMFORGE_GPU_BLAS 1
#else
#define ROCMFORGE_GPU_BLAS 0
#endif

// Whether a product of n activation rows runs as a GEMM on the tensor cores (else as matrix-vector passes);
// with float activations every product does.
constexpr bool runs_as_gemm(int64_t n, bool float_activations = false) {
  return ROCMFORGE_GPU_BLAS && (n > kMaxMatvecBatch || float_activations);
}

class Products {
 public:
  // `scratch_elements`: f16 values of the dequantization scratch (the largest layer matrix is enough; bigger
  // matrices are done in tiles).
  explicit Products(int64_t scratch_elements);
  ~Products();
  Products(const Products&) = delete;
  Products& operator=(const Products&) = delete;

  // One matrix of a product and where its results go: y[t * rows + r] for input row t.
  struct Target {
    DeviceMatrix weight;
    float* y;
  };
  // y (+)= dot(weight row r, x row t) for t < n, for each target; targets that read the same input (q, k and
  // v) run as one launch where they share a type.
  void multiply(std::span<const Target> targets, ActivationRows& x, int64_t n, bool accumulate, gpuStream_t stream);

 private:
#if ROCMFORGE_GPU_BLAS
  struct Blas;
  void gemm(const DeviceMatrix& weight, const ProductInput& x, int64_t n, float* y, bool accumulate,
            gpuStream_t stream);

  int64_t scratch_elements_;
  DeviceBuffer scratch_;
  std::unique_ptr<Blas> blas_;  // created with the first GEMM
#endif
};

}  // namespace rf::gpu
