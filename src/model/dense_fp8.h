// FP8 dense weights (--dense-dtype fp8): a bf16 [N, K] matrix as fp8 e4m3 values with one f32 scale per
// output channel (row), so w[n, k] ~= scale[n] * fp8[n, k] (Backend::linear_fp8 reads this form).
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/tensor_view.h"
#include "io/safetensors.h"

namespace mx {

struct Fp8Rows {
  std::vector<uint8_t> values;  // [N, K] e4m3 codes
  std::vector<float> scales;    // [N]
};

// scale[n] = max_k |w[n, k]| / 448 (e4m3's largest finite value), so each row uses the whole fp8 range;
// an all-zero row gets scale 1. Values round to nearest even.
Fp8Rows quantize_rows_fp8(const TensorView& bf16_rows);

// A checkpoint's own FP8 weight (e4m3 `values` [N, K], as bound from `name`) with its per-output-channel
// scales from `name`_scale (f32 or bf16, shape [N] or [N, 1]; the compressed-tensors "channel" layout).
// An error names the tensor when the scales are missing or do not fit.
Result<Fp8Rows> read_checkpoint_fp8_rows(const Checkpoint& checkpoint, const std::string& name, const TensorView& values);

// bf16(scale[n] * e4m3[n, k]): an FP8 weight widened for the bf16 path (--dense-dtype bf16).
std::vector<uint16_t> widen_rows_fp8(const Fp8Rows& rows);

}  // namespace mx
