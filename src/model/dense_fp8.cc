#include "model/dense_fp8.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "core/log.h"

namespace mx {

Fp8Rows quantize_rows_fp8(const TensorView& w) {
  MX_CHECK(w.dtype() == DType::kBF16 && w.rank() == 2) << dtype_name(w.dtype());
  constexpr float kFp8Max = 448.0f;
  const int64_t n = w.dim(0), k = w.dim(1);
  const uint16_t* src = w.ptr<const uint16_t>();
  Fp8Rows out;
  out.values.resize(static_cast<size_t>(n * k));
  out.scales.resize(static_cast<size_t>(n));
  // Rows are independent: the lm_head alone is ~0.6G elements, so all cores take a share.
  auto rows = [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float amax = 0;
      for (int64_t i = 0; i < k; ++i) amax = std::max(amax, std::fabs(bf16_to_f32(src[r * k + i])));
      const float scale = amax > 0 ? amax / kFp8Max : 1.0f;
      out.scales[static_cast<size_t>(r)] = scale;
      for (int64_t i = 0; i < k; ++i)
        out.values[static_cast<size_t>(r * k + i)] = f32_to_fp8e4m3(bf16_to_f32(src[r * k + i]) / scale);
    }
  };
  const int64_t workers = std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, std::max<int64_t>(1, n / 256));
  std::vector<std::thread> threads;
  for (int64_t w = 0; w < workers; ++w) threads.emplace_back(rows, n * w / workers, n * (w + 1) / workers);
  for (std::thread& t : threads) t.join();
  return out;
}

Result<Fp8Rows> read_checkpoint_fp8_rows(const Checkpoint& checkpoint, const std::string& name, const TensorView& values) {
  MX_CHECK(values.dtype() == DType::kF8E4M3 && values.rank() == 2) << name;
  const int64_t n = values.dim(0);
  const std::string scale_name = name + "_scale";
  if (!checkpoint.has(scale_name))
    return invalid_argument("tensor '" + name + "' is FP8 (F8_E4M3) but the checkpoint has no '" + scale_name + "'");
  MX_ASSIGN_OR_RETURN(TensorView scale, checkpoint.get(scale_name));
  const bool rows = scale.rank() == 1 || (scale.rank() == 2 && scale.dim(1) == 1);
  if (!rows || scale.dim(0) != n || (scale.dtype() != DType::kF32 && scale.dtype() != DType::kBF16))
    return invalid_argument("tensor '" + scale_name + "' has dtype " + dtype_name(scale.dtype()) + " and shape " +
                            scale.shape().to_string() + ", expected f32 or bf16 [" + std::to_string(n) +
                            "] (one scale per output channel)");
  Fp8Rows out;
  const auto* bytes = values.ptr<const uint8_t>();
  out.values.assign(bytes, bytes + values.numel());
  out.scales.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    out.scales[static_cast<size_t>(i)] =
        scale.dtype() == DType::kF32 ? scale.ptr<const float>()[i] : bf16_to_f32(scale.ptr<const uint16_t>()[i]);
  return out;
}

std::vector<uint16_t> widen_rows_fp8(const Fp8Rows& rows) {
  const size_t k = rows.values.size() / std::max<size_t>(rows.scales.size(), 1);
  std::vector<uint16_t> out(rows.values.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = f32_to_bf16(rows.scales[i / k] * fp8e4m3_to_f32(rows.values[i]));
  return out;
}

}  // namespace mx
