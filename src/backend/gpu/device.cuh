// Device-side portability for the kernels: one source compiles with nvcc for NVIDIA and with hipcc for AMD.
// What differs between the two is gathered here: the runtime header, the warp (32 lanes on NVIDIA, a
// wavefront of 64 on CDNA and 32 on RDNA), warp shuffles, the 4-way int8 dot product, and half floats.
#pragma once
#include <cstdint>

#if defined(ROCMFORGE_GPU_HIP)
#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>
#else
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#endif

#include "backend/gpu/runtime.h"

namespace rf::gpu {

// Lanes of the hardware warp. Kernels that only need a fixed group of lanes use kTeam instead, which is the
// same on every GPU, so that launch configurations do not depend on the warp width.
#if defined(__AMDGCN_WAVEFRONT_SIZE)
constexpr int kWarpSize = __AMDGCN_WAVEFRONT_SIZE;
#elif defined(ROCMFORGE_GPU_HIP)
constexpr int kWarpSize = 64;
#else
constexpr int kWarpSize = 32;
#endif

// 32 consecutive lanes of one warp that cooperate on one row (a warp or half a wavefront).
constexpr int kTeam = 32;

// Butterfly exchange among `width` consecutive lanes (a power of two, at most the warp size).
template <typename T>
__device__ __forceinline__ T shuffle_xor(T value, int mask, int width) {
#if defined(ROCMFORGE_GPU_HIP)
  return __shfl_xor(value, mask, width);
#else
  return __shfl_xor_sync(0xffffffffu, value, mask, width);
#endif
}

// Both halves of a pair, exchanged alike.
__device__ __forceinline__ float2 shuffle_xor(float2 value, int mask, int width) {
  return {shuffle_xor(value.x, mask, width), shuffle_xor(value.y, mask, width)};
}

// The value of lane `source` among `width` consecutive lanes.
template <typename T>
__device__ __forceinline__ T shuffle(T value, int source, int width) {
#if defined(ROCMFORGE_GPU_HIP)
  return __shfl(value, source, width);
#else
  return __shfl_sync(0xffffffffu, value, source, width);
#endif
}

// *counter += value at device scope, with acquire and release order; returns the value before.
__device__ __forceinline__ unsigned fetch_add_acq_rel(unsigned* counter, unsigned value) {
#if defined(ROCMFORGE_GPU_HIP)
  return __hip_atomic_fetch_add(counter, value, __ATOMIC_ACQ_REL, __HIP_MEMORY_SCOPE_AGENT);
#else
  unsigned before;
  asm volatile("atom.add.acq_rel.gpu.u32 %0, [%1], %2;" : "=r"(before) : "l"(counter), "r"(value) : "memory");
  return before;
#endif
}

// Adds this thread block to the arrivals at `counter`; true in every thread of the block that arrives last
// of `arrivals`, which also sets the counter back to zero for the next launch. The barrier orders the block's
// partial results before its first thread's arrival, whose release makes them visible to the last block and
// whose acquire (in the last block) makes the others' visible to it, the barrier after passing that on to the
// block's threads. One acquire-release atomic is faster on an H200 than a fence in every thread before the barrier
// and one after the atomic.
__device__ __forceinline__ bool arrive_last(unsigned* counter, unsigned arrivals) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    last = fetch_add_acq_rel(counter, 1u) == arrivals - 1;
    if (last) *counter = 0;
  }
  __syncthreads();
  return last;
}

// Arrival at a grid-wide barrier of a persistent launch, by one thread of each thread block: adds 1 to `arrivals`
// (release), then waits (acquire) until the count reaches `target`, every block's arrival at this barrier. The count
// only grows within a launch, so barrier k of a launch of b blocks waits for (k + 1) * b.
__device__ __forceinline__ void arrive_and_wait(unsigned* arrivals, unsigned target) {
#if defined(ROCMFORGE_GPU_HIP)
  __hip_atomic_fetch_add(arrivals, 1u, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_AGENT);
  while (__hip_atomic_load(arrivals, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_AGENT) < target) {
  }
#else
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(arrivals) : "memory");
  unsigned seen = 0;
  do {
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(arrivals) : "memory");
  } while (seen < target);
#endif
}

// *p += value, where no other thread of the launch touches *p: on CUDA as a reduction in L2 (`red.global.add.f32`:
// the one rounding to nearest that a load, an add and a store make, subnormals flushed to zero), which the thread
// does not wait for, so that a product that accumulates into the residual stream ends without a round trip to L2 for
// the value it adds to; the kernel after it sees the sum once its wait for this one returns. Faster on an H200 than
// a load and a store, and the decoded text unchanged. HIP loads, adds and stores.
__device__ __forceinline__ void add_to(float* p, float value) {
#if defined(ROCMFORGE_GPU_HIP)
  *p += value;
#else
  atomicAdd(p, value);
#endif
}

