// See e4m3_rounding_util.h.
#include "e4m3_rounding_util.h"

#include <vector>

#include "model/dense_fp8.h"

namespace mx::test {

Status write_e4m3_rounded_checkpoint(const Checkpoint& source, const std::string& path) {
  auto dense = [](const std::string& name) {
    for (const char* suffix : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"})
      if (name.ends_with(suffix)) return true;
    return name == "lm_head.weight";
  };
  std::vector<std::vector<uint16_t>> rounded;
  std::vector<NamedTensor> tensors;
  for (const std::string& name : source.names()) {
    MX_ASSIGN_OR_RETURN(TensorView view, source.get(name));
    if (dense(name)) {
      const Fp8Rows q = quantize_rows_fp8(view);
      const size_t k = static_cast<size_t>(view.dim(1));
      std::vector<uint16_t>& bits = rounded.emplace_back(q.values.size());
      for (size_t i = 0; i < bits.size(); ++i) bits[i] = f32_to_bf16(q.scales[i / k] * fp8e4m3_to_f32(q.values[i]));
      view = TensorView(bits.data(), DType::kBF16, view.shape());
    }
    tensors.push_back({name, view});
  }
  return write_safetensors(path, tensors);
}

}  // namespace mx::test
