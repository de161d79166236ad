// FP8 dense weights (--dense-dtype fp8): a bf16 [N, K] matrix as fp8 e4m3 values with one f32 scale per
// output channel (row), so w[n, k] ~= scale[n] * fp8[n, k] (Backend::linear_fp8 reads this form).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor_view.h"

namespace mx {

struct Fp8Rows {
  std::vector<uint8_t> values;  // [N, K] e4m3 codes
  std::vector<float> scales;    // [N]
};

// scale[n] = max_k |w[n, k]| / 448 (e4m3's largest finite value), so each row uses the whole fp8 range;
// an all-zero row gets scale 1. Values round to nearest even.
Fp8Rows quantize_rows_fp8(const TensorView& bf16_rows);

}  // namespace mx
