// AVX2 dot-product kernels, with the AVX-VNNI / AVX-512 VNNI form of the multiply-add steps where the build
// has it. Each kernel reads a block's quants with a few loads, turns them into bytes, multiplies bytes
// pairwise with the activation bytes into 16-bit sums (maddubs: unsigned x signed), widens those with the
// sub-block scale as multiplier into 32-bit sums (madd), and applies the float scales once per block.
// Zero-centred levels are handled by multiplying |w| by sign(w) * a, which keeps maddubs' unsigned operand
// unsigned; levels with a constant offset (Q3_K, Q6_K) are taken unsigned and the offset comes off through
// the activation block sums. 512-bit registers measured no faster for Q4_K on the target machine (the
// kernels are bound by instruction throughput, and 512-bit operations issue on fewer ports).
//
// The kernels of the most used types are written for R activation rows at once: a weight block is unpacked
// (nibbles split, scales widened and broadcast) once and multiplied with each row, which roughly halves the
// work per row of a batch. vec_dot is the R = 1 form of the same code, so the two agree bit for bit. Prompts
// go through the tile kernels at the end of the file (Q4_K, Q5_K, Q6_K), which multiply 8 weight rows with
// one token per instruction.
#include "backend/cpu/vec_dot.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "quant/blocks.h"

namespace rf::cpu {
namespace {

using namespace rf::quant;

// VNNI fuses the widening multiply-adds with the accumulation: AVX-512 VNNI's 256-bit forms, or AVX-VNNI's.
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define RF_VNNI 1
constexpr const char* kKernelName = "avx2+avx512vnni";
__m256i vnni_u8_i8(__m256i sum, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(sum, u, s); }
__m256i vnni_i16_i16(__m256i sum, __m256i a, __m256i b) { return _mm256_dpwssd_epi32(sum, a, b); }
#elif defined(__AVXVNNI__)
#define RF_VNNI 1
constexpr const char* kKernelName = "avx2+avxvnni";
__m256i vnni_u8_i8(__m256i sum, __m256i u, __m256i s) { return _mm256_dpbusd_avx_epi32(sum, u, s); }
__m256i vnni_i16_i16(__m256i sum, __m256i a, __m256i b) { return _mm256_dpwssd_avx_epi32(sum, a, b); }
#else
constexpr const char* kKernelName = "avx2";
#endif

float half(uint16_t h) { return _cvtsh_ss(h); }

// The lanes of v folded by `op` (a lane-wise add, max or min), as one float.
template <typename Op>
float horizontal(__m128 v, Op op) {
  const __m128 pairs = op(v, _mm_movehl_ps(v, v));
  return _mm_cvtss_f32(op(pairs, _mm_movehdup_ps(pairs)));
}

template <typename Op>
float horizontal(__m256 v, Op op) {
  return horizontal(op(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)), op);
}

constexpr auto kAdd = [](__m128 a, __m128 b) { return _mm_add_ps(a, b); };
constexpr auto kMax = [](__m128 a, __m128 b) { return _mm_max_ps(a, b); };
constexpr auto kMin = [](__m128 a, __m128 b) { return _mm_min_ps(a, b); };

float horizontal_sum(__m128 v) { return horizontal(v, kAdd); }
float horizontal_sum(__m256 v) { return horizontal(v, kAdd); }

__m256i load(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// A matrix-vector product (decoding) streams the weights from memory once. The hardware prefetcher alone keeps
// too few lines in flight for a core that also spends time on arithmetic (a product then reaches about 60%
// of a plain read's bandwidth), so each block asks for the block 4 KB ahead. Asking per block spreads the
// requests evenly; a burst per row measured ~15% slower, and 2 or 8 KB ahead or L2-only hints no faster.
constexpr size_t kPrefetchDistance = 4096;

// The cache lines of `bytes` bytes from p, to L1.
void prefetch(const void* p, size_t bytes) {
  const char* first = static_cast<const char*>(p);
  for (size_t offset = 0; offset < bytes; offset += 64) _mm_prefetch(first + offset, _MM_HINT_T0);
}

// Called with each weight block (`bytes` long) as a kernel reaches it.
void prefetch_ahead(const void* block, size_t bytes) {
  prefetch(static_cast<const char*>(block) + kPrefetchDistance, bytes);
}

// Activation row r of a group, as blocks.
template <typename Block>
const Block* activation_row(const uint8_t* activations, size_t stride, int r) {
  return reinterpret_cast<const Block*>(activations + static_cast<size_t>(r) * stride);
}

// Multi-row kernels are types with `template <int R> static void rows(weight_row, activations, stride, n, out,
// out_stride)` computing R dot products. Groups of four rows: two measured 20% slower per row, six or eight
// no faster (a block's unpacked levels and scales and the rows' accumulators then outgrow the registers).
constexpr int kMaxRows = 4;

template <typename Kernel>
float dot_one_row(const void* w, const void* a, int64_t n) {
  float out;
  Kernel::template rows<1>(w, static_cast<const uint8_t*>(a), 0, n, &out, 0);
  return out;
}

// The last count < kMaxRows rows of a group.
template <typename Kernel, int R = kMaxRows - 1>
void dot_remaining_rows(const void* w, const uint8_t* a, size_t stride, int64_t count, int64_t n, float* out,
                        int64_t out_stride) {
  if constexpr (R > 0) {
    if (count == R)
      Kernel::template rows<R>(w, a, stride, n, out, out_stride);
    else
      dot_remaining_rows<Kernel, R - 1>(w, a, stride, count, n, out, out_stride);
  }
}

template <typename Kernel>
void dot_rows(const void* w, const void* a, size_t stride, int64_t count, int64_t n, float* out, int64_t out_stride) {
  const auto* acts = static_cast<const uint8_t*>(a);
  int64_t t = 0;
  for (; t + kMaxRows <= count; t += kMaxRows)
    Kernel::template rows<kMaxRows>(w, acts + t * stride, stride, n, out + t * out_stride, out_stride);
  dot_remaining_rows<Kernel>(w, acts + t * stride, stride, count - t, n, out + t * out_stride, out_stride);
}

// sum += pairs * multipliers, 16-bit lanes widened to 32 (one instruction with VNNI).
__m256i add_products_i16(__m256i sum, __m256i pairs, __m256i multipliers) {
#ifdef RF_VNNI
  return vnni_i16_i16(sum, pairs, multipliers);
#else
  return _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, multipliers));
#endif
}

