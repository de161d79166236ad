#include "tools/bench_probes.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <vector>

#include "core/dtype.h"

namespace mx {

Result<double> median_op_ms(Backend& backend, const std::function<Status()>& op, int reps) {
  auto timer = backend.make_timer(2);
  std::vector<double> ms;
  MX_RETURN_IF_ERROR(op());
  MX_RETURN_IF_ERROR(backend.synchronize());
  for (int i = 0; i < reps; ++i) {
    if (timer.is_ok()) {
      MX_RETURN_IF_ERROR((*timer)->mark(0));
      MX_RETURN_IF_ERROR(op());
      MX_RETURN_IF_ERROR((*timer)->mark(1));
      MX_ASSIGN_OR_RETURN(auto t, (*timer)->read(2));
      ms.push_back(t[1]);
    } else {
      const auto start = std::chrono::steady_clock::now();
      MX_RETURN_IF_ERROR(op());
      MX_RETURN_IF_ERROR(backend.synchronize());
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

Result<DeviceProbes> measure_device_probes(Backend& backend) {
  DeviceProbes p;
  const bool device = backend.device() != Device::kCpu;
  p.clock = backend.make_timer(2).is_ok() ? "cuda events" : "wall clock";

  // Copy: buffers far larger than any cache, filled (never measured on untouched memory).
  p.copy_bytes = device ? (1ll << 30) : (64ll << 20);
  {
    MX_ASSIGN_OR_RETURN(Buffer a, backend.allocate(p.copy_bytes));
    MX_ASSIGN_OR_RETURN(Buffer b, backend.allocate(p.copy_bytes));
    const TensorView src = a.view(DType::kU8, {p.copy_bytes}), dst = b.view(DType::kU8, {p.copy_bytes});
    std::vector<uint8_t> host(static_cast<size_t>(p.copy_bytes));
    std::mt19937 rng(1);
    for (size_t i = 0; i < host.size(); i += 64) host[i] = static_cast<uint8_t>(rng());
    MX_RETURN_IF_ERROR(backend.copy_from_host(src, host.data()));
    MX_ASSIGN_OR_RETURN(double ms, median_op_ms(backend, [&] { return backend.copy(dst, src); }, 10));
    p.copy_bytes_per_s = 2.0 * static_cast<double>(p.copy_bytes) / (ms * 1e-3);
  }

  // GEMM: n x n x n through linear(), random bf16-representable inputs.
  p.gemm_n = device ? 8192 : 256;
  const int64_t n = p.gemm_n;
  const DType act = backend.activation_dtype();
  MX_ASSIGN_OR_RETURN(Buffer xb, backend.allocate(dtype_bytes(act, n * n)));
  MX_ASSIGN_OR_RETURN(Buffer wb, backend.allocate(dtype_bytes(DType::kBF16, n * n)));
  MX_ASSIGN_OR_RETURN(Buffer ob, backend.allocate(dtype_bytes(act, n * n)));
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> bits(static_cast<size_t>(n * n));
  for (auto& v : bits) v = f32_to_bf16(normal(rng));
  const TensorView x = xb.view(act, {n, n}), w = wb.view(DType::kBF16, {n, n}), out = ob.view(act, {n, n});
  MX_RETURN_IF_ERROR(backend.copy_from_host(w, bits.data()));
  if (act == DType::kBF16) {
    MX_RETURN_IF_ERROR(backend.copy_from_host(x, bits.data()));
  } else {
    std::vector<float> f(bits.size());
    for (size_t i = 0; i < f.size(); ++i) f[i] = bf16_to_f32(bits[i]);
    MX_RETURN_IF_ERROR(backend.copy_from_host(x, f.data()));
  }
  MX_ASSIGN_OR_RETURN(double ms, median_op_ms(backend, [&] { return backend.linear(x, w, TensorView(), out); }, 5));
  p.gemm_flops_per_s = 2.0 * static_cast<double>(n) * n * n / (ms * 1e-3);
  return p;
}

}  // namespace mx
