// Decoding with 16-bit float weights (F16, BF16): the products between one attention and the next (the output
// projection, the feed-forward block, the next layer's q, k and v) as one persistent launch, so that the weights keep
// streaming from device memory across the steps' dependencies.
//
// Why: launched one product at a time, each boundary between two products costs the F16 weights' stream its ramp
// and drain: with the 8B's shapes on an H200, a layer's four matrices ran faster as one launch without
// dependencies than as four launches.
//
// How: one thread block per multiprocessor, all resident at once. In each block a producer warp copies the block's
// share of every matrix of the chain, one after another, into a ring of shared-memory stages with bulk copies (the
// Hopper copy engine, cp.async.bulk), without ever waiting for activations: only for a free stage. Twelve consumer
// warps take each stage as it lands, dot it with the step's input row, which the block keeps in its consumers'
// registers, and hand the stage back. Between two steps the consumers of all blocks meet at a grid-wide barrier;
// meanwhile the producer goes on filling the ring with the next step's rows, so the memory system stays busy through
// the barrier and through the small steps around it (the norm that every block applies to its own copy of the input,
// the SwiGLU, the attention kernel that runs between two launches: the next launch starts beside it and its
// producers stream while its consumers wait for the attention's output).
//
// A block's share of a matrix is a contiguous run of rows (its rows of gate and up are the same rows, so that the
// block applies the SwiGLU to its own sums), and a stage holds whole rows of it. Consumer thread t takes the four
// consecutive values at 4t, 4t + 1536, ... of every row, so a warp's reads of a row are consecutive in shared memory
// (no bank conflicts) and the thread keeps the input values it meets in registers for the whole step: shared memory
// carries the weights and the warps' row sums only. (Warps that took pieces of rows and read the f32 input from
// shared memory for each one consumed a stage as slowly as device memory delivers it, so a consumer that waited
// never caught up.) Each warp sums its rows over its lanes, the rows spread over the lanes (spread_sum), into row
// sums of its own in shared memory; at the end of the step the block adds the warps' sums and writes each row once.
// (Adding them up as they came, with shared-memory atomics, was slower.)
//
// Bytes per token: every weight byte once, from device memory into shared memory; each step's input row once per
// block from L2.
#include <algorithm>

#include "backend/gpu/device.cuh"
#include "backend/gpu/kernels.h"
#include "backend/gpu/tuning.h"

