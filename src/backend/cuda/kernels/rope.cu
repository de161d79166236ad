// qkv split + YaRN RoPE (NeoX half rotation) + paged KV write. cos/sin come from the fp32 angle
// pos * inv_freq with the precise sincosf (no fast-math), times the YaRN concentration, as the CPU twin
// does; q goes to q_out, rotated k and plain v to the token's slot of the paged cache. Two forms of the same
// arithmetic: qkv_rope_kernel (few tokens: decode) and qkv_rope_stream_kernel (many: prefill), below.
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
  const int64_t slot = p.kv.k ? kv_row(p.kv, t, pos, p.n_kv) : -1;
  const bool cache_ok = slot >= 0;
  const uint16_t* row = p.qkv + t * (p.n_q + 2 * p.n_kv) * hd;
  // Heads in qkv order: n_q query heads, n_kv key heads (both rotated), n_kv value heads (copied).
  const int first = static_cast<int>(blockIdx.y) * heads_per_cta;
  const int heads = min(heads_per_cta, n_q + 2 * n_kv - first);
  using Run = Bf16Run<kVec>;
  for (int e = threadIdx.x; e < heads * runs; e += blockDim.x) {
    const int h = first + e / runs, i = (e % runs) * kVec;
    if (h < n_q ? p.q_out == nullptr : p.kv.k == nullptr) continue;  // left to the attention / Q alone
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
    for (int j = 0; j < kVec; ++j) rope_rotate_pair(x0.v[j], x1.v[j], cos_t[i + j], sin_t[i + j], y0.v[j], y1.v[j]);
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

// The many-token form (prefill). The decode form's CTA is short-lived and its loads wait on a chain (the
// position, the sincosf table, a barrier, the page-table lookup) before each thread's one 8-byte pair goes out,
// so an SM has few bytes in flight: 60 us for 8K tokens of gpt-oss (168 MB, 66% of the copy rate; H200,
// session 18; this form 49 us, 81%). Here a CTA takes `tokens_per_cta` whole tokens, split into items (head, run of 8 pairs) of 16-byte
// loads; each thread issues the loads of its kItems items first, then the CTA builds its tokens' cos/sin tables
// and cache slots while they are in flight, and after one barrier rotates and stores. Same bits as the decode
// form (rope_rotate_pair, rope_cos_sin). Needs half % 8 == 0 and 16-byte aligned buffers.
template <int kItems>
__global__ void __launch_bounds__(512) qkv_rope_stream_kernel(RopeParams p, int tokens_per_cta) {
  extern __shared__ int64_t stream_smem[];  // slots[tokens_per_cta], then cos and sin [tokens_per_cta][half]
  const int hd = static_cast<int>(p.head_dim), half = hd / 2, runs = half / 8;
  const int n_q = static_cast<int>(p.n_q), n_kv = static_cast<int>(p.n_kv), heads = n_q + 2 * n_kv;
  // The heads written: [h_begin, h_end) of q, k, v (q_out null: K and V alone; kv.k null: Q alone).
  const int h_begin = p.q_out ? 0 : n_q, h_end = p.kv.k ? heads : n_q;
  const int per_token = (h_end - h_begin) * runs;
  int64_t* slots = stream_smem;
  float* cos_t = reinterpret_cast<float*>(slots + tokens_per_cta);
  float* sin_t = cos_t + tokens_per_cta * half;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * tokens_per_cta;
  const int n_tok = static_cast<int>(min(static_cast<int64_t>(tokens_per_cta), p.tokens - t0));
  const int items = n_tok * per_token;
  pdl_wait();  // launched as a programmatic dependent: qkv comes from the linear before
  pdl_launch_dependents();
  uint4 x0[kItems], x1[kItems];
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int f = threadIdx.x + k * blockDim.x;
    if (f >= items) break;
    const int tok = f / per_token, e = f - tok * per_token, h = h_begin + e / runs, i = (e % runs) * 8;
    const uint16_t* src = p.qkv + (t0 + tok) * heads * hd + h * hd + i;
    x0[k] = __ldcs(reinterpret_cast<const uint4*>(src));  // read once: evict first
    x1[k] = __ldcs(reinterpret_cast<const uint4*>(src + half));
  }
  for (int j = threadIdx.x; j < n_tok * half; j += blockDim.x) {
    const int tok = j / half, i = j - tok * half;
    rope_cos_sin(p.kv.positions[t0 + tok], p.inv_freq[i], p.rope_scale, cos_t[j], sin_t[j]);
  }
  for (int tok = threadIdx.x; tok < n_tok; tok += blockDim.x)
    slots[tok] = p.kv.k ? kv_row(p.kv, t0 + tok, p.kv.positions[t0 + tok], p.n_kv) : -1;
  __syncthreads();
#pragma unroll
  for (int k = 0; k < kItems; ++k) {
    const int f = threadIdx.x + k * blockDim.x;
    if (f >= items) break;
    const int tok = f / per_token, e = f - tok * per_token, h = h_begin + e / runs, i = (e % runs) * 8;
    const int64_t slot = slots[tok];
    if (h >= n_q + n_kv) {  // a value head: copied
      if (slot < 0) continue;
      uint16_t* v = p.kv.v + (slot + (h - n_q - n_kv)) * hd;
      *reinterpret_cast<uint4*>(v + i) = x0[k];
      *reinterpret_cast<uint4*>(v + i + half) = x1[k];
      continue;
    }
    uint16_t* out = nullptr;
    if (h < n_q) {
      out = p.q_out + ((t0 + tok) * n_q + h) * hd;
    } else if (slot >= 0) {
      out = p.kv.k + (slot + (h - n_q)) * hd;
    }
    if (!out) continue;
    const uint16_t* a = reinterpret_cast<const uint16_t*>(&x0[k]);
    const uint16_t* b = reinterpret_cast<const uint16_t*>(&x1[k]);
    const float* c = cos_t + tok * half + i;
    const float* s = sin_t + tok * half + i;
    uint4 y0, y1;
    uint16_t* ya = reinterpret_cast<uint16_t*>(&y0);
    uint16_t* yb = reinterpret_cast<uint16_t*>(&y1);
#pragma unroll
    for (int j = 0; j < 8; ++j) rope_rotate_pair(a[j], b[j], c[j], s[j], ya[j], yb[j]);
    *reinterpret_cast<uint4*>(out + i) = y0;
    *reinterpret_cast<uint4*>(out + i + half) = y1;
  }
}

