#include "quant/scale_search.h"

#include <algorithm>
#include <cmath>

#include "quant/blocks.h"

namespace rf::quant {
namespace {

// Below this a group counts as all zero (ggml's GROUP_MAX_EPS).
constexpr float kAllZero = 1e-15f;

// The element of largest magnitude, with its sign: searches anchor their first scale on it.
float signed_absmax(int n, const float* x) {
  float max = 0;
  float amax = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  return max;
}

// Sums of a weighted least-squares fit x ~ d * l: the best d is sum_xl / sum_l2, and the squared error it
// leaves shrinks as sum_xl^2 / sum_l2 grows, so trials compare by that without computing errors.
struct Fit {
  float sum_xl = 0;
  float sum_l2 = 0;
  bool better_than(float best) const { return sum_l2 > 0 && sum_xl * sum_xl > best * sum_l2; }
  float scale() const { return sum_l2 > 0 ? sum_xl / sum_l2 : 0.0f; }
};

// Rounds x * iscale to the levels -nmax..nmax-1, weighted by x^2; stores level + nmax in L when given.
Fit round_symmetric(int n, int nmax, const float* x, float iscale, int8_t* L) {
  Fit fit;
  for (int i = 0; i < n; ++i) {
    const int l = std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    if (L) L[i] = static_cast<int8_t>(l + nmax);
    const float w = x[i] * x[i];
    fit.sum_xl += w * x[i] * l;
    fit.sum_l2 += w * l * l;
  }
  return fit;
}

// As round_symmetric for the IQ4_NL levels: x * iscale to the nearest level.
Fit round_iq4(const float* x, float iscale) {
  Fit fit;
  for (int i = 0; i < kBlock; ++i) {
    const float q = kIQ4NLValues[nearest_iq4_index(iscale * x[i])];
    const float w = x[i] * x[i];
    fit.sum_xl += w * q * x[i];
    fit.sum_l2 += w * q * q;
  }
  return fit;
}

}  // namespace

float make_qx_quants(int n, int nmax, const float* x, int8_t* L) {
  const float max = signed_absmax(n, x);
  if (std::fabs(max) < kAllZero) {
    std::fill(L, L + n, int8_t{0});
    return 0;
  }
  // The largest element maps to level -nmax, the one extra level of the asymmetric range.
  Fit fit = round_symmetric(n, nmax, x, -nmax / max, L);
  float scale = fit.scale();
  float best = scale * fit.sum_xl;
  for (int step = -9; step <= 9; ++step) {
    if (step == 0) continue;
    const float iscale = -(nmax + 0.1f * step) / max;
    fit = round_symmetric(n, nmax, x, iscale, nullptr);
    if (fit.better_than(best)) {
      round_symmetric(n, nmax, x, iscale, L);
      scale = fit.scale();
      best = scale * fit.sum_xl;
    }
  }
  return scale;
}

float make_q3_quants(int n, int nmax, const float* x, int8_t* L) {
  const float max = signed_absmax(n, x);
  if (std::fabs(max) < kAllZero) {
    std::fill(L, L + n, int8_t{0});
    return 0;
  }
  const float iscale = -nmax / max;
  float sum_xl = 0;
  float sum_l2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    sum_xl += w * x[i] * l;
    sum_l2 += w * l * l;
  }
  // Coordinate descent: move each element to the level the current least-squares scale prefers, keeping the
  // move only if the fit improves; stop once a pass changes nothing.
  for (int pass = 0; pass < 5; ++pass) {
    int changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float xl = sum_xl - w * x[i] * L[i];
      if (xl <= 0) continue;
      float l2 = sum_l2 - w * L[i] * L[i];
      const int new_l = std::clamp(nearest_int(x[i] * l2 / xl), -nmax, nmax - 1);
      if (new_l == L[i]) continue;
      xl += w * x[i] * new_l;
      l2 += w * new_l * new_l;
      if (l2 > 0 && xl * xl * sum_l2 > sum_xl * sum_xl * l2) {
        L[i] = static_cast<int8_t>(new_l);
        sum_xl = xl;
        sum_l2 = l2;
        ++changed;
      }
    }
    if (changed == 0) break;
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
  return sum_l2 > 0 ? sum_xl / sum_l2 : 0.0f;
}

float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* min_out, float rmin,
                       float rdelta, int nstep, bool use_mad) {
  float min = x[0];
  float max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    min = std::min(min, x[i]);
    max = std::max(max, x[i]);
    sum_w += weights[i];
    sum_x += weights[i] * x[i];
  }
  // The offset only ever subtracts: a block of positive values keeps min 0 and uses its levels for scale.
  min = std::min(min, 0.0f);
  if (max == min) {
    std::fill(L, L + n, uint8_t{0});
    *min_out = -min;
    return 0;
  }
  auto error_of = [&](const uint8_t* levels, float scale, float offset) {
    float error = 0;
    for (int i = 0; i < n; ++i) {
      const float diff = scale * levels[i] + offset - x[i];
      error += weights[i] * (use_mad ? std::fabs(diff) : diff * diff);
    }
    return error;
  };

  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  for (int i = 0; i < n; ++i) L[i] = static_cast<uint8_t>(std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax));
  float best_error = error_of(L, scale, min);

  uint8_t trial[kBlock];
  for (int step = 0; step <= nstep; ++step) {
    iscale = (rmin + rdelta * step + nmax) / (max - min);
    float sum_l = 0;
    float sum_l2 = 0;
    float sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax);
      trial[i] = static_cast<uint8_t>(l);
      sum_l += weights[i] * l;
      sum_l2 += weights[i] * l * l;
      sum_xl += weights[i] * l * x[i];
    }
    // Weighted least squares of x ~ scale * l + offset over both unknowns (Cramer's rule).
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det <= 0) continue;
    float trial_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
    float trial_offset = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if (trial_offset > 0) {
      trial_offset = 0;
      trial_scale = sum_xl / sum_l2;
    }
    const float error = error_of(trial, trial_scale, trial_offset);
    if (error < best_error) {
      std::copy(trial, trial + n, L);
      best_error = error;
      scale = trial_scale;
      min = trial_offset;
    }
  }
  *min_out = -min;
  return scale;
}

int nearest_iq4_index(float x) {
  // The levels are sorted, so the index is the number of midpoints at or below x. Doubling both sides keeps
  // the midpoints integral.
  int index = 0;
  for (int j = 1; j < 16; ++j) index += (x + x >= static_cast<float>(kIQ4NLValues[j - 1] + kIQ4NLValues[j]));
  return index;
}

float iq4_block_scale(const float* x) {
  const float max = signed_absmax(kBlock, x);
  if (std::fabs(max) < kAllZero) return 0;
  // First fit with the largest element near the top level (d = max / 127), then try 15 inverse scales that
  // put it near the bottom one (-127), whose magnitude is larger.
  Fit fit = round_iq4(x, 1 / (max / -kIQ4NLValues[0]));
  float scale = fit.scale();
  float best = scale * fit.sum_xl;
  for (int step = -7; step <= 7; ++step) {
    fit = round_iq4(x, (step + kIQ4NLValues[0]) / max);
    if (fit.better_than(best)) {
      scale = fit.scale();
      best = scale * fit.sum_xl;
    }
  }
  return scale;
}

}  // namespace rf::quant
