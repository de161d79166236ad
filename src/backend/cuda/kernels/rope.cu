// qkv split + YaRN RoPE (NeoX half rotation) + paged KV write, one CTA per token. cos/sin come from the
// fp32 angle pos * inv_freq with the precise sincosf (no fast-math), times the YaRN concentration, as
// the CPU twin does; q goes to q_out, rotated k and plain v to the token's slot of the paged cache.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/kernels.h"

namespace mx::cuda {
namespace {

constexpr int kMaxHalf = 128;

__global__ void qkv_rope_kernel(RopeParams p) {
  __shared__ float cos_t[kMaxHalf], sin_t[kMaxHalf];
  const int64_t t = blockIdx.x;
  const int64_t hd = p.head_dim, half = hd / 2;
  const int32_t pos = p.kv.positions[t];
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const float angle = static_cast<float>(pos) * p.inv_freq[i];
    float s, c;
    sincosf(angle, &s, &c);
    cos_t[i] = c * p.rope_scale;
    sin_t[i] = s * p.rope_scale;
  }
  __syncthreads();
  const int32_t seq = p.kv.token_seq[t];
  const int64_t logical = pos / p.kv.page_size;
  int64_t page = -1;
  if (pos >= 0 && logical < p.kv.max_pages) page = p.kv.page_table[seq * p.kv.max_pages + logical];
  const bool cache_ok = page >= 0 && page < p.kv.num_pages;
  const int64_t slot = ((cache_ok ? page : 0) * p.kv.page_size + pos % p.kv.page_size) * p.n_kv;
  const uint16_t* row = p.qkv + t * (p.n_q + 2 * p.n_kv) * hd;
  // Rotated heads (q then k): one thread per pair (i, i + half).
  const int64_t pairs = (p.n_q + p.n_kv) * half;
  for (int64_t e = threadIdx.x; e < pairs; e += blockDim.x) {
    const int64_t h = e / half, i = e % half;
    const float a = bf16_bits_to_f32(row[h * hd + i]), b = bf16_bits_to_f32(row[h * hd + i + half]);
    const uint16_t y0 = f32_to_bf16_bits(a * cos_t[i] - b * sin_t[i]);
    const uint16_t y1 = f32_to_bf16_bits(b * cos_t[i] + a * sin_t[i]);
    if (h < p.n_q) {
      uint16_t* q = p.q_out + (t * p.n_q + h) * hd;
      q[i] = y0;
      q[i + half] = y1;
    } else if (cache_ok) {
      uint16_t* k = p.kv.k + (slot + (h - p.n_q)) * hd;
      k[i] = y0;
      k[i + half] = y1;
    }
  }
  if (!cache_ok) return;
  const uint16_t* v_src = row + (p.n_q + p.n_kv) * hd;
  uint16_t* v_dst = p.kv.v + slot * hd;
  for (int64_t e = threadIdx.x; e < p.n_kv * hd; e += blockDim.x) v_dst[e] = v_src[e];
}

}  // namespace

Status launch_qkv_rope(const RopeParams& p, cudaStream_t stream) {
  if (p.head_dim % 2 != 0 || p.head_dim / 2 > kMaxHalf) return unimplemented("qkv_rope: head_dim must be even and <= 256");
  if (p.tokens == 0) return Status::ok();
  qkv_rope_kernel<<<static_cast<unsigned>(p.tokens), 128, 0, stream>>>(p);
  return launch_status("qkv_rope_kernel");
}

}  // namespace mx::cuda