namespace rf::gpu {
// The bulk copies and shared-memory barriers are Hopper's (sm_90): a HIP build has no chains, and a CUDA build's
// code for older devices traps (product_chain_runs() keeps them from launching it).
#if !defined(ROCMFORGE_GPU_HIP)
namespace {

// Consumer warps a block and the ring of stages that its producer fills ahead of them (tuning.h).
constexpr int kConsumerWarps = tuning::kChainConsumerWarps;
constexpr int kChainThreads = (kConsumerWarps + 1) * 32;
constexpr int kConsumerThreads = kConsumerWarps * 32;
constexpr int kStages = tuning::kChainStages;
constexpr int kStageBytes = tuning::kChainStageBytes;
// Each consumer thread takes four consecutive values of a row in every sweep of kSweep values: its columns are the
// same in every row of a step, so it keeps its input values in registers.
constexpr int64_t kSweep = 4 * kConsumerThreads;
constexpr int kMaxSweeps = static_cast<int>((kMaxChainInput + kSweep - 1) / kSweep);
// Bytes of a weight (F16, BF16).
constexpr int64_t kWeightBytes = 2;
// A stage holds whole rows of one matrix: the largest power of two of them that fits, up to kMaxStageRows.
constexpr int kMaxStageRows = 16;
__device__ inline int stage_rows(int64_t cols) {
  int rows = 1;
  while (rows < kMaxStageRows && 2 * rows * cols * kWeightBytes <= kStageBytes) rows *= 2;
  return rows;
}

// A block's rows of a matrix of `rows` rows: [first, end).
struct Share {
  int64_t first;
  int64_t end;
  __device__ int64_t rows() const { return end - first; }
};
__device__ inline Share share_of(int64_t rows, int64_t block, int64_t blocks) {
  return {rows * block / blocks, rows * (block + 1) / blocks};
}

// Rows of the stage that starts at row `first` of a share, in stages of `rows` rows.
__device__ inline int stage_rows_at(const Share& share, int64_t first, int rows) {
  return static_cast<int>(share.rows() - first < rows ? share.rows() - first : rows);
}

// Hopper's instructions; a trap in code compiled for older devices.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define HOPPER_ASM(...) __trap()
#else
#define HOPPER_ASM(...) asm volatile(__VA_ARGS__)
#endif

// (Unreferenced where HOPPER_ASM traps.)
[[maybe_unused]] __device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void barrier_init(uint64_t* barrier, unsigned count) {
  HOPPER_ASM("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(barrier)), "r"(count));
}
// The producer's arrival, announcing the bytes the stage's copy will bring.
__device__ __forceinline__ void barrier_expect_bytes(uint64_t* barrier, unsigned bytes) {
  HOPPER_ASM("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(barrier)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void barrier_arrive(uint64_t* barrier) {
  HOPPER_ASM("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(barrier)) : "memory");
}
// Waits until the phase of `barrier` with parity `parity` has completed.
__device__ __forceinline__ void barrier_wait(uint64_t* barrier, unsigned parity) {
  HOPPER_ASM(
      "{\n"
      ".reg .pred done;\n"
      "wait:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait;\n"
      "}\n" ::"r"(shared_address(barrier)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bulk_copy(void* destination, const void* source, unsigned bytes, uint64_t* barrier) {
  HOPPER_ASM("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   shared_address(destination)),
               "l"(source), "r"(bytes), "r"(shared_address(barrier))
               : "memory");
}
// A barrier among the consumer warps only (the producer never waits for them).
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads) : "memory"); }

// Every block's consumers meet here; `arrivals` counts them over the whole launch.
__device__ __forceinline__ void grid_barrier(unsigned* arrivals, unsigned target) {
  consumers_sync();
  if (threadIdx.x == 0) arrive_and_wait(arrivals, target);
  consumers_sync();
}

// Two weights of a 32-bit word as floats.
template <TensorType T>
__device__ __forceinline__ float2 widen_pair(uint32_t bits) {
  if constexpr (T == TensorType::F16) return __half22float2(*reinterpret_cast<const __half2*>(&bits));
  return make_float2(__uint_as_float(bits << 16), __uint_as_float(bits & 0xffff0000u));
}

// Sums v[r] over the warp for each of its N rows (a power of two up to 32) with fewer shuffles than N sums: at each
// of the first log2(N) rounds a lane keeps half of its rows and sends the other half to its partner. Returns the sum
// of the lane's row (set in `row`); lanes whose lowest 5 - log2(N) bits are zero hold each row once.
template <int N, int kStride = 16>
__device__ __forceinline__ float spread_sum(float* v, int lane, int& row) {
  if constexpr (N == 1) {
    float sum = v[0];
#pragma unroll
    for (int stride = kStride; stride >= 1; stride /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, stride);
    return sum;
  } else {
    constexpr int kHalf = N / 2;
    const bool upper = (lane & kStride) != 0;
#pragma unroll
    for (int i = 0; i < kHalf; ++i) {
      const float send = upper ? v[i] : v[i + kHalf];
      const float keep = upper ? v[i + kHalf] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, kStride);
    }
    if (upper) row += kHalf;
    return spread_sum<kHalf, kStride / 2>(v, lane, row);
  }
}

// Copies the step's input row into the consumer thread's registers: quads t, t + kConsumerThreads, ... (the columns
// it meets in every row), RMS-normalized with step.norm where it has one (the warps' sums of squares added in
// double, and the scale, as rmsnorm() has them). Every thread's loads are issued before any is used: the step waits
// one round trip.
__device__ void load_input(const ChainStep& step, float eps, float4 (&x)[kMaxSweeps], double* squares) {
  const int64_t quads = step.cols / 4;
#pragma unroll
  for (int j = 0; j < kMaxSweeps; ++j) {
    const int64_t i = threadIdx.x + j * kConsumerThreads;
    x[j] = i < quads ? __ldcg(reinterpret_cast<const float4*>(step.input) + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  if (!step.norm) return;
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kMaxSweeps; ++j) sum += x[j].x * x[j].x + x[j].y * x[j].y + x[j].z * x[j].z + x[j].w * x[j].w;
  const float warp_squares = team_sum(sum);
  if (threadIdx.x % 32 == 0) squares[threadIdx.x / 32] = warp_squares;
  consumers_sync();
  double total = 0.0;
  for (int w = 0; w < kConsumerWarps; ++w) total += squares[w];
  const float scale = rms_scale(total, step.cols, eps);
#pragma unroll
  for (int j = 0; j < kMaxSweeps; ++j) {
    const int64_t i = threadIdx.x + j * kConsumerThreads;
    if (i >= quads) continue;
    const float4 g = reinterpret_cast<const float4*>(step.norm)[i];
    x[j] = make_float4(x[j].x * scale * g.x, x[j].y * scale * g.y, x[j].z * scale * g.z, x[j].w * scale * g.w);
  }
}

// One stage of `rows` rows (at most R) of `cols` values: every consumer thread dots its columns of each row with its
// input values, and the warp's sums of the rows go to warp_sums.
template <TensorType T, int R>
__device__ __forceinline__ void consume_stage(const unsigned char* stage, int64_t cols, int rows,
                                              const float4 (&x)[kMaxSweeps], float* warp_sums, int lane) {
  float acc[R] = {};
#pragma unroll
  for (int j = 0; j < kMaxSweeps; ++j) {
    const int64_t c = threadIdx.x * 4 + j * kSweep;
    if (c >= cols) break;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r >= rows) break;
      const uint2 w = *reinterpret_cast<const uint2*>(stage + (r * cols + c) * kWeightBytes);
      const float2 w0 = widen_pair<T>(w.x);
      const float2 w1 = widen_pair<T>(w.y);
      acc[r] += w0.x * x[j].x + w0.y * x[j].y + w1.x * x[j].z + w1.y * x[j].w;
    }
  }
  int row = 0;
  const float sum = spread_sum<R>(acc, lane, row);
  if ((lane & (32 / R - 1)) == 0 && row < rows) warp_sums[row] = sum;
}

// The step's results from the block's row sums (row i's: warp w's sum at warp_sums[w * stride + i], added up):
// stored, added to the residual stream, or silu(gate) * up.
__device__ void write_outputs(const ChainStep& step, const float* warp_sums, int64_t stride, int64_t block,
                              int64_t blocks) {
  const auto total = [&](int64_t i) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kConsumerWarps; ++w) sum += warp_sums[w * stride + i];
    return sum;
  };
  int64_t offset = 0;
  for (int m = 0; m < step.matrices; ++m) {
    const Share share = share_of(step.rows[m], block, blocks);
    for (int64_t r = threadIdx.x; r < share.rows(); r += kConsumerThreads) {
      const float sum = total(offset + r);
      const int64_t row = share.first + r;
      if (step.output == ChainOutput::Store) step.y[m][row] = sum;
      if (step.output == ChainOutput::Accumulate) add_to(step.y[0] + row, sum);
      if (step.output == ChainOutput::Swiglu && m == 1) {
        step.y[0][row] = silu_times(total(r), sum);
      }
    }
    offset += share.rows();
  }
  consumers_sync();
}

// The consumers' part of a step whose stages hold up to R rows: the block's rows of each matrix, stage after stage.
template <TensorType T, int R>
__device__ void consume_step(const ChainStep& step, const float4 (&x)[kMaxSweeps], const unsigned char* ring,
                             uint64_t* full, uint64_t* empty, float* warp_sums, unsigned& k, int64_t block,
                             int64_t blocks) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  for (int m = 0; m < step.matrices; ++m) {
    const Share share = share_of(step.rows[m], block, blocks);
    for (int64_t first = 0; first < share.rows(); first += R, ++k) {
      const unsigned slot = k % kStages, round = k / kStages;
      const int rows = stage_rows_at(share, first, R);
      barrier_wait(&full[slot], round & 1);
      consume_stage<T, R>(ring + slot * kStageBytes, step.cols, rows, x, warp_sums + first, lane);
      __syncwarp();
      if (lane == 0) barrier_arrive(&empty[slot]);
    }
    warp_sums += share.rows();
  }
}

