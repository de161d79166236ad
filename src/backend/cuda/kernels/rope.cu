// qkv split + YaRN RoPE (NeoX half rotation) + paged KV write. cos/sin come from the fp32 angle
// pos * inv_freq with the precise sincosf (no fast-math), times the YaRN concentration, as the CPU twin
// does; q goes to q_out, rotated k and plain v to the token's slot of the paged cache.
// Grid: (token, group of heads). One thread per (head, i) pair of elements (i, i + half) does one step:
// at one token the whole op is one short wave of CTAs instead of one CTA looping 18 times over loads
// that each wait on memory (8 us -> a few us per layer at batch 1). Each CTA recomputes its token's
// cos/sin table (half sincosf), which is cheap next to a load round trip.
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/head_rows.cuh"

namespace mx::cuda {
namespace {

constexpr int kMaxHalf = 256;  // head_dim 512 (Gemma-4 full layers)
constexpr int kPairsPerCta = 128;  // threads per CTA; heads per CTA = kPairsPerCta / half

__global__ void __launch_bounds__(kPairsPerCta) qkv_rope_kernel(RopeParams p, int heads_per_cta) {
  __shared__ float cos_t[kMaxHalf], sin_t[kMaxHalf];
  pdl_wait();  // launched as a programmatic dependent: qkv comes from the linear before
  pdl_launch_dependents();  // after the wait: a dependent may rely on what our predecessors wrote
  const int64_t t = blockIdx.x;
  const int hd = static_cast<int>(p.head_dim), half = hd / 2;
  const int n_q = static_cast<int>(p.n_q), n_kv = static_cast<int>(p.n_kv);
  const int32_t pos = p.kv.positions[t];
  rope_table(cos_t, sin_t, half, pos, p.inv_freq, p.rope_scale);
  __syncthreads();
  const int64_t slot = kv_row(p.kv, t, pos, p.n_kv);
  const bool cache_ok = slot >= 0;
  const uint16_t* row = p.qkv + t * (p.n_q + 2 * p.n_kv) * hd;
  // Heads in qkv order: n_q query heads, n_kv key heads (both rotated), n_kv value heads (copied).
  const int first = static_cast<int>(blockIdx.y) * heads_per_cta;
  const int heads = min(heads_per_cta, n_q + 2 * n_kv - first);
  for (int e = threadIdx.x; e < heads * half; e += blockDim.x) {
    const int h = first + e / half, i = e % half;
    const uint16_t x0 = row[h * hd + i], x1 = row[h * hd + i + half];
    if (h >= n_q + n_kv) {
      if (!cache_ok) continue;
      uint16_t* v = p.kv.v + (slot + (h - n_q - n_kv)) * hd;
      v[i] = x0;
      v[i + half] = x1;
      continue;
    }
    const float a = bf16_bits_to_f32(x0), b = bf16_bits_to_f32(x1);
    const uint16_t y0 = f32_to_bf16_bits(a * cos_t[i] - b * sin_t[i]);
    const uint16_t y1 = f32_to_bf16_bits(b * cos_t[i] + a * sin_t[i]);
    if (h < n_q) {
      uint16_t* q = p.q_out + (t * p.n_q + h) * hd;
      q[i] = y0;
      q[i + half] = y1;
    } else if (cache_ok) {
      uint16_t* k = p.kv.k + (slot + (h - n_q)) * hd;
      k[i] = y0;
      k[i + half] = y1;
    }
  }
}

}  // namespace

Status launch_qkv_rope(const RopeParams& p, cudaStream_t stream) {
  if (p.head_dim < 2 || p.head_dim % 2 != 0 || p.head_dim / 2 > kMaxHalf)
    return unimplemented("qkv_rope: head_dim must be even and in [2, 512]");
  if (p.tokens == 0) return Status::ok();
  const int half = static_cast<int>(p.head_dim / 2);
  const int heads_per_cta = std::max(1, kPairsPerCta / half);
  if (ceil_div64(p.n_q + 2 * p.n_kv, heads_per_cta) > 65535) return unimplemented("qkv_rope: too many heads");
  const dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>(ceil_div64(p.n_q + 2 * p.n_kv, heads_per_cta)));
  return cuda_status(launch_pdl(qkv_rope_kernel, grid, dim3(kPairsPerCta), 0, stream, p, heads_per_cta),
                     "qkv_rope_kernel");
}

}  // namespace mx::cuda
