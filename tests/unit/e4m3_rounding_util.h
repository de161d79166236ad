// The bf16 model on e4m3-rounded weights: what `--dense-dtype fp8` must compute exactly (up to activation
// rounding), so its error against it measures the FP8 path alone, apart from the weights' rounding.
#pragma once

#include <string>

#include "io/safetensors.h"

namespace mx::test {

// Writes all of `source`'s tensors to one safetensors file at `path`, the dense projections that
// --dense-dtype fp8 converts (gpt-oss q/k/v/o_proj and lm_head weights) replaced by bf16(scale * e4m3) of
// quantize_rows_fp8 (a relative change of at most 2^-9 beyond the e4m3 rounding itself).
Status write_e4m3_rounded_checkpoint(const Checkpoint& source, const std::string& path);

}  // namespace mx::test
