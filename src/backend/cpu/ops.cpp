#include "backend/cpu/ops.h"

#include <algorithm>
#include <cmath>

#if (defined(__F16C__) || defined(__AVX2__)) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "util/half.h"

namespace rf::cpu {
namespace {

float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void add_scaled(float* out, float weight, const float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] += weight * v[i];
}

// The f16 versions convert eight values at a time where the CPU has F16C; the scalar loops finish the rest.
float dot(const float* a, const uint16_t* b, int64_t n) {
  int64_t i = 0;
  float sum = 0.0f;
#if defined(__F16C__) && defined(__FMA__)
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 bf = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), bf, acc);
  }
  __m128 half = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  half = _mm_add_ps(half, _mm_movehl_ps(half, half));
  half = _mm_add_ss(half, _mm_movehdup_ps(half));
  sum = _mm_cvtss_f32(half);
#endif
  for (; i < n; ++i) sum += a[i] * fp16_to_fp32(b[i]);
  return sum;
}

void add_scaled(float* out, float weight, const uint16_t* v, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__) && defined(__FMA__)
  const __m256 w = _mm256_set1_ps(weight);
  for (; i + 8 <= n; i += 8) {
    const __m256 vf = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(v + i)));
    _mm256_storeu_ps(out + i, _mm256_fmadd_ps(w, vf, _mm256_loadu_ps(out + i)));
  }
#endif
  for (; i < n; ++i) out[i] += weight * fp16_to_fp32(v[i]);
}

}  // namespace

void rmsnorm(float* out, const float* x, const float* weight, int64_t n, float eps) {
  // In double, as llama.cpp sums; four partial sums, so that the additions do not wait on each other.
  double partial[4] = {0.0, 0.0, 0.0, 0.0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int k = 0; k < 4; ++k) partial[k] += static_cast<double>(x[i + k]) * x[i + k];
  for (; i < n; ++i) partial[0] += static_cast<double>(x[i]) * x[i];
  const double sum_of_squares = (partial[0] + partial[1]) + (partial[2] + partial[3]);
  const float scale = 1.0f / std::sqrt(static_cast<float>(sum_of_squares / static_cast<double>(n)) + eps);
  for (i = 0; i < n; ++i) out[i] = x[i] * scale * weight[i];
}

void layernorm(float* out, const float* x, const float* weight, const float* bias, int64_t n, float eps) {
  // In double, as llama.cpp sums.
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += x[i];
  const auto mean = static_cast<float>(sum / static_cast<double>(n));
  double squares = 0.0;
  for (int64_t i = 0; i < n; ++i) squares += static_cast<double>(x[i] - mean) * (x[i] - mean);
  const float scale = 1.0f / std::sqrt(static_cast<float>(squares / static_cast<double>(n)) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] - mean) * scale * weight[i] + (bias ? bias[i] : 0.0f);
}

void softmax(float* x, int64_t n) {
  const float max = *std::max_element(x, x + n);
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const float inverse = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) x[i] *= inverse;
}

#if defined(__AVX2__) && defined(__FMA__)
// e^x to about 2 ulp for x in [-87.3, 88.3], where 2^n below is a normal float; infinity above, 0 below (a float
// ends at e^88.7 anyway): x = n ln 2 + r with |r| <= ln 2 / 2, e^r by its Taylor polynomial of degree 6, 2^n
// put into the exponent bits.
__m256 exp256(__m256 input) {
  const __m256 x = _mm256_min_ps(_mm256_max_ps(input, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  const __m256 n =
      _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // ln 2 in two parts, so that n * ln2_high is exact.
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  for (const float c : {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f})
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
  const __m256i two_to_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  const __m256 e = _mm256_mul_ps(p, _mm256_castsi256_ps(two_to_n));
  const __m256 overflow = _mm256_cmp_ps(input, _mm256_set1_ps(88.3f), _CMP_GT_OQ);
  const __m256 underflow = _mm256_cmp_ps(input, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
  return _mm256_andnot_ps(underflow, _mm256_blendv_ps(e, _mm256_set1_ps(INFINITY), overflow));
}
#endif

// Eight values at a time where the CPU has AVX2 (its e^x within a few ulp of std::exp's): with std::exp, an
// 8192-wide row took 20 us of each decoded layer, while the other threads waited.
void swiglu(float* gate, const float* up, int64_t n) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_setzero_ps(), g))));
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
  }
#endif
  for (; i < n; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

namespace {

float gelu(float x) {
  constexpr float kSqrt2OverPi = 0.79788456080286535588f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + 0.044715f * x * x)));
}

}  // namespace

void geglu(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) gate[i] = gelu(gate[i]) * up[i];
}

void gelu(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = gelu(x[i]);
}

void soft_cap(float* x, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

void add_rows(float* x, const float* bias, int64_t rows, int64_t width) {
  for (int64_t r = 0; r < rows; ++r) add(x + r * width, bias, width);
}

void add(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void rope_angles(float* cos_sin, int64_t position, std::span<const double> inverse_frequencies) {
  for (size_t i = 0; i < inverse_frequencies.size(); ++i) {
    const double angle = static_cast<double>(position) * inverse_frequencies[i];
    cos_sin[2 * i] = static_cast<float>(std::cos(angle));
    cos_sin[2 * i + 1] = static_cast<float>(std::sin(angle));
  }
}

void rope(float* heads, int64_t n_heads, int64_t head_dim, const float* cos_sin, int64_t n_pairs,
          model::RopeStyle style) {
  // Normal: pair i is (2i, 2i + 1). NeoX: pair i is (i, i + n_pairs).
  const int64_t first_step = style == model::RopeStyle::Normal ? 2 : 1;
  const int64_t partner = style == model::RopeStyle::Normal ? 1 : n_pairs;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* head = heads + h * head_dim;
    for (int64_t i = 0; i < n_pairs; ++i) {
      float* a = head + i * first_step;
      float* b = a + partner;
      const float c = cos_sin[2 * i];
      const float s = cos_sin[2 * i + 1];
      const float a0 = *a;
      const float b0 = *b;
      *a = a0 * c - b0 * s;
      *b = a0 * s + b0 * c;
    }
  }
}

template <typename KvElement>
void attend(float* out, const float* q, const KvElement* keys, const KvElement* values,
            std::span<const RowRange> ranges, int64_t stride, int64_t head_dim, float scale, float cap, float* scores) {
  int64_t n = 0;
  for (const RowRange& range : ranges)
    for (int64_t row = range.first; row < range.first + range.count; ++row)
      scores[n++] = scale * dot(q, keys + row * stride, head_dim);
  if (cap > 0.0f) soft_cap(scores, n, cap);
  softmax(scores, n);
  std::fill(out, out + head_dim, 0.0f);
  n = 0;
  for (const RowRange& range : ranges)
    for (int64_t row = range.first; row < range.first + range.count; ++row)
      add_scaled(out, scores[n++], values + row * stride, head_dim);
}

template void attend<float>(float*, const float*, const float*, const float*, std::span<const RowRange>, int64_t,
                            int64_t, float, float, float*);
template void attend<uint16_t>(float*, const float*, const uint16_t*, const uint16_t*, std::span<const RowRange>,
                               int64_t, int64_t, float, float, float*);

}  // namespace rf::cpu
