// See e4m3_rounding_util.h.
#include "e4m3_rounding_util.h"

#include <vector>

#include "model/dense_fp8.h"

namespace mx::test {

namespace {

bool dense(const std::string& name) {
  for (const char* suffix : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"})
    if (name.ends_with(suffix)) return true;
  return name == "lm_head.weight";
}

}  // namespace

Status write_e4m3_rounded_checkpoint(const Checkpoint& source, const std::string& path) {
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

Status write_fp8_dense_checkpoint(const Checkpoint& source, const std::string& path, const std::string& drop_scale) {
  std::vector<Fp8Rows> rows;
  rows.reserve(source.names().size());  // views point into the elements
  std::vector<NamedTensor> tensors;
  for (const std::string& name : source.names()) {
    MX_ASSIGN_OR_RETURN(TensorView view, source.get(name));
    if (!dense(name)) {
      tensors.push_back({name, view});
      continue;
    }
    Fp8Rows& q = rows.emplace_back(quantize_rows_fp8(view));
    tensors.push_back({name, TensorView(q.values.data(), DType::kF8E4M3, view.shape())});
    const int64_t n = view.dim(0);
    const Shape scale_shape = name.ends_with("k_proj.weight") ? Shape{n, 1} : Shape{n};
    if (name != drop_scale) tensors.push_back({name + "_scale", TensorView(q.scales.data(), DType::kF32, scale_shape)});
  }
  return write_safetensors(path, tensors);
}

}  // namespace mx::test
