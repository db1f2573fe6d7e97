// How the GPU kernels share out their work (threads a block, lanes and rows a group of lanes, loads in flight, when
// a launch takes which variant): one table per device family, each value named for what it decides. The values are
// those measured fastest on the family's devices (docs/PERFORMANCE.md has what was tried); tuning for another family
// is a new table here, not an edit of kernel code. Sizes that the data formats or the hardware fix (the warp width,
// a Q8_K block's 256 values, the 48 KiB of shared memory a launch has without asking) are not tunings and stay with
// the kernels.
#pragma once
#include <cstdint>

#include "gguf/tensor_type.h"

namespace rf::gpu::tuning {

#if defined(ROCMFORGE_GPU_HIP)
// AMD (HIP builds): the NVIDIA table's values, not yet tuned on an AMD device (the NVIDIA table below says what each
// value decides). HIP builds have no product chains.

// ---- matrix-vector products (matvec.cu) ----

inline constexpr int kMatvecThreads = 64;
inline constexpr int kMatvecMinBlocksPerMultiprocessorOneAccumulator = 12;
inline constexpr int kMatvecMinBlocksPerMultiprocessor = 8;
inline constexpr int kMatvecSliceBytesInFlight = 160;
inline constexpr int kMatvecMaxSlicesInFlight = 4;
inline constexpr int kMatvecMinQuarterSlicesPerLane = 16;
inline constexpr int kMatvecMinQuarterSlicesPerLaneSeveralRows = 7;
inline constexpr int kMatvecMaxChunksPerLane = 2;
inline constexpr int64_t kMatvecTwoTeamsAboveCols = 4096;
inline constexpr int64_t kMatvecFourRowBlocksPerMultiprocessor = 3;
template <TensorType T>
inline constexpr bool kMatvecFourRowSlices =
    T == TensorType::Q4_0 || T == TensorType::Q4_1 || T == TensorType::Q8_0 || T == TensorType::Q4_K;
inline constexpr uint64_t kMatvecPrefetchL2Divisor = 8;

// ---- chunk decoders (block_decoders.cuh) ----

inline constexpr int64_t kQ4KChunkMaxRowBlocks = 8;
inline constexpr int kQ4KChunksInFlight = 4;
inline constexpr int64_t kQ6KChunkMaxRowBlocks = INT64_MAX;
inline constexpr int kQ6KChunksInFlight = 2;

#else
// NVIDIA (CUDA builds), measured on an H200.

// ---- matrix-vector products (matvec.cu) ----

// Threads a thread block (two teams): a launch's last blocks finish one after another while the multiprocessors that
// are done wait, and smaller blocks shorten that tail (128 and 256 threads were slower, 32 too).
inline constexpr int kMatvecThreads = 64;
// Resident blocks a multiprocessor that the compiler keeps registers for (__launch_bounds__): a group of lanes with
// one accumulator can have more of them, one with a batch's or several rows' accumulators needs more registers.
inline constexpr int kMatvecMinBlocksPerMultiprocessorOneAccumulator = 12;
inline constexpr int kMatvecMinBlocksPerMultiprocessor = 8;
// Bytes of decoded slices a lane loads before it uses the first, at most kMatvecMaxSlicesInFlight slices: enough bytes
// in flight to saturate device memory, while the registers still leave room for enough resident warps.
inline constexpr int kMatvecSliceBytesInFlight = 160;
inline constexpr int kMatvecMaxSlicesInFlight = 4;
// Lanes a row are doubled (up to a team) only while each lane keeps at least this many slices on average, in quarters
// of a slice: more lanes give a launch more thread blocks, fewer slices a lane leave fewer loads in flight. A group
// that takes several rows loads a slice of each, so fewer suffice: 1.75 a lane, so that rows of 3584 Q4_K values (56
// slices) take a team (qwen2.5-7b decoded 7% faster than with 16 lanes a row and 3.5 slices a lane).
inline constexpr int kMatvecMinQuarterSlicesPerLane = 16;
inline constexpr int kMatvecMinQuarterSlicesPerLaneSeveralRows = 7;
// Chunks of a row a lane takes at most where a team suffices for the row: narrow rows get more lanes, and so their
// launches more thread blocks, instead of rounds of loads one after another.
inline constexpr int kMatvecMaxChunksPerLane = 2;
// Rows wider than this take two teams, which doubles the thread blocks of a product with few such rows (a launch of
// one and a third waves keeps the device a third idle in its second); rows of 4096 lost with two teams.
inline constexpr int64_t kMatvecTwoTeamsAboveCols = 4096;
// Four rows a group of lanes only where the launch then still has this many thread blocks a multiprocessor; smaller
// launches take two rows a group and twice the thread blocks.
inline constexpr int64_t kMatvecFourRowBlocksPerMultiprocessor = 3;
// The types whose products by slices take four rows a group where the launch has thread blocks enough: those whose
// slices decode in few instructions; the others gain more from rows of their own.
template <TensorType T>
inline constexpr bool kMatvecFourRowSlices =
    T == TensorType::Q4_0 || T == TensorType::Q4_1 || T == TensorType::Q8_0 || T == TensorType::Q4_K;
// A launch asks for its weights in L2 before its wait only where they take at most the L2's size over this: a larger
// prefetch is a burst that slows the small kernel before it, whose chains of dependent accesses it delays.
inline constexpr uint64_t kMatvecPrefetchL2Divisor = 8;

// ---- chunk decoders (block_decoders.cuh) ----

// Q4_K rows of at most this many blocks (2048 values) go by chunks, wider ones by slices: slices decode the header
// once for 32 bytes a lane, but would leave narrow rows only four lanes.
inline constexpr int64_t kQ4KChunkMaxRowBlocks = 8;
// Q4_K chunks a lane loads before it decodes the first: a raw chunk holds only 8 registers, so four fit in flight.
inline constexpr int kQ4KChunksInFlight = 4;
// Q6_K rows go by chunks at every width: by slices they were slower.
inline constexpr int64_t kQ6KChunkMaxRowBlocks = INT64_MAX;
// Q6_K chunks a lane loads before it decodes the first: three or four ran the down products slower than two.
inline constexpr int kQ6KChunksInFlight = 2;

// ---- 8-bit tensor-core products (matmul_q8.cu) ----

// A matrix whose row tiles give fewer thread blocks than this a multiprocessor splits K until it has them: a thread
// block stages one K tile at a time, so a multiprocessor needs several blocks in flight to keep device memory busy.
inline constexpr int64_t kMatmulQ8BlocksPerMultiprocessor = 4;

// ---- product chains (product_chain.cu; CUDA on Hopper only) ----

// Consumer warps a block, besides its producer: twelve consume a stage as fast as device memory fills it; eight, ten,
// sixteen and twenty-four were slower.
inline constexpr int kChainConsumerWarps = 12;
// The ring of shared-memory stages a producer fills ahead of its consumers: five of 32 KiB hold about 5 µs of a
// multiprocessor's share of the bandwidth, enough to hide a step boundary; four hid less, six no more.
inline constexpr int kChainStages = 5;
inline constexpr int kChainStageBytes = 32 * 1024;
#endif

}  // namespace rf::gpu::tuning
