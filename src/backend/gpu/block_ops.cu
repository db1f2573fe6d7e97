// The small steps that some architectures add to the llama block: LayerNorm, biases, per-head q/k norms, post-norms'
// residual adds, soft-capping, and scaled or position-embedded inputs. Each is one plain launch; the llama block
// needs none of them. Also the gathering of the rows of a paged pass whose logits are wanted, and the argmax of rows
// of logits.
#include <algorithm>
#include <climits>
#include <cmath>
#include <utility>

#include "backend/gpu/device.cuh"
#include "backend/gpu/kernels.h"
#include "backend/gpu/pass_rows.cuh"
#include "backend/gpu/quantize.cuh"

namespace rf::gpu {
namespace {

constexpr int kThreads = kQuantizeThreads;

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

struct Moments {
  double sum;
  double squares;
};
__device__ __forceinline__ Moments shuffle_xor(const Moments& m, int mask, int width) {
  return {rf::gpu::shuffle_xor(m.sum, mask, width), rf::gpu::shuffle_xor(m.squares, mask, width)};
}

// A row is shared out in chunks of kThreads values as rmsnorm does; every block sums the whole row itself.
template <ActivationBlocks kBlocks>
__global__ void __launch_bounds__(kThreads) layernorm_kernel(const float* x, const float* weight, const float* bias,
                                                             int64_t cols, float eps, ActivationOutput out) {
  start_successor();
  wait_for_predecessor();
  __shared__ Moments scratch[kThreads / 32];
  __shared__ float2 pairs[kThreads / 32];
  const int64_t first = static_cast<int64_t>(blockIdx.y) * cols;
  const float* row = x + first;
  Moments own{0.0, 0.0};
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) {
    own.sum += row[j];
    own.squares += static_cast<double>(row[j]) * row[j];
  }
  const Moments total = block_reduce(own, scratch, [](const Moments& a, const Moments& b) {
    return Moments{a.sum + b.sum, a.squares + b.squares};
  });
  const double mean = total.sum / static_cast<double>(cols);
  const double variance = total.squares / static_cast<double>(cols) - mean * mean;
  const float scale = 1.0f / sqrtf(static_cast<float>(variance) + eps);
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  float value = 0.0f;
  if (i < cols) {
    value = (row[i] - static_cast<float>(mean)) * scale * weight[i] + (bias ? bias[i] : 0.0f);
    out.f32[first + i] = value;
  }
  const bool active = i - threadIdx.x % kTeam < cols;
  quantize_element<kBlocks>(value, first + i, active, out.q, out.scales, out.f16, pairs);
}

// Up to kMax segments of one launch, passed by value as the kernel's parameter.
template <typename Segment, int kMax>
struct Segments {
  Segment segment[kMax];
};

// The segments packed for a launch, and the largest of their `extent`s (what sizes its grid).
template <int kMax, typename Segment, typename Extent>
std::pair<Segments<Segment, kMax>, int64_t> pack(std::span<const Segment> segments, Extent extent, const char* what) {
  if (segments.size() > kMax) fail_with(what);
  Segments<Segment, kMax> packed{};
  int64_t largest = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    packed.segment[i] = segments[i];
    largest = std::max(largest, extent(segments[i]));
  }
  return {packed, largest};
}

using BiasSegments = Segments<BiasSegment, 3>;

__global__ void __launch_bounds__(kThreads) add_biases_kernel(BiasSegments segments, int64_t rows) {
  start_successor();
  wait_for_predecessor();
  const BiasSegment& s = segments.segment[blockIdx.y];
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i < rows * s.cols) s.x[i] += s.bias[i % s.cols];
}

__global__ void __launch_bounds__(kThreads) add_kernel(float* x, const float* y, int64_t n) {
  start_successor();
  wait_for_predecessor();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) x[i] += y[i];
}

using HeadNormSegments = Segments<HeadNormSegment, 2>;