template <TensorType T>
__global__ void __launch_bounds__(kChainThreads, 1) product_chain_kernel(ProductChain chain, unsigned* arrivals) {
  extern __shared__ __align__(128) unsigned char shared[];
  uint64_t* full = reinterpret_cast<uint64_t*>(shared);
  uint64_t* empty = full + kStages;
  unsigned char* ring = shared + 128;
  auto* warp_sums = reinterpret_cast<float*>(ring + kStages * kStageBytes);  // [warp][row of the block's share]
  auto* squares = reinterpret_cast<double*>(warp_sums + kConsumerWarps * chain.sum_floats);
  const int64_t block = blockIdx.x, blocks = gridDim.x;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      barrier_init(&full[s], 1);
      barrier_init(&empty[s], kConsumerWarps);
    }
    HOPPER_ASM("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  start_successor();

  if (warp == kConsumerWarps) {
    // The producer: the weights do not depend on earlier kernels, so it starts at once.
    if (lane != 0) return;
    unsigned k = 0;
    for (int s = 0; s < chain.steps; ++s) {
      const ChainStep& step = chain.step[s];
      const int64_t row_bytes = step.cols * kWeightBytes;
      const int rows = stage_rows(step.cols);
      for (int m = 0; m < step.matrices; ++m) {
        const Share share = share_of(step.rows[m], block, blocks);
        const auto* source = static_cast<const unsigned char*>(step.weights[m]) + share.first * row_bytes;
        for (int64_t first = 0; first < share.rows(); first += rows, ++k) {
          const unsigned slot = k % kStages, round = k / kStages;
          const auto bytes = static_cast<unsigned>(stage_rows_at(share, first, rows) * row_bytes);
          barrier_wait(&empty[slot], (round & 1) ^ 1);
          barrier_expect_bytes(&full[slot], bytes);
          bulk_copy(ring + slot * kStageBytes, source + first * row_bytes, bytes, &full[slot]);
        }
      }
    }
    return;
  }

  wait_for_predecessor();
  unsigned k = 0;
  for (int s = 0; s < chain.steps; ++s) {
    const ChainStep& step = chain.step[s];
    float4 x[kMaxSweeps];
    load_input(step, chain.eps, x, squares);
    float* mine = warp_sums + warp * chain.sum_floats;
    switch (stage_rows(step.cols)) {
      case 1: consume_step<T, 1>(step, x, ring, full, empty, mine, k, block, blocks); break;
      case 2: consume_step<T, 2>(step, x, ring, full, empty, mine, k, block, blocks); break;
      case 4: consume_step<T, 4>(step, x, ring, full, empty, mine, k, block, blocks); break;
      case 8: consume_step<T, 8>(step, x, ring, full, empty, mine, k, block, blocks); break;
      default: consume_step<T, kMaxStageRows>(step, x, ring, full, empty, mine, k, block, blocks); break;
    }
    consumers_sync();
    write_outputs(step, warp_sums, chain.sum_floats, block, blocks);
    if (s + 1 < chain.steps) grid_barrier(arrivals, static_cast<unsigned>((s + 1) * blocks));
  }
  // Every block has passed the last barrier once it counts itself out; the last to do so zeroes the count for the
  // next launch.
  if (threadIdx.x == 0) {
    const auto total = static_cast<unsigned>(chain.steps * blocks);
    if (fetch_add_acq_rel(arrivals, 1) == total - 1) atomicExch(arrivals, 0u);
  }
}