// 8 sums of 4 products of unsigned bytes u with signed bytes s.
__m256i dot_u8_i8(__m256i u, __m256i s) {
#ifdef RF_VNNI
  return vnni_u8_i8(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

// The 32 nibbles of 16 bytes, element order of the 32-element blocks: low nibbles then high nibbles.
__m256i nibbles_32(const uint8_t* qs) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(bytes, 4), bytes);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// Byte j = 0x10 where bit j of the little-endian u32 at qh is set (the fifth bit of Q5_0 / Q5_1): spread
// byte k of the word over output bytes 8k..8k+7, then keep in byte j only bit j % 8. (AVX-512's movm would
// take the word as a mask, but a mask load that crosses a cache line, as Q5_0's 22-byte blocks often do, is
// slow.)
__m256i fifth_bits_32(const uint8_t* qh) {
  uint32_t bits;
  std::memcpy(&bits, qh, sizeof(bits));
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i bit_of_byte = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit_of_byte), bit_of_byte);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

// IQ4_NL levels for 32 nibbles (16-entry table lookup per 128-bit lane).
__m256i iq4_levels(__m256i nibbles) {
  const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4NLValues));
  return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(table), nibbles);
}

// ---- float weights, f32 activations ------------------------------------------------------------------------

// Elements i..i+7 of an F32, F16 or BF16 row as f32.
template <TensorType kType>
__m256 load8(const void* row, int64_t i) {
  if constexpr (kType == TensorType::F32) {
    return _mm256_loadu_ps(static_cast<const float*>(row) + i);
  } else {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + i));
    if constexpr (kType == TensorType::F16) return _mm256_cvtph_ps(raw);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));  // BF16: an f32's top half
  }
}

// Four independent accumulators hide the FMA latency; the last n % 8 elements go to the portable kernel.
template <TensorType kType>
float dot_float(const void* w, const void* a, int64_t n) {
  constexpr int64_t kElementBytes = kType == TensorType::F32 ? 4 : 2;
  const auto* x = static_cast<const float*>(a);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    prefetch_ahead(static_cast<const uint8_t*>(w) + i * kElementBytes, 32 * kElementBytes);
    for (int k = 0; k < 4; ++k)
      acc[k] = _mm256_fmadd_ps(load8<kType>(w, i + 8 * k), _mm256_loadu_ps(x + i + 8 * k), acc[k]);
  }
  for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(load8<kType>(w, i), _mm256_loadu_ps(x + i), acc[0]);
  float sum = horizontal_sum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  if (i < n) sum += portable_vec_dot_kernel(kType)(static_cast<const uint8_t*>(w) + i * kElementBytes, x + i, n - i);
  return sum;
}

// ---- 32-element blocks, Q8_0 activations ----------------------------------------------------------------

// Signed levels of the zero-centred types (x = d * level).
__m256i levels_of(const BlockQ4_0& b) { return _mm256_sub_epi8(nibbles_32(b.qs), _mm256_set1_epi8(8)); }
__m256i levels_of(const BlockQ5_0& b) {
  return _mm256_sub_epi8(_mm256_or_si256(nibbles_32(b.qs), fifth_bits_32(b.qh)), _mm256_set1_epi8(16));
}
__m256i levels_of(const BlockQ8_0& b) { return load(b.qs); }
__m256i levels_of(const BlockIQ4_NL& b) { return iq4_levels(nibbles_32(b.qs)); }

// Blocks alternate between two sets of accumulators so that consecutive blocks do not wait on each other's
// FMAs.
template <typename Block>
struct Symmetric {
  template <int R>
  static void rows(const void* w, const uint8_t* a, size_t stride, int64_t n, float* out, int64_t out_stride) {
    const auto* weights = static_cast<const Block*>(w);
    __m256 acc[2][R];
    for (int r = 0; r < R; ++r) acc[0][r] = acc[1][r] = _mm256_setzero_ps();
    const int64_t blocks = n / kBlock;
    const auto accumulate = [&](int64_t b, __m256(&sums)[R]) {
      prefetch_ahead(&weights[b], sizeof(weights[b]));
      const __m256i levels = levels_of(weights[b]);
      const __m256i magnitudes = _mm256_sign_epi8(levels, levels);
      const float dw = half(weights[b].d);
      for (int r = 0; r < R; ++r) {
        const BlockQ8_0& ab = activation_row<BlockQ8_0>(a, stride, r)[b];
        // Signed levels times signed quants: |w| * (a with w's sign).
        const __m256i products = dot_u8_i8(magnitudes, _mm256_sign_epi8(load(ab.qs), levels));
        sums[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * half(ab.d)), _mm256_cvtepi32_ps(products), sums[r]);
      }
    };
    int64_t b = 0;
    for (; b + 2 <= blocks; b += 2) {
      accumulate(b, acc[0]);
      accumulate(b + 1, acc[1]);
    }
    if (b < blocks) accumulate(b, acc[0]);
    for (int r = 0; r < R; ++r) out[r * out_stride] = horizontal_sum(_mm256_add_ps(acc[0][r], acc[1][r]));
  }
};