// `value` combined over `kWidth` consecutive lanes (a team, or the whole warp) in rounds of butterfly shuffles.
template <int kWidth = kTeam, typename T, typename Combine>
__device__ __forceinline__ T shuffle_reduce(T value, Combine combine) {
#pragma unroll
  for (int mask = kWidth / 2; mask > 0; mask /= 2) value = combine(value, shuffle_xor(value, mask, kWidth));
  return value;
}

// Sums, maxima and minima over a team of 32 lanes; every lane of the team gets the result. On NVIDIA (sm_80 on) the
// integer sum and the float extremes (as their ordered bits) take one `redux.sync` instruction each, where shuffles
// take five dependent rounds, which made every activation kernel's quantization (the extremes and the levels' sums)
// faster on an H200.
__device__ __forceinline__ float team_sum(float value) {
  return shuffle_reduce(value, [](float a, float b) { return a + b; });
}

// A float's bits as a signed integer that orders as the floats do (-0 just below +0, NaNs beyond the infinity of
// their sign); its own inverse.
__device__ __forceinline__ int ordered_bits(int bits) { return bits ^ ((bits >> 31) & 0x7FFFFFFF); }

// The largest (kLargest) or the smallest value of the team.
template <bool kLargest>
__device__ __forceinline__ float team_extreme(float value) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const int key = ordered_bits(__float_as_int(value));
  const int extreme = kLargest ? __reduce_max_sync(0xffffffffu, key) : __reduce_min_sync(0xffffffffu, key);
  return __int_as_float(ordered_bits(extreme));
#else
  return shuffle_reduce(value, [](float a, float b) { return kLargest ? fmaxf(a, b) : fminf(a, b); });
#endif
}

__device__ __forceinline__ float team_max(float value) { return team_extreme<true>(value); }
__device__ __forceinline__ float team_min(float value) { return team_extreme<false>(value); }

__device__ __forceinline__ int team_sum(int value) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return __reduce_add_sync(0xffffffffu, value);
#else
  return shuffle_reduce(value, [](int a, int b) { return a + b; });
#endif
}

// Sum and maximum over a quad (lanes 4g .. 4g + 3: the lanes that hold one row of an mma fragment).
__device__ __forceinline__ float quad_sum(float value) {
  value += shuffle_xor(value, 1, kTeam);
  return value + shuffle_xor(value, 2, kTeam);
}

__device__ __forceinline__ float quad_max(float value) {
  value = fmaxf(value, shuffle_xor(value, 1, kTeam));
  return fmaxf(value, shuffle_xor(value, 2, kTeam));
}

// Combines the warps' totals (each the same in every lane of its warp) over the thread block; every thread gets the
// result. `scratch` holds one T per warp (at most 1024 / 32) and may be reused once every thread has the result.
template <typename T, typename Combine>
__device__ __forceinline__ T across_warps(T warp_total, T* scratch, Combine combine) {
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int warps = static_cast<int>(blockDim.x + kWarpSize - 1) / kWarpSize;
  if (threadIdx.x % kWarpSize == 0) scratch[warp] = warp_total;
  __syncthreads();
  T total = scratch[0];
  for (int w = 1; w < warps; ++w) total = combine(total, scratch[w]);
  __syncthreads();
  return total;
}

// Reduction over the whole thread block with `combine` (sums, maxima); `scratch` as across_warps'.
template <typename T, typename Combine>
__device__ __forceinline__ T block_reduce(T value, T* scratch, Combine combine) {
  return across_warps(shuffle_reduce<kWarpSize>(value, combine), scratch, combine);
}

// The largest `value` of the thread block and the largest of its negations, in the one pass of a single reduction
// (`scratch` as across_warps').
__device__ __forceinline__ float2 block_extremes(float value, float2* scratch) {
  const auto larger = [](float2 a, float2 b) { return make_float2(fmaxf(a.x, b.x), fmaxf(a.y, b.y)); };
  if constexpr (kWarpSize == kTeam)
    return across_warps(make_float2(team_max(value), -team_min(value)), scratch, larger);
  else
    return block_reduce(make_float2(value, -value), scratch, larger);
}

// c + the dot product of the four signed bytes of a and b.
__device__ __forceinline__ int dot4_i8(int a, int b, int c) {
#if !defined(ROCMFORGE_GPU_HIP)
  return __dp4a(a, b, c);
#elif defined(__gfx90a__) || defined(__gfx942__) || defined(__gfx1030__)
  return __builtin_amdgcn_sdot4(a, b, c, false);
#elif defined(__gfx1100__)
  return __builtin_amdgcn_sudot4(true, a, true, b, c, false);
#else
  const auto byte = [](int x, int i) { return static_cast<int>(static_cast<int8_t>(x >> (8 * i))); };
  return c + byte(a, 0) * byte(b, 0) + byte(a, 1) * byte(b, 1) + byte(a, 2) * byte(b, 2) + byte(a, 3) * byte(b, 3);
#endif
}

// c + the dot product of the four unsigned bytes of a and the four signed bytes of b.
__device__ __forceinline__ int dot4_u8_i8(int a, int b, int c) {
#if !defined(ROCMFORGE_GPU_HIP)
  int result;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(result) : "r"(a), "r"(b), "r"(c));
  return result;
