// Matrix products of the forward pass: y (+)= x W^T for a batch of n activation rows. Up to kMaxMatvecBatch
// rows run as one matrix-vector pass over the stored weights (decoding). Batches of up to kMaxTiledRows with
// quantized weights, and every batch of a paged pass (ProductPolicy), run on the tensor cores in integers (matmul_q8:
// the same 8-bit activations and scales, the weights read in their stored type), where the GPU has int8 mma.sync.
// The rest (larger batches, float weights, float activations, or GPUs without those kernels) run through cuBLAS:
// the weight is dequantized to f16, a tile of rows at a time, into a scratch buffer that every matrix reuses, and
// multiplied with the f16 form of the activations, accumulating in f32. On AMD the same runs through hipBLAS where
// CMake found it (ROCMFORGE_HIPBLAS; Debian's ROCm has none); without it large batches run as matrix-vector passes of
// kMaxMatvecBatch rows.
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

// Which product a pass takes for a batch of rows (its ActivationRows carry it: every product reads one).
enum class ProductPolicy {
  // The fastest for each batch: matrix-vector passes up to kMaxMatvecBatch rows; past that, quantized weights on
  // tensor-core tiles up to kMaxTiledRows and GEMMs for larger batches (prompts), float weights GEMMs.
  Fastest,
  // A row's results are the same bits whatever the rows beside it (many sequences at once): quantized weights on
  // tensor-core tiles at every batch, one row too (their sums depend on the matrix alone: matmul_q8), float weights
  // as matrix-vector passes (kMaxMatvecBatch rows a pass, each row summed alike). A float rounding of difference
  // would otherwise move an 8-bit level now and then, which changes log-probabilities in the third decimal. Where
  // the GPU has no tiles (AMD), quantized weights take the Fastest products, which batching changes that much.
  BatchInvariant,
  // Every product a GEMM of the f16 form of the f32 activations (TransformerOptions::float_activations).
  FloatActivations,
};

// Up to `capacity` rows of `cols` f32 activations in device memory, and the 8-bit and f16 forms of them that
// products read, each made at most once per content: the q, k and v projections (or gate and up) read the
// same rows. Whoever rewrites the rows calls changed().
class ActivationRows {
 public:
  // With ProductPolicy::FloatActivations, products take the f16 form of the f32 rows whatever the weight type, and
  // there is no 8-bit form.
  ActivationRows(int64_t capacity, int64_t cols, ProductPolicy policy = ProductPolicy::Fastest);
  float* f32() const { return f32_.as<float>(); }
  int64_t cols() const { return cols_; }
  ProductPolicy policy() const { return policy_; }
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
    return policy_ == ProductPolicy::FloatActivations ? ActivationBlocks::None : activation_blocks(weight_type);
  }

  int64_t capacity_;
  int64_t cols_;
  ProductPolicy policy_;
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

// Past this many rows, a Fastest pass multiplies quantized weights in GEMMs rather than tiles: dequantizing the
// weights to f16 once per pass pays for itself in the GEMM's speed (H200, 1b Q4_K_M: pp16 7430 t/s on tiles against
// 6680 through GEMMs, pp64 12931 against 24609).
constexpr int64_t kMaxTiledRows = 16;

// How a product of n activation rows with `type` weights runs (see the top of the file).
enum class ProductPath { Matvec, Tiles, Gemm };
ProductPath product_path(TensorType type, int64_t n, ProductPolicy policy);

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
  // GEMMs enqueued so far: a pass that ran one is not captured in a graph (cuBLAS may allocate as it runs).
  int64_t gemms() const { return gemms_; }

 private:
  // Consecutive targets that run as matrix-vector passes: runs of one type share a launch.
  void matvec_products(std::span<const Target> targets, ActivationRows& x, int64_t n, bool accumulate,
                       gpuStream_t stream);

  std::unique_ptr<TileScratch> tile_scratch_;  // created with the first tensor-core product
  int64_t gemms_ = 0;
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