// The kernels of the types with a minimum, one block at a time.
template <typename Accumulate>
float sum_over_blocks(int64_t blocks, Accumulate accumulate) {
  __m256 acc0 = _mm256_setzero_ps();
  __m256 acc1 = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= blocks; b += 2) {
    acc0 = accumulate(b, acc0);
    acc1 = accumulate(b + 1, acc1);
  }
  if (b < blocks) acc0 = accumulate(b, acc0);
  return horizontal_sum(_mm256_add_ps(acc0, acc1));
}

// Unsigned levels of the types with a minimum (x = d * level + m).
__m256i levels_of(const BlockQ4_1& b) { return nibbles_32(b.qs); }
__m256i levels_of(const BlockQ5_1& b) { return _mm256_or_si256(nibbles_32(b.qs), fifth_bits_32(b.qh)); }

// The minimum multiplies the plain sum of the block's activation quants.
template <typename Block>
float dot_with_min(const void* w, const void* a, int64_t n) {
  const auto* weights = static_cast<const Block*>(w);
  const auto* acts = static_cast<const BlockQ8_0*>(a);
  const __m256i ones = _mm256_set1_epi8(1);
  return sum_over_blocks(n / kBlock, [&](int64_t b, __m256 acc) {
    prefetch_ahead(&weights[b], sizeof(weights[b]));
    const float da = half(acts[b].d);
    const __m256i q8 = load(acts[b].qs);
    const __m256 products = _mm256_cvtepi32_ps(dot_u8_i8(levels_of(weights[b]), q8));
    const __m256 sums = _mm256_cvtepi32_ps(dot_u8_i8(ones, q8));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(half(weights[b].d) * da), products, acc);
    return _mm256_fmadd_ps(_mm256_set1_ps(half(weights[b].m) * da), sums, acc);
  });
}

// ---- super-blocks, Q8_K activations ----------------------------------------------------------------------

// Multipliers for one 32-byte register spanning two 16-element sub-blocks s and s + 1 (Q2_K, Q3_K, Q6_K):
// 16-bit lanes 0-7 (bytes 0-15 after maddubs) get scales8[s], lanes 8-15 get scales8[s + 1].
__m256i sub_block_pair_scales(__m128i scales8, int s) {
  const __m128i pattern =
      _mm_add_epi8(_mm_set1_epi8(static_cast<char>(s)), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
  return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales8, pattern));
}

// sum over 16-element sub-blocks of scales8[s] * bsums[s]: the correction for a constant level offset.
__m256i scaled_bsums(__m128i scales8, const BlockQ8_K& act) {
  return _mm256_madd_epi16(_mm256_cvtepi8_epi16(scales8), load(act.bsums));
}

float dot_q2_k(const void* w, const void* a, int64_t n) {
  const auto* weights = static_cast<const BlockQ2_K*>(w);
  const auto* acts = static_cast<const BlockQ8_K*>(a);
  const __m256i mask2 = _mm256_set1_epi8(3);
  __m256 acc = _mm256_setzero_ps();
  __m256 acc_min = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const BlockQ2_K& wb = weights[b];
    const BlockQ8_K& ab = acts[b];
    prefetch_ahead(&wb, sizeof(wb));
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb.scales));
    const __m128i scales8 = _mm_and_si128(packed, _mm_set1_epi8(0x0F));
    const __m128i mins8 = _mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(0x0F));
    acc_min =
        _mm256_fmadd_ps(_mm256_set1_ps(ab.d * half(wb.dmin)), _mm256_cvtepi32_ps(scaled_bsums(mins8, ab)), acc_min);
    __m256i sum = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      __m256i bits = load(wb.qs + 32 * h);
      for (int k = 0; k < 4; ++k, bits = _mm256_srli_epi16(bits, 2)) {
        const __m256i levels = _mm256_and_si256(bits, mask2);
        const __m256i pairs = _mm256_maddubs_epi16(levels, load(ab.qs + 128 * h + 32 * k));
        sum = add_products_i16(sum, pairs, sub_block_pair_scales(scales8, 8 * h + 2 * k));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(ab.d * half(wb.d)), _mm256_cvtepi32_ps(sum), acc);
  }
  return horizontal_sum(_mm256_sub_ps(acc, acc_min));
}

