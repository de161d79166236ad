// Choices made when a model's weights are loaded, beside the checkpoint itself (CLI: --dense-dtype,
// --enable-expert-parallel).
#pragma once

#include <string>

#include "core/dtype.h"
#include "core/status.h"

namespace mx {

// How a tensor-parallel rank takes its share of the MoE experts: every rank a slice of every expert's
// intermediate dimension (the vLLM and SGLang default), or whole experts, 1/N of them each (expert parallel,
// vLLM's --enable-expert-parallel). kAuto: the family's choice (model/gpt_oss/gpt_oss_shard.h says why).
enum class MoeSplit { kAuto, kByIntermediate, kByExpert };
const char* moe_split_name(MoeSplit split);

struct ModelLoadOptions {
  // The dense projections' weights on the device (gpt-oss: qkv, o_proj and the lm_head): kBF16 as in the
  // checkpoint, or kF8E4M3 with one f32 scale per output channel (converted at load, fewer bytes per
  // decode step). Embeddings, norms, the router and the experts keep their checkpoint dtypes.
  DType dense_dtype = DType::kBF16;
  MoeSplit moe_split = MoeSplit::kAuto;  // tensor parallel only
};

// "bf16"/"bfloat16" or "fp8"/"fp8_e4m3"; anything else is an error naming the accepted values.
Result<DType> parse_dense_dtype(const std::string& text);

}  // namespace mx