#elif defined(__gfx1100__)
  return __builtin_amdgcn_sudot4(false, a, true, b, c, false);
#elif defined(__gfx90a__) || defined(__gfx942__) || defined(__gfx1030__)
  // Signed dot products only: an unsigned byte is its low 7 bits plus 128 times its top bit.
  const int low = __builtin_amdgcn_sdot4(a & 0x7F7F7F7F, b, c, false);
  return low + 128 * __builtin_amdgcn_sdot4((a >> 7) & 0x01010101, b, 0, false);
#else
  const auto byte = [](int x, int i) { return static_cast<int>(static_cast<uint8_t>(x >> (8 * i))); };
  const auto signed_byte = [](int x, int i) { return static_cast<int>(static_cast<int8_t>(x >> (8 * i))); };
  return c + byte(a, 0) * signed_byte(b, 0) + byte(a, 1) * signed_byte(b, 1) + byte(a, 2) * signed_byte(b, 2) +
         byte(a, 3) * signed_byte(b, 3);
#endif
}

__device__ __forceinline__ float half_to_float(uint16_t bits) { return __half2float(__ushort_as_half(bits)); }
__device__ __forceinline__ uint16_t float_to_half(float value) { return __half_as_ushort(__float2half(value)); }
__device__ __forceinline__ float bf16_to_float(uint16_t bits) { return __uint_as_float(static_cast<uint32_t>(bits) << 16); }

// RMSNorm's scale of a row of `cols` values whose squares sum to `squares`: 1 / sqrt(mean + eps).
__device__ __forceinline__ float rms_scale(double squares, int64_t cols, float eps) {
  return 1.0f / sqrtf(static_cast<float>(squares / static_cast<double>(cols)) + eps);
}

// SwiGLU's product: silu(gate) * up.
__device__ __forceinline__ float silu_times(float gate, float up) { return gate / (1.0f + expf(-gate)) * up; }

// A 16-byte load (one instruction) from a 16-byte aligned address.
__device__ __forceinline__ int4 load_16(const void* p) { return *static_cast<const int4*>(p); }

// Loads of quantized weight bytes. A decode step reads every weight byte once, and between two reads of the same
// activations, KV cache rows or kernel code it streams a whole layer's weights, more than the L2 holds: with plain
// loads that stream most likely evicts the step's own data and code, which are then fetched from device memory again
// in every layer (the gain below fits that; no cache counters were read). Weights are therefore loaded as streaming
// data (evict-first in L1 and L2, `ld.global.cs`), faster on an H200. Float weights keep plain loads, with which
// F16 decoding was slightly faster. HIP loads plainly.
template <typename T>
__device__ __forceinline__ T load_weight(const void* p) {
#if defined(ROCMFORGE_GPU_HIP)
  return *static_cast<const T*>(p);
#else
  return __ldcs(static_cast<const T*>(p));
#endif
}
// 16 bytes of a weight of which only 8- or 4-byte alignment is known.
__device__ __forceinline__ int4 load_weight_16_from_8(const void* p) {
  const int2 a = load_weight<int2>(p);
  const int2 b = load_weight<int2>(static_cast<const int2*>(p) + 1);
  return make_int4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ int4 load_weight_16_from_4(const void* p) {
  const int* q = static_cast<const int*>(p);
  return make_int4(load_weight<int>(q), load_weight<int>(q + 1), load_weight<int>(q + 2), load_weight<int>(q + 3));
}

// Programmatic dependent launch (Hopper): a kernel started with launch_overlapped() may begin while the
// kernel before it in the stream still runs. It lets its own successor start at once (start_successor), does
// whatever does not depend on earlier kernels (computing addresses, fetching weights toward the cache), and
// waits in wait_for_predecessor() until the kernel before it has finished and its writes are visible; every
// access to what earlier kernels write comes after that wait, in every thread block. Since each kernel waits
// for the whole of the one before it, which waited for its own predecessor, the order of the stream holds
// transitively. Before Hopper both are no-ops, and a HIP build launches plainly.
__device__ __forceinline__ void start_successor() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

__device__ __forceinline__ void wait_for_predecessor() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Asks for `bytes` from `p` (both multiples of 16) in L2 without waiting for them (Hopper's bulk copy unit):
// a kernel that streams a weight asks for its share up front, so that the whole share is in flight from
// device memory at once however few loads each lane keeps outstanding.
__device__ __forceinline__ void prefetch_to_l2(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
  (void)p;
  (void)bytes;
#endif
}

// kernel<<<grid, block, shared_bytes, stream>>>(args...) as a programmatic dependent launch (see above).
template <typename... Params, typename... Args>
void launch_overlapped(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                       gpuStream_t stream, Args... args) {
#if defined(ROCMFORGE_GPU_HIP)
  kernel<<<grid, block, shared_bytes, stream>>>(static_cast<Params>(args)...);
  check_launch(name);
#else
  cudaLaunchAttribute overlap{};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &overlap;
  config.numAttrs = 1;
  check(cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...), name);
#endif
}

}  // namespace rf::gpu