float dot_q3_k(const void* w, const void* a, int64_t n) {
  const auto* weights = static_cast<const BlockQ3_K*>(w);
  const auto* acts = static_cast<const BlockQ8_K*>(a);
  const __m256i mask2 = _mm256_set1_epi8(3);
  const __m256i bit2 = _mm256_set1_epi8(4);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const BlockQ3_K& wb = weights[b];
    const BlockQ8_K& ab = acts[b];
    prefetch_ahead(&wb, sizeof(wb));
    const Q3KScaleWords biased = q3_k_scale_words(wb.scales);
    const __m128i scales8 =
        _mm_sub_epi8(_mm_setr_epi32(static_cast<int>(biased.word[0]), static_cast<int>(biased.word[1]),
                                    static_cast<int>(biased.word[2]), static_cast<int>(biased.word[3])),
                     _mm_set1_epi8(32));
    // Levels are taken as 0..7 (low bits | high bit << 2); the -4 comes off through the block sums.
    __m256i sum = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(scaled_bsums(scales8, ab), 2));
    __m256i high = load(wb.hmask);  // bit 4h + k of byte l: the high bit of element 128h + 32k + l
    for (int h = 0; h < 2; ++h) {
      __m256i bits = load(wb.qs + 32 * h);
      for (int k = 0; k < 4; ++k, bits = _mm256_srli_epi16(bits, 2), high = _mm256_srli_epi16(high, 1)) {
        const __m256i high_bit = _mm256_and_si256(_mm256_slli_epi16(high, 2), bit2);
        const __m256i levels = _mm256_or_si256(_mm256_and_si256(bits, mask2), high_bit);
        const __m256i pairs = _mm256_maddubs_epi16(levels, load(ab.qs + 128 * h + 32 * k));
        sum = add_products_i16(sum, pairs, sub_block_pair_scales(scales8, 8 * h + 2 * k));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(ab.d * half(wb.d)), _mm256_cvtepi32_ps(sum), acc);
  }
  return horizontal_sum(acc);
}

// Q4_K / Q5_K: the activation sums of each 32-element sub-block (pairs of the 16-element bsums), 16 bits.
__m128i sub_block_sums_32(const BlockQ8_K& act) {
  const __m256i bsums = load(act.bsums);
  return _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256(bsums, 1));
}

// The 16-bit multiplier vector holding scale j in every lane, from 8 scales widened to 16 bits in each half.
__m256i broadcast_scale(__m256i scales16, int j) {
  return _mm256_shuffle_epi8(scales16, _mm256_set1_epi16(static_cast<int16_t>((2 * j + 1) << 8 | 2 * j)));
}

// Levels of Q4_K (0..15) or Q5_K (0..31, a fifth bit) in element order, sub-block j in levels[j]. The 32 bytes
// qs[32p..] hold sub-block 2p in their low nibbles and sub-block 2p + 1 in their high nibbles. (Inlined by
// force: a call in the row kernels' loop measured 2% of decoding.)
template <typename Block>
[[gnu::always_inline]] inline void k_levels(const Block& wb, __m256i (&levels)[8]) {
  const __m256i mask4 = _mm256_set1_epi8(0x0F);
  __m256i fifth = _mm256_setzero_si256();
  if constexpr (std::is_same_v<Block, BlockQ5_K>) fifth = load(wb.qh);  // bit j of byte l: element 32j + l
  for (int p = 0; p < 4; ++p) {
    const __m256i q4 = load(wb.qs + 32 * p);
    levels[2 * p] = _mm256_and_si256(q4, mask4);
    levels[2 * p + 1] = _mm256_and_si256(_mm256_srli_epi16(q4, 4), mask4);
    if constexpr (std::is_same_v<Block, BlockQ5_K>) {
      const __m256i bit4 = _mm256_set1_epi8(0x10);
      levels[2 * p] = _mm256_or_si256(levels[2 * p], _mm256_and_si256(_mm256_slli_epi16(fifth, 4), bit4));
      levels[2 * p + 1] = _mm256_or_si256(levels[2 * p + 1], _mm256_and_si256(_mm256_slli_epi16(fifth, 3), bit4));
      fifth = _mm256_srli_epi16(fifth, 2);
    }
  }
}

// Q4_K and Q5_K, alike but for Q5_K's fifth bit.
template <typename Block>
struct ScaleMin {
  template <int R>
  static void rows(const void* w, const uint8_t* a, size_t stride, int64_t n, float* out, int64_t out_stride) {
    const auto* weights = static_cast<const Block*>(w);
    __m256 acc[R];
    __m128 acc_min[R];
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm256_setzero_ps();
      acc_min[r] = _mm_setzero_ps();
    }
    for (int64_t b = 0; b < n / kSuperBlock; ++b) {
      const Block& wb = weights[b];
      prefetch_ahead(&wb, sizeof(wb));
      // Scales widened to 16 bits in both halves, mins in the high half.
      const KScalesMins sm = unpack_k_scales_mins(wb.scales);
      const __m256i scales_mins =
          _mm256_cvtepu8_epi16(_mm_setr_epi32(static_cast<int>(sm.word[0]), static_cast<int>(sm.word[1]),
                                              static_cast<int>(sm.word[2]), static_cast<int>(sm.word[3])));
      const __m256i scales16 = _mm256_permute2x128_si256(scales_mins, scales_mins, 0x00);
      const __m128i mins16 = _mm256_extracti128_si256(scales_mins, 1);
      // d and dmin are adjacent halves: one conversion gives both.
      uint32_t d_dmin_halves;
      std::memcpy(&d_dmin_halves, &wb.d, sizeof(d_dmin_halves));
      const __m128 d_dmin_weight = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(d_dmin_halves)));
      // Levels and scale multipliers of sub-block j.
      __m256i levels[8];
      __m256i scales[8];
      k_levels(wb, levels);
      for (int j = 0; j < 8; ++j) scales[j] = broadcast_scale(scales16, j);
      for (int r = 0; r < R; ++r) {
        const BlockQ8_K& ab = activation_row<BlockQ8_K>(a, stride, r)[b];
        const __m128 d_dmin = _mm_mul_ps(d_dmin_weight, _mm_set1_ps(ab.d));
        const __m128i min_products = _mm_madd_epi16(mins16, sub_block_sums_32(ab));
        acc_min[r] = _mm_fmadd_ps(_mm_permute_ps(d_dmin, 0x55), _mm_cvtepi32_ps(min_products), acc_min[r]);
        // Two chains of multiply-adds (even and odd sub-blocks) halve the latency of the row's integer sum.
        __m256i sums[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        for (int j = 0; j < 8; ++j)
          sums[j % 2] = add_products_i16(sums[j % 2], _mm256_maddubs_epi16(levels[j], load(ab.qs + 32 * j)), scales[j]);
        const __m256i sum = _mm256_add_epi32(sums[0], sums[1]);
        acc[r] = _mm256_fmadd_ps(_mm256_broadcastss_ps(d_dmin), _mm256_cvtepi32_ps(sum), acc[r]);
      }
    }
    for (int r = 0; r < R; ++r) out[r * out_stride] = horizontal_sum(acc[r]) - horizontal_sum(acc_min[r]);
  }
};

