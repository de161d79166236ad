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

}  // namespace mx