// One team per head.
__global__ void __launch_bounds__(kThreads) head_rmsnorm_kernel(HeadNormSegments segments, int64_t head_dim,
                                                                float eps) {
  start_successor();
  wait_for_predecessor();
  const HeadNormSegment& s = segments.segment[blockIdx.y];
  const int64_t head = static_cast<int64_t>(blockIdx.x) * (kThreads / kTeam) + threadIdx.x / kTeam;
  if (head >= s.heads) return;
  const int lane = static_cast<int>(threadIdx.x % kTeam);
  float* x = s.x + head * head_dim;
  float squares = 0.0f;
  for (int64_t d = lane; d < head_dim; d += kTeam) squares += x[d] * x[d];
  const float scale = rms_scale(team_sum(squares), head_dim, eps);
  for (int64_t d = lane; d < head_dim; d += kTeam) x[d] = x[d] * scale * s.weight[d];
}

__global__ void __launch_bounds__(kThreads) soft_cap_kernel(float* x, int64_t n, float cap) {
  start_successor();
  wait_for_predecessor();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) x[i] = cap * tanhf(x[i] / cap);
}

// `Rows` (pass_rows.cuh): the position of each token.
template <typename Position, typename Rows>
__global__ void __launch_bounds__(kThreads) scale_and_position_kernel(float* x, int64_t n_tokens, int64_t cols,
                                                                      float scale, const Position* positions,
                                                                      Rows rows) {
  start_successor();
  wait_for_predecessor();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n_tokens * cols) return;
  float value = x[i] * scale;
  if (positions) {
    const Position learned = positions[rows.position(i / cols) * cols + i % cols];
    if constexpr (sizeof(Position) == 2)
      value += half_to_float(learned);
    else
      value += learned;
  }
  x[i] = value;
}

__global__ void __launch_bounds__(kThreads) gather_rows_kernel(const float* x, const int32_t* rows, int64_t n,
                                                               int64_t cols, float* out) {
  start_successor();
  wait_for_predecessor();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n * cols) out[i] = x[rows[i / cols] * cols + i % cols];
}

// A row's largest value so far and its index.
struct Largest {
  float value;
  int32_t index;
};
__device__ __forceinline__ Largest shuffle_xor(const Largest& l, int mask, int width) {
  return {rf::gpu::shuffle_xor(l.value, mask, width), rf::gpu::shuffle_xor(l.index, mask, width)};
}
// The index of nothing yet, whose value is -INFINITY: it displaces no value of a row, and any displaces it.
constexpr int32_t kNoIndex = INT_MAX;
// The larger of two, the lower index of equal values: std::max_element's first largest, whatever order the parts of a
// row meet in.
__device__ __forceinline__ Largest larger(const Largest& a, const Largest& b) {
  return a.index == kNoIndex || b.value > a.value || (b.value == a.value && b.index < a.index) ? b : a;
}

// One thread block a row, each thread taking every kArgmaxThreads-th value: the many threads and the loads issued
// kArgmaxLoads at a time keep enough of one row in flight that a block reads it at a good share of its
// multiprocessor's bandwidth (a Llama-3 row is 501 KiB, and a decoding step's rows each have a block of their own).
constexpr int kArgmaxThreads = 1024;
constexpr int kArgmaxLoads = 8;

__global__ void __launch_bounds__(kArgmaxThreads) argmax_rows_kernel(const float* x, int64_t cols, int32_t* out) {
  start_successor();
  wait_for_predecessor();
  __shared__ Largest scratch[kArgmaxThreads / 32];
  const float* row = x + static_cast<int64_t>(blockIdx.x) * cols;
  // A thread meets its values in increasing index, so taking only a strictly greater one keeps the first largest.
  Largest own{-INFINITY, kNoIndex};
  for (int64_t first = threadIdx.x; first < cols; first += kArgmaxLoads * kArgmaxThreads) {
    float values[kArgmaxLoads];
#pragma unroll
    for (int i = 0; i < kArgmaxLoads; ++i) {
      const int64_t j = first + i * kArgmaxThreads;
      values[i] = j < cols ? row[j] : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kArgmaxLoads; ++i) {
      const int64_t j = first + i * kArgmaxThreads;
      if (j < cols) own = larger(own, {values[i], static_cast<int32_t>(j)});
    }
  }
  const Largest total = block_reduce(own, scratch, [](const Largest& a, const Largest& b) { return larger(a, b); });
  if (threadIdx.x == 0) out[blockIdx.x] = total.index;
}