// Q6_K levels 0..63 of elements 32c .. 32c + 31 (sub-blocks 2c and 2c + 1) in levels[c].
[[gnu::always_inline]] inline void q6_k_levels(const BlockQ6_K& wb, __m256i (&levels)[8]) {
  const __m256i mask4 = _mm256_set1_epi8(0x0F);
  const __m256i mask_high = _mm256_set1_epi8(0x30);
  for (int h = 0; h < 2; ++h) {
    const __m256i low01 = load(wb.ql + 64 * h);       // elements 128h + 32k for k = 0 (low nibbles), 2 (high)
    const __m256i low23 = load(wb.ql + 64 * h + 32);  // k = 1 and k = 3
    const __m256i high = load(wb.qh + 32 * h);        // 2 bits per k at bit 2k
    levels[4 * h] =
        _mm256_or_si256(_mm256_and_si256(low01, mask4), _mm256_and_si256(_mm256_slli_epi16(high, 4), mask_high));
    levels[4 * h + 1] =
        _mm256_or_si256(_mm256_and_si256(low23, mask4), _mm256_and_si256(_mm256_slli_epi16(high, 2), mask_high));
    levels[4 * h + 2] =
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(low01, 4), mask4), _mm256_and_si256(high, mask_high));
    levels[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(low23, 4), mask4),
                                        _mm256_and_si256(_mm256_srli_epi16(high, 2), mask_high));
  }
}

struct Q6K {
  template <int R>
  static void rows(const void* w, const uint8_t* a, size_t stride, int64_t n, float* out, int64_t out_stride) {
    const auto* weights = static_cast<const BlockQ6_K*>(w);
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / kSuperBlock; ++b) {
      const BlockQ6_K& wb = weights[b];
      prefetch_ahead(&wb, sizeof(wb));
      const __m128i scales8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb.scales));
      const __m256i scales16 = _mm256_cvtepi8_epi16(scales8);
      // Levels taken as 0..63 (the -32 comes off through the block sums) and the multipliers of their two
      // 16-element sub-blocks.
      __m256i levels[8];
      __m256i scales[8];
      q6_k_levels(wb, levels);
      for (int k = 0; k < 8; ++k) scales[k] = sub_block_pair_scales(scales8, 2 * k);
      const float dw = half(wb.d);
      for (int r = 0; r < R; ++r) {
        const BlockQ8_K& ab = activation_row<BlockQ8_K>(a, stride, r)[b];
        // sum over 16-element sub-blocks of scale * bsum, times the level offset 32.
        __m256i sum = _mm256_sub_epi32(_mm256_setzero_si256(),
                                       _mm256_slli_epi32(_mm256_madd_epi16(scales16, load(ab.bsums)), 5));
        __m256i odd = _mm256_setzero_si256();  // a second chain of multiply-adds, as in ScaleMin
        for (int k = 0; k < 8; k += 2) {
          sum = add_products_i16(sum, _mm256_maddubs_epi16(levels[k], load(ab.qs + 32 * k)), scales[k]);
          odd = add_products_i16(odd, _mm256_maddubs_epi16(levels[k + 1], load(ab.qs + 32 * k + 32)), scales[k + 1]);
        }
        sum = _mm256_add_epi32(sum, odd);
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(ab.d * dw), _mm256_cvtepi32_ps(sum), acc[r]);
      }
    }
    for (int r = 0; r < R; ++r) out[r * out_stride] = horizontal_sum(acc[r]);
  }
};

// ---- tiles: kTileRows weight rows against many activation rows (prompt processing) --------------------------
//
// A prompt's products are bound by arithmetic, and the row kernels above spend most of theirs widening 16-bit
// products and applying sub-block scales per (weight row, token). A tile kernel unpacks one block of 8 weight
// rows into levels interleaved across the rows (dword r of levels[g] holds elements 4g .. 4g + 3 of row r),
// so one vpdpbusd multiplies four levels of all 8 rows with the same four activation bytes of one token:
// 32 multiply-adds per instruction with nothing to widen. The sub-block scales become float vectors over the
// rows, applied once per sub-block and token; minimums (Q4_K, Q5_K) and the level offset (Q6_K) meet the
// activations' 16-element sums through vpdpwssd. The sums are rounded in another order than vec_dot's, so
// results agree to float rounding, not bit for bit.
#ifdef RF_VNNI

// v[r] dword g -> v[g] dword r, for 8 vectors of 8 dwords.
void transpose_8x8(__m256i (&v)[8]) {
  __m256i t[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(v[i], v[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(v[i], v[i + 1]);
  }
  __m256i u[8];
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
    u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
    u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
    u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x20);
    v[i + 4] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x31);
  }
}

