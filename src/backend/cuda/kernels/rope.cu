// qkv split + YaRN RoPE (NeoX half rotation) + paged KV write. cos/sin come from the fp32 angle
// pos * inv_freq with the precise sincosf (no fast-math), times the YaRN concentration, as the CPU twin
// does; q goes to q_out, rotated k and plain v to the token's slot of the paged cache.
// Grid: (token, group of heads). One thread per (head, run of kVec consecutive pairs (i, i + half)): 8-byte
// loads and stores of 4 bf16 wherever half is a multiple of 4 (every head dim served), else 2-byte ones. At one
// token the whole op is one short wave of CTAs instead of one CTA looping over loads that each wait on memory (8
// us -> a few us per layer at batch 1); at 256 tokens the 8-byte accesses take a quarter of the memory
// instructions of 2-byte ones. Each CTA recomputes its token's cos/sin table (half sincosf), which is cheap next
// to a load round trip.
#include <algorithm>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/head_rows.cuh"

namespace mx::cuda {
namespace {

constexpr int kMaxHalf = 256;  // head_dim 512 (Gemma-4 full layers)
constexpr int kThreads = 128;

// kVec bf16 values as one load or store (8 bytes at 4).
template <int kVec>
struct Bf16Run {
  using Word = std::conditional_t<kVec == 4, uint2, uint16_t>;
  union {
    Word word;
    uint16_t v[kVec];
  };
  __device__ static Bf16Run load(const uint16_t* p) {
    Bf16Run r;
    r.word = *reinterpret_cast<const Word*>(p);
    return r;
  }
  __device__ void store(uint16_t* p) const { *reinterpret_cast<Word*>(p) = word; }
};

template <int kVec>
__global__ void __launch_bounds__(kThreads) qkv_rope_kernel(RopeParams p, int heads_per_cta) {
  __shared__ float cos_t[kMaxHalf], sin_t[kMaxHalf];
  pdl_wait();  // launched as a programmatic dependent: qkv comes from the linear before
  pdl_launch_dependents();  // after the wait: a dependent may rely on what our predecessors wrote
  const int64_t t = blockIdx.x;
  const int hd = static_cast<int>(p.head_dim), half = hd / 2, runs = half / kVec;
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
  using Run = Bf16Run<kVec>;
  for (int e = threadIdx.x; e < heads * runs; e += blockDim.x) {
    const int h = first + e / runs, i = (e % runs) * kVec;
    const Run x0 = Run::load(row + h * hd + i), x1 = Run::load(row + h * hd + i + half);
    if (h >= n_q + n_kv) {
      if (!cache_ok) continue;
      uint16_t* v = p.kv.v + (slot + (h - n_q - n_kv)) * hd;
      x0.store(v + i);
      x1.store(v + i + half);
      continue;
    }
    Run y0, y1;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const float a = bf16_bits_to_f32(x0.v[j]), b = bf16_bits_to_f32(x1.v[j]);
      y0.v[j] = f32_to_bf16_bits(a * cos_t[i + j] - b * sin_t[i + j]);
      y1.v[j] = f32_to_bf16_bits(b * cos_t[i + j] + a * sin_t[i + j]);
    }
    uint16_t* out = nullptr;
    if (h < n_q) {
      out = p.q_out + (t * p.n_q + h) * hd;
    } else if (cache_ok) {
      out = p.kv.k + (slot + (h - n_q)) * hd;
    }
    if (!out) continue;
    y0.store(out + i);
    y1.store(out + i + half);
  }
}

template <int kVec>
Status launch_qkv_rope_runs(const RopeParams& p, cudaStream_t stream) {
  const int half = static_cast<int>(p.head_dim / 2);
  const int heads_per_cta = std::max(1, kThreads * kVec / half);
  if (ceil_div64(p.n_q + 2 * p.n_kv, heads_per_cta) > 65535) return unimplemented("qkv_rope: too many heads");
  const dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>(ceil_div64(p.n_q + 2 * p.n_kv, heads_per_cta)));
  return cuda_status(launch_pdl(qkv_rope_kernel<kVec>, grid, dim3(kThreads), 0, stream, p, heads_per_cta),
                     "qkv_rope_kernel");
}

}  // namespace

Status launch_qkv_rope(const RopeParams& p, cudaStream_t stream) {
  if (p.head_dim < 2 || p.head_dim % 2 != 0 || p.head_dim / 2 > kMaxHalf)
    return unimplemented("qkv_rope: head_dim must be even and in [2, 512]");
  if (p.tokens == 0) return Status::ok();
  // 8-byte runs need half a multiple of 4 and 8-byte aligned rows (the buffers are allocated aligned).
  const bool aligned = (reinterpret_cast<uintptr_t>(p.qkv) | reinterpret_cast<uintptr_t>(p.q_out) |
                        reinterpret_cast<uintptr_t>(p.kv.k) | reinterpret_cast<uintptr_t>(p.kv.v)) % 8 == 0;
  if (p.head_dim % 8 == 0 && aligned) return launch_qkv_rope_runs<4>(p, stream);
  return launch_qkv_rope_runs<1>(p, stream);
}

}  // namespace mx::cuda
