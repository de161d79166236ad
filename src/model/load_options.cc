#include "model/load_options.h"

namespace mx {

Result<DType> parse_dense_dtype(const std::string& text) {
  if (text == "bf16" || text == "bfloat16") return DType::kBF16;
  if (text == "fp8" || text == "fp8_e4m3") return DType::kF8E4M3;
  return invalid_argument("--dense-dtype must be bf16 or fp8 (got '" + text + "')");
}

const char* moe_split_name(MoeSplit split) {
  switch (split) {
    case MoeSplit::kAuto: return "the model's default";
    case MoeSplit::kByIntermediate: return "by intermediate dimension";
    case MoeSplit::kByExpert: return "by expert";
  }
  return "?";
}

}  // namespace mx