__m256i broadcast_dword(const void* p) {
  int32_t x;
  std::memcpy(&x, p, sizeof(x));
  return _mm256_set1_epi32(x);
}

// One block of a tile, unpacked: lane r of every vector belongs to weight row r.
template <int kSubBlockElements>
struct TileBlock {
  static constexpr int kSubBlocks = kSuperBlock / kSubBlockElements;
  __m256i levels[kSuperBlock / 4];  // unsigned levels, four elements per dword
  __m256 scales[kSubBlocks];        // d * sub-block scale
  // The offset term: dword k pairs the 16-bit multipliers of the activation sums bsums[2k] and bsums[2k + 1];
  // their sum over k, times offset_scale, is added to the row's sum.
  __m256i offset_multipliers[kSuperBlock / 32];
  __m256 offset_scale;
};

// Levels of 8 rows' 32-element pieces: rows[r][c] holds elements 32c .. 32c + 31 of row r.
template <int kSubBlockElements>
void interleave_levels(__m256i (&rows)[kTileRows][8], TileBlock<kSubBlockElements>& tile) {
  for (int c = 0; c < 8; ++c) {
    __m256i v[8];
    for (int r = 0; r < kTileRows; ++r) v[r] = rows[r][c];
    transpose_8x8(v);
    for (int g = 0; g < 8; ++g) tile.levels[8 * c + g] = v[g];
  }
}

// Eight values per row (lane i of rows[r]) -> lane r of vector i.
void interleave_values(__m256i (&rows)[kTileRows], __m256i* out) {
  transpose_8x8(rows);
  for (int i = 0; i < 8; ++i) out[i] = rows[i];
}

// Block b of row r. A tile's 8 rows are 8 streams the hardware prefetcher does not follow between two
// blocks, so the next block of the row (or, after its last, the bytes that follow) is requested now: it
// arrives while the tokens are multiplied with this one.
template <typename Block>
const Block& tile_block(const uint8_t* w, size_t row_bytes, int r, int64_t b) {
  const Block* block = reinterpret_cast<const Block*>(w + static_cast<size_t>(r) * row_bytes) + b;
  prefetch(block + 1, sizeof(Block));
  return *block;
}

// Q4_K, Q5_K: x = d * scale[j] * level - dmin * min[j], 32-element sub-blocks.
template <typename Block>
void unpack_tile(const uint8_t* w, size_t row_bytes, int64_t b, TileBlock<32>& tile) {
  __m256i levels[kTileRows][8];
  __m256i scales[kTileRows];
  __m256i mins[kTileRows];
  alignas(32) float d[kTileRows];
  alignas(32) float dmin[kTileRows];
  for (int r = 0; r < kTileRows; ++r) {
    const Block& wb = tile_block<Block>(w, row_bytes, r, b);
    k_levels(wb, levels[r]);
    const KScalesMins sm = unpack_k_scales_mins(wb.scales);
    scales[r] = _mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, static_cast<int>(sm.word[1]), static_cast<int>(sm.word[0])));
    mins[r] = _mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, static_cast<int>(sm.word[3]), static_cast<int>(sm.word[2])));
    d[r] = half(wb.d);
    dmin[r] = half(wb.dmin);
  }
  interleave_levels(levels, tile);
  __m256i by_sub_block[8];
  interleave_values(scales, by_sub_block);
  for (int j = 0; j < 8; ++j) tile.scales[j] = _mm256_mul_ps(_mm256_cvtepi32_ps(by_sub_block[j]), _mm256_load_ps(d));
  // min[j] against bsums[2j] + bsums[2j + 1]: the same multiplier in both halves of dword j.
  interleave_values(mins, by_sub_block);
  for (int j = 0; j < 8; ++j)
    tile.offset_multipliers[j] = _mm256_or_si256(by_sub_block[j], _mm256_slli_epi32(by_sub_block[j], 16));
  tile.offset_scale = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_load_ps(dmin));
}

// Q6_K: x = d * scale[j] * (level - 32), 16-element sub-blocks.
void unpack_tile_q6_k(const uint8_t* w, size_t row_bytes, int64_t b, TileBlock<16>& tile) {
  __m256i levels[kTileRows][8];
  __m256i scales_low[kTileRows];   // scales 0-7, 32 bits each
  __m256i scales_high[kTileRows];  // scales 8-15
  __m256i scale_pairs[kTileRows];  // scales 0-15, 16 bits each
  alignas(32) float d[kTileRows];
  for (int r = 0; r < kTileRows; ++r) {
    const BlockQ6_K& wb = tile_block<BlockQ6_K>(w, row_bytes, r, b);
    q6_k_levels(wb, levels[r]);
    const __m128i scales8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb.scales));
    scales_low[r] = _mm256_cvtepi8_epi32(scales8);
    scales_high[r] = _mm256_cvtepi8_epi32(_mm_unpackhi_epi64(scales8, scales8));
    scale_pairs[r] = _mm256_cvtepi8_epi16(scales8);
    d[r] = half(wb.d);
  }
  interleave_levels(levels, tile);
  const __m256 dv = _mm256_load_ps(d);
  __m256i by_sub_block[8];
  interleave_values(scales_low, by_sub_block);
  for (int j = 0; j < 8; ++j) tile.scales[j] = _mm256_mul_ps(_mm256_cvtepi32_ps(by_sub_block[j]), dv);
  interleave_values(scales_high, by_sub_block);
  for (int j = 0; j < 8; ++j) tile.scales[8 + j] = _mm256_mul_ps(_mm256_cvtepi32_ps(by_sub_block[j]), dv);
  interleave_values(scale_pairs, tile.offset_multipliers);
  tile.offset_scale = _mm256_mul_ps(dv, _mm256_set1_ps(-32.0f));
}

