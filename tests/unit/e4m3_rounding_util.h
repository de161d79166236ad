// Checkpoints for the FP8 dense tests. The bf16 model on e4m3-rounded weights: what `--dense-dtype fp8` must compute exactly (up to activation
// rounding), so its error against it measures the FP8 path alone, apart from the weights' rounding.
#pragma once

#include <string>

#include "io/safetensors.h"

namespace mx::test {

// Writes all of `source`'s tensors to one safetensors file at `path`, the dense projections that
// --dense-dtype fp8 converts (gpt-oss q/k/v/o_proj and lm_head weights) replaced by bf16(scale * e4m3) of
// quantize_rows_fp8 (a relative change of at most 2^-9 beyond the e4m3 rounding itself).
Status write_e4m3_rounded_checkpoint(const Checkpoint& source, const std::string& path);

// The same dense projections stored as FP8 checkpoints hold them: NAME as F8_E4M3 values and NAME_scale as
// f32 per output channel (quantize_rows_fp8's), [N] except k_proj's, which are [N, 1]; `drop_scale` (a
// tensor name) leaves that weight's scales out.
Status write_fp8_dense_checkpoint(const Checkpoint& source, const std::string& path, const std::string& drop_scale = "");

}  // namespace mx::test