template <typename Rows>
void launch_scale_and_position(float* x, int64_t n_tokens, int64_t cols, float scale, TensorType positions_type,
                               const void* positions, const Rows& rows, gpuStream_t stream) {
  const unsigned blocks = blocks_for(n_tokens * cols);
  if (positions && positions_type == TensorType::F16)
    launch_overlapped("scale_and_position", scale_and_position_kernel<uint16_t, Rows>, blocks, kThreads, 0, stream, x,
                      n_tokens, cols, scale, static_cast<const uint16_t*>(positions), rows);
  else if (!positions || positions_type == TensorType::F32)
    launch_overlapped("scale_and_position", scale_and_position_kernel<float, Rows>, blocks, kThreads, 0, stream, x,
                      n_tokens, cols, scale, static_cast<const float*>(positions), rows);
  else
    fail_with("scale_and_position: learned positions must be F32 or F16");
}

}  // namespace

void layernorm(const float* x, const float* weight, const float* bias, int64_t rows, int64_t cols, float eps,
               const ActivationOutput& out, gpuStream_t stream) {
  const dim3 grid(blocks_for(cols), static_cast<unsigned>(rows));
  with_activation_blocks(out.blocks, [&]<ActivationBlocks kBlocks>() {
    launch_overlapped("layernorm", layernorm_kernel<kBlocks>, grid, kThreads, 0, stream, x, weight, bias, cols, eps,
                      out);
  });
}

void add_biases(std::span<const BiasSegment> segments, int64_t rows, gpuStream_t stream) {
  if (segments.empty()) return;
  const auto [packed, widest] =
      pack<3>(segments, [](const BiasSegment& s) { return s.cols; }, "add_biases: at most three segments a launch");
  const dim3 grid(blocks_for(rows * widest), static_cast<unsigned>(segments.size()));
  launch_overlapped("add_biases", add_biases_kernel, grid, kThreads, 0, stream, packed, rows);
}

void add(float* x, const float* y, int64_t n, gpuStream_t stream) {
  launch_overlapped("add", add_kernel, blocks_for(n), kThreads, 0, stream, x, y, n);
}

void head_rmsnorm(std::span<const HeadNormSegment> segments, int64_t head_dim, float eps, gpuStream_t stream) {
  if (segments.empty()) return;
  const auto [packed, most] =
      pack<2>(segments, [](const HeadNormSegment& s) { return s.heads; }, "head_rmsnorm: at most two segments");
  constexpr int64_t kHeadsPerBlock = kThreads / kTeam;
  const dim3 grid(static_cast<unsigned>((most + kHeadsPerBlock - 1) / kHeadsPerBlock),
                  static_cast<unsigned>(segments.size()));
  launch_overlapped("head_rmsnorm", head_rmsnorm_kernel, grid, kThreads, 0, stream, packed, head_dim, eps);
}

void soft_cap(float* x, int64_t n, float cap, gpuStream_t stream) {
  launch_overlapped("soft_cap", soft_cap_kernel, blocks_for(n), kThreads, 0, stream, x, n, cap);
}

void scale_and_position(float* x, int64_t n_tokens, int64_t cols, float scale, TensorType positions_type,
                        const void* positions, const int32_t* step, gpuStream_t stream) {
  // The ring of SequenceRows is for cache rows, which no learned position needs.
  launch_scale_and_position(x, n_tokens, cols, scale, positions_type, positions, SequenceRows{step, 0}, stream);
}

void scale_and_position(float* x, int64_t n_tokens, int64_t cols, float scale, TensorType positions_type,
                        const void* positions, const PagedRows& rows, gpuStream_t stream) {
  launch_scale_and_position(x, n_tokens, cols, scale, positions_type, positions, PagedBatchRows{rows}, stream);
}

void gather_rows(const float* x, const int32_t* rows, int64_t n, int64_t cols, float* out, gpuStream_t stream) {
  launch_overlapped("gather_rows", gather_rows_kernel, blocks_for(n * cols), kThreads, 0, stream, x, rows, n, cols,
                    out);
}

void argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* out, gpuStream_t stream) {
  if (rows == 0) return;
  launch_overlapped("argmax_rows", argmax_rows_kernel, static_cast<unsigned>(rows), kArgmaxThreads, 0, stream, x, cols,
                    out);
}

}  // namespace rf::gpu