// Adds block b of R tokens' dot products with the tile's 8 rows to out[t * out_stride + 0..7].
template <int kSubBlockElements, int R>
void accumulate_tile(const TileBlock<kSubBlockElements>& tile, const uint8_t* a, size_t stride, int64_t b, float* out,
                     int64_t out_stride) {
  constexpr int kGroups = kSubBlockElements / 4;
  const BlockQ8_K* act[R];
  __m256 sums[R];
  __m256i offsets[R];
  for (int t = 0; t < R; ++t) {
    act[t] = &activation_row<BlockQ8_K>(a, stride, t)[b];
    sums[t] = _mm256_setzero_ps();
    offsets[t] = _mm256_setzero_si256();
  }
  for (int j = 0; j < TileBlock<kSubBlockElements>::kSubBlocks; ++j) {
    // Two chains of multiply-adds per token (even and odd groups): with R tokens, 2R independent chains keep
    // the multiply-add units busy through each instruction's latency.
    __m256i dots[2][R];
    for (int t = 0; t < R; ++t) dots[0][t] = dots[1][t] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int g = 0; g < kGroups; ++g) {
      const int group = kGroups * j + g;
#pragma GCC unroll 8
      for (int t = 0; t < R; ++t)
        dots[g % 2][t] = vnni_u8_i8(dots[g % 2][t], tile.levels[group], broadcast_dword(act[t]->qs + 4 * group));
    }
#pragma GCC unroll 8
    for (int t = 0; t < R; ++t)
      sums[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(dots[0][t], dots[1][t])), tile.scales[j], sums[t]);
  }
#pragma GCC unroll 8
  for (int k = 0; k < kSuperBlock / 32; ++k)
#pragma GCC unroll 8
    for (int t = 0; t < R; ++t)
      offsets[t] = vnni_i16_i16(offsets[t], tile.offset_multipliers[k], broadcast_dword(act[t]->bsums + 2 * k));
  for (int t = 0; t < R; ++t) {
    const __m256 row_sums = _mm256_fmadd_ps(_mm256_cvtepi32_ps(offsets[t]), tile.offset_scale, sums[t]);
    float* o = out + t * out_stride;
    _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_set1_ps(act[t]->d), row_sums, _mm256_loadu_ps(o)));
  }
}

// Tokens in groups of eight (then four, then one) share each level vector they load.
template <int kSubBlockElements, auto unpack>
void dot_tile(const void* w, size_t row_bytes, const void* a, size_t stride, int64_t count, int64_t n, float* out,
              int64_t out_stride) {
  const auto* weights = static_cast<const uint8_t*>(w);
  const auto* acts = static_cast<const uint8_t*>(a);
  for (int64_t t = 0; t < count; ++t) _mm256_storeu_ps(out + t * out_stride, _mm256_setzero_ps());
  TileBlock<kSubBlockElements> tile;
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    unpack(weights, row_bytes, b, tile);
    int64_t t = 0;
    for (; t + 8 <= count; t += 8)
      accumulate_tile<kSubBlockElements, 8>(tile, acts + t * stride, stride, b, out + t * out_stride, out_stride);
    for (; t + 4 <= count; t += 4)
      accumulate_tile<kSubBlockElements, 4>(tile, acts + t * stride, stride, b, out + t * out_stride, out_stride);
    for (; t < count; ++t)
      accumulate_tile<kSubBlockElements, 1>(tile, acts + t * stride, stride, b, out + t * out_stride, out_stride);
  }
}

constexpr VecDotTileFn kQ4KTile = dot_tile<32, unpack_tile<BlockQ4_K>>;
constexpr VecDotTileFn kQ5KTile = dot_tile<32, unpack_tile<BlockQ5_K>>;
constexpr VecDotTileFn kQ6KTile = dot_tile<16, unpack_tile_q6_k>;
#else
constexpr VecDotTileFn kQ4KTile = nullptr;
constexpr VecDotTileFn kQ5KTile = nullptr;
constexpr VecDotTileFn kQ6KTile = nullptr;
#endif

float dot_iq4_xs(const void* w, const void* a, int64_t n) {
  const auto* weights = static_cast<const BlockIQ4_XS*>(w);
  const auto* acts = static_cast<const BlockQ8_K*>(a);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const BlockIQ4_XS& wb = weights[b];
    const BlockQ8_K& ab = acts[b];
    prefetch_ahead(&wb, sizeof(wb));
    __m256i sum = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      const __m256i levels = iq4_levels(nibbles_32(wb.qs + 16 * j));
      const __m256i q8 = load(ab.qs + 32 * j);
      const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(levels, levels), _mm256_sign_epi8(q8, levels));
      sum = add_products_i16(sum, pairs, _mm256_set1_epi16(static_cast<int16_t>(iq4_xs_scale(wb, j) - 32)));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(ab.d * half(wb.d)), _mm256_cvtepi32_ps(sum), acc);
  }
  return horizontal_sum(acc);
}

// ---- activations -------------------------------------------------------------------------------------------

