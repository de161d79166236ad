#include "model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace mx {
namespace {

// The dimension index at which a frequency completes `rotations` turns over the original context.
double correction_dim(double rotations, int64_t dim, double base, double original_max_position) {
  return static_cast<double>(dim) * std::log(original_max_position / (rotations * 2.0 * std::numbers::pi)) /
         (2.0 * std::log(base));
}

}  // namespace

RopeTables compute_yarn_rope(const YarnRope& rope, int64_t head_dim) {
  RopeTables out;
  const int64_t half = head_dim / 2;
  out.inv_freq.resize(static_cast<size_t>(half));
  if (rope.factor <= 1.0) {
    for (int64_t i = 0; i < half; ++i)
      out.inv_freq[i] = static_cast<float>(1.0 / std::pow(rope.theta, 2.0 * static_cast<double>(i) / head_dim));
    out.attention_scale = rope.attention_factor > 0 ? static_cast<float>(rope.attention_factor) : 1.0f;
    return out;
  }
  const auto original = static_cast<double>(rope.original_max_position);
  double low = correction_dim(rope.beta_fast, head_dim, rope.theta, original);
  double high = correction_dim(rope.beta_slow, head_dim, rope.theta, original);
  if (rope.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(head_dim - 1));
  if (low == high) high += 0.001;  // avoid a zero-width ramp
  out.correction_low = low;
  out.correction_high = high;
  for (int64_t i = 0; i < half; ++i) {
    const double freq = std::pow(rope.theta, 2.0 * static_cast<double>(i) / head_dim);
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    // ramp 0: original frequency (extrapolation); ramp 1: frequency / factor (interpolation).
    out.inv_freq[i] = static_cast<float>((1.0 / freq) * (1.0 - ramp) + (1.0 / (rope.factor * freq)) * ramp);
  }
  out.attention_scale = static_cast<float>(rope.attention_factor > 0 ? rope.attention_factor
                                                                      : 0.1 * std::log(rope.factor) + 1.0);
  return out;
}

}  // namespace mx