// The launch's thread blocks, shared memory and kernel, or blocks == 0 where the device or the chain does not suit.
struct ChainLaunch {
  int blocks = 0;
  size_t shared_bytes = 0;
  void (*kernel)(ProductChain, unsigned*) = nullptr;
};

ChainLaunch plan_launch(ProductChain& chain) {
  struct Device {
    int major = 0;
    int multiprocessors = 0;
    int shared_optin = 0;
  };
  static const Device device = [] {
    Device d;
    cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, 0);
    cudaDeviceGetAttribute(&d.multiprocessors, cudaDevAttrMultiProcessorCount, 0);
    cudaDeviceGetAttribute(&d.shared_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
    return d;
  }();
  if (device.major < 9 || chain.steps < 1 || chain.steps > kMaxChainSteps) return {};
  if (chain.type != TensorType::F16 && chain.type != TensorType::BF16) return {};
  const int64_t blocks = device.multiprocessors;
  chain.sum_floats = 0;
  for (int s = 0; s < chain.steps; ++s) {
    const ChainStep& step = chain.step[s];
    if (step.cols % kChainWidthMultiple != 0 || step.cols > kMaxChainInput) return {};
    if (step.matrices < 1 || step.matrices > 3) return {};
    if (step.output == ChainOutput::Swiglu && (step.matrices != 2 || step.rows[0] != step.rows[1])) return {};
    int64_t rows = 0;
    for (int m = 0; m < step.matrices; ++m) rows += (step.rows[m] + blocks - 1) / blocks;
    chain.sum_floats = std::max(chain.sum_floats, rows);
  }
  // The doubles of the norm's sum after the warps' row sums: keep them 8-byte aligned.
  chain.sum_floats += chain.sum_floats % 2;
  const size_t shared_bytes = 128 + kStages * kStageBytes + sizeof(float) * kConsumerWarps * chain.sum_floats +
                              sizeof(double) * kConsumerWarps;
  if (shared_bytes > static_cast<size_t>(device.shared_optin)) return {};
  // Each kernel may take all the shared memory a block can have, asked for once rather than at every launch.
  const auto kernel_for = [&]<TensorType T>() {
    static const auto kernel = [&] {
      check(cudaFuncSetAttribute(product_chain_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 device.shared_optin),
            "product_chain: asking for shared memory");
      return product_chain_kernel<T>;
    }();
    return kernel;
  };
  ChainLaunch launch{device.multiprocessors, shared_bytes, nullptr};
  launch.kernel = chain.type == TensorType::F16 ? kernel_for.template operator()<TensorType::F16>()
                                                : kernel_for.template operator()<TensorType::BF16>();
  return launch;
}

}  // namespace
#endif

bool product_chain_runs(ProductChain chain) {
#if defined(ROCMFORGE_GPU_HIP)
  (void)chain;
  return false;
#else
  return plan_launch(chain).blocks > 0;
#endif
}

void product_chain(ProductChain chain, unsigned* arrivals, gpuStream_t stream) {
#if defined(ROCMFORGE_GPU_HIP)
  (void)chain;
  (void)arrivals;
  (void)stream;
  fail_with("product_chain: the HIP build has no product chains");
#else
  const ChainLaunch launch = plan_launch(chain);
  if (launch.blocks == 0) fail_with("product_chain: the chain does not suit this device");
  launch_overlapped("product_chain", launch.kernel, dim3(static_cast<unsigned>(launch.blocks)), dim3(kChainThreads),
                    launch.shared_bytes, stream, chain, arrivals);
#endif
}

}  // namespace rf::gpu