// The 8 sums of g[0..7], each a vector of 8 int32 (hadd pairs neighbours within 128-bit halves).
__m256i horizontal_sums(const __m256i (&g)[8]) {
  const __m256i s0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(g[0], g[1]), _mm256_hadd_epi32(g[2], g[3]));
  const __m256i s4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(g[4], g[5]), _mm256_hadd_epi32(g[6], g[7]));
  // s0123 holds the sums of elements 0-3 of g0..g3 in its low half and of elements 4-7 in its high half.
  return _mm256_add_epi32(_mm256_permute2x128_si256(s0123, s4567, 0x20),
                          _mm256_permute2x128_si256(s0123, s4567, 0x31));
}

// quant::quantize_q8_k, byte for byte: the value of largest magnitude (the first, on a tie of signs) maps to
// -127, levels round half to even (as nearest_int), and each 16 levels' sum goes to bsums. The scalar form
// took 22 us for an 8192-wide row, time in which the other decoding threads wait.
void quantize_q8_k(const float* x, void* dst, int64_t n) {
  auto* blocks = static_cast<BlockQ8_K*>(dst);
  for (int64_t b = 0; b < n / kSuperBlock; ++b, x += kSuperBlock) {
    BlockQ8_K& block = blocks[b];
    __m256 high = _mm256_loadu_ps(x), low = high;
    for (int e = 8; e < kSuperBlock; e += 8) {
      const __m256 v = _mm256_loadu_ps(x + e);
      high = _mm256_max_ps(high, v);
      low = _mm256_min_ps(low, v);
    }
    const float max = horizontal(high, kMax), min = horizontal(low, kMin);
    if (max == 0 && min == 0) {
      std::memset(&block, 0, sizeof(block));
      continue;
    }
    float extreme = max > -min ? max : min;
    if (max == -min)  // both signs reach the largest magnitude: the first one wins
      extreme = *std::find_if(x, x + kSuperBlock, [max](float v) { return v == max || v == -max; });
    const float iscale = -127 / extreme;
    const __m256 scale = _mm256_set1_ps(iscale);
    const __m256i top = _mm256_set1_epi32(127);
    __m256i sums[2][8];
    for (int e = 0; e < kSuperBlock; e += 32) {
      __m256i levels[4];
      for (int k = 0; k < 4; ++k)
        levels[k] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + e + 8 * k), scale)), top);
      sums[e / 128][e / 32 % 4 * 2] = _mm256_add_epi32(levels[0], levels[1]);
      sums[e / 128][e / 32 % 4 * 2 + 1] = _mm256_add_epi32(levels[2], levels[3]);
      // Saturating packs interleave 128-bit halves; the permutation puts the 32 bytes back in order.
      const __m256i bytes =
          _mm256_packs_epi16(_mm256_packs_epi32(levels[0], levels[1]), _mm256_packs_epi32(levels[2], levels[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(block.qs + e),
                          _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
    const __m256i bsums = _mm256_packs_epi32(horizontal_sums(sums[0]), horizontal_sums(sums[1]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(block.bsums), _mm256_permute4x64_epi64(bsums, 0xD8));
    block.d = 1 / iscale;
  }
}

struct KernelEntry {
  TensorType type;
  VecDotFn kernel;
  VecDotRowsFn rows;
  VecDotTileFn tile;
};
template <typename Kernel>
constexpr KernelEntry multi_row(TensorType type, VecDotTileFn tile = nullptr) {
  return {type, dot_one_row<Kernel>, dot_rows<Kernel>, tile};
}
constexpr KernelEntry kKernels[] = {
    {TensorType::F32, dot_float<TensorType::F32>, nullptr, nullptr},
    {TensorType::F16, dot_float<TensorType::F16>, nullptr, nullptr},
    {TensorType::BF16, dot_float<TensorType::BF16>, nullptr, nullptr},
    multi_row<Symmetric<BlockQ4_0>>(TensorType::Q4_0),
    {TensorType::Q4_1, dot_with_min<BlockQ4_1>, nullptr, nullptr},
    multi_row<Symmetric<BlockQ5_0>>(TensorType::Q5_0),
    {TensorType::Q5_1, dot_with_min<BlockQ5_1>, nullptr, nullptr},
    multi_row<Symmetric<BlockQ8_0>>(TensorType::Q8_0),
    multi_row<Symmetric<BlockIQ4_NL>>(TensorType::IQ4_NL),
    {TensorType::Q2_K, dot_q2_k, nullptr, nullptr},
    {TensorType::Q3_K, dot_q3_k, nullptr, nullptr},
    multi_row<ScaleMin<BlockQ4_K>>(TensorType::Q4_K, kQ4KTile),
    multi_row<ScaleMin<BlockQ5_K>>(TensorType::Q5_K, kQ5KTile),
    multi_row<Q6K>(TensorType::Q6_K, kQ6KTile),
    {TensorType::IQ4_XS, dot_iq4_xs, nullptr, nullptr},
};

}  // namespace

QuantizeFn x86_q8_k_quantizer() { return quantize_q8_k; }

NamedKernel x86_vec_dot_kernel(TensorType weight_type) {
  for (const KernelEntry& e : kKernels)
    if (e.type == weight_type) return {e.kernel, e.rows, e.tile, kKernelName};
  return {nullptr, nullptr, nullptr, ""};
}

}  // namespace rf::cpu

#else

namespace rf::cpu {

QuantizeFn x86_q8_k_quantizer() { return nullptr; }
NamedKernel x86_vec_dot_kernel(TensorType) { return {nullptr, nullptr, nullptr, ""}; }

}  // namespace rf::cpu
#endif