template <int kItems>
Status launch_qkv_rope_stream_items(const RopeParams& p, int tokens_per_cta, int threads, cudaStream_t stream) {
  const int64_t ctas = ceil_div64(p.tokens, tokens_per_cta);
  const size_t smem = static_cast<size_t>(tokens_per_cta) * (sizeof(int64_t) + p.head_dim * sizeof(float));
  return cuda_status(launch_pdl(qkv_rope_stream_kernel<kItems>, dim3(static_cast<unsigned>(ctas)),
                                dim3(static_cast<unsigned>(threads)), smem, stream, p, tokens_per_cta),
                     "qkv_rope_stream_kernel");
}

}  // namespace

Status launch_qkv_rope_stream(const RopeParams& p, int tokens_per_cta, int items, cudaStream_t stream) {
  if (items != 2 && items != 4 && items != 8) return invalid_argument("qkv_rope: items per thread must be 2, 4 or 8");
  if (tokens_per_cta < 1 || tokens_per_cta > 64) return invalid_argument("qkv_rope: tokens per CTA must be in [1, 64]");
  const bool aligned = (reinterpret_cast<uintptr_t>(p.qkv) | reinterpret_cast<uintptr_t>(p.q_out) |
                        reinterpret_cast<uintptr_t>(p.kv.k) | reinterpret_cast<uintptr_t>(p.kv.v)) % 16 == 0;
  const int64_t heads = p.n_q + 2 * p.n_kv, written = (p.q_out ? p.n_q : 0) + (p.kv.k ? 2 * p.n_kv : 0);
  if (written == 0) return Status::ok();
  const int64_t per_token = written * (p.head_dim / 16);
  // Part of the heads (K and V alone, or Q alone): as many more tokens a CTA, so that it keeps its threads.
  if (written < heads) tokens_per_cta = static_cast<int>(std::min<int64_t>(64, tokens_per_cta * heads / written));
  // One CTA of at most 512 threads for the tokens' items and at most 48 KB of tables; fewer tokens where they
  // would not fit.
  tokens_per_cta = static_cast<int>(std::min<int64_t>({tokens_per_cta, 512 * items / std::max<int64_t>(per_token, 1),
                                                       (48 << 10) / (8 + 4 * p.head_dim)}));
  if (p.head_dim % 16 != 0 || p.head_dim / 2 > kMaxHalf || !aligned || tokens_per_cta < 1) return launch_qkv_rope(p, stream);
  if (p.tokens == 0) return Status::ok();
  const int threads = static_cast<int>(ceil_div64(ceil_div64(tokens_per_cta * per_token, items), 32) * 32);
  if (items == 2) return launch_qkv_rope_stream_items<2>(p, tokens_per_cta, threads, stream);
  if (items == 4) return launch_qkv_rope_stream_items<4>(p, tokens_per_cta, threads, stream);
  return launch_qkv_rope_stream_items<8>(p, tokens_per_cta, threads, stream);
}

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
