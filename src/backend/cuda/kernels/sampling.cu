// The sample op (backend/sampling_math.h is the algorithm; cpu/sampling.cc its twin). Four launches:
//   1. row_stats: grid (chunks, rows) - per chunk of kChunk tokens, read once into registers: the sanitized
//                maximum, its first index and the sum of exp(x - chunk maximum) (the logprob's denominator);
//   2. cuts:     one 1024-thread CTA per row - merges (1) (the sums rescaled to the row maximum, in chunk
//                order), then for rows with top-k / top-p finds the cuts by radix select over the logits'
//                order keys (11 + 11 + 10 bits): counts for top-k, exact integer masses for top-p, then the
//                same select over ids when a cut falls inside a run of equal logits;
//   3. draw:     grid (chunks, rows) - Gumbel key argmax over the kept tokens (Philox per 4 tokens); greedy
//                rows return at once, so a greedy batch reads its logits once (a 256-row step's 206 MB);
//   4. finish:   one warp per row - merges (3) in chunk order.
// Chunks are a fixed size, so every per-row result (logprob bits included) is independent of the batch.
#include <cfloat>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/kernels.h"

namespace mx::cuda {
namespace {

using namespace mx::sampling;

constexpr int kChunk = 4096;
constexpr int kStreamThreads = 256;
constexpr int kSelectThreads = 1024;
constexpr int kBuckets = 2048;  // 11-bit digits; two per select thread

constexpr int kValuesPerThread = kChunk / kStreamThreads;

struct StatsPartial {
  float value;    // the chunk's sanitized maximum
  int32_t id;     // its first index
  float sum_exp;  // sum of exp(x - value) over the chunk (0 when value is -inf)
};
struct DrawPartial {
  float key;
  int32_t id;
};
struct RowState {
  float m;          // sanitized maximum (-inf when nothing is finite)
  int32_t argmax;   // its first index
  float inv_t;      // 0 = greedy
  float min_e;      // min-p threshold on exp(s); 0 = off
  float sum_exp;    // sum of exp(x - m) over the row (0 when m is -inf)
  Cut k_cut, p_cut;
};

int64_t num_chunks(int64_t vocab) { return (vocab + kChunk - 1) / kChunk; }

__device__ __forceinline__ bool better(float v, int32_t id, float best, int32_t best_id) {
  return v > best || (v == best && id < best_id);
}

// Block-wide argmax (lowest id on ties), result valid in every thread.
__device__ void block_argmax(float& v, int32_t& id, float* sv, int32_t* si) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, id, o);
    if (better(ov, oi, v, id)) {
      v = ov;
      id = oi;
    }
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  __syncthreads();
  if (lane == 0) {
    sv[warp] = v;
    si[warp] = id;
  }
  __syncthreads();
  v = sv[0];
  id = si[0];
  for (int w = 1; w < warps; ++w)
    if (better(sv[w], si[w], v, id)) {
      v = sv[w];
      id = si[w];
    }
}

// Sum over the block in a fixed order (shuffle tree within warps, then warps in order), valid in thread 0.
__device__ float block_sum_in_order(float v, float* ss) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (threadIdx.x % 32 == 0) ss[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.0f;
  if (threadIdx.x == 0)
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += ss[w];
  return total;
}

__global__ void __launch_bounds__(kStreamThreads) row_stats_kernel(const float* __restrict__ logits, int64_t vocab,
                                                                   StatsPartial* __restrict__ out) {
  __shared__ float sv[32], ss[32];
  __shared__ int32_t si[32];
  const int64_t row = blockIdx.y, begin = static_cast<int64_t>(blockIdx.x) * kChunk;
  const int64_t end = min(vocab, begin + kChunk);
  const float* x = logits + row * vocab;
  // Every load first (the chunk's 16 KB in flight at once), then the maximum and the sum from registers.
  float v[kValuesPerThread];
#pragma unroll
  for (int j = 0; j < kValuesPerThread; ++j) {
    const int64_t i = begin + threadIdx.x + j * kStreamThreads;
    v[j] = i < end ? sanitize(x[i]) : -INFINITY;
  }
  float best = -INFINITY;
  int32_t best_id = INT32_MAX;
#pragma unroll
  for (int j = 0; j < kValuesPerThread; ++j) {  // ascending ids: the first index wins ties
    const auto id = static_cast<int32_t>(begin + threadIdx.x + j * kStreamThreads);
    if (better(v[j], id, best, best_id)) {
      best = v[j];
      best_id = id;
    }
  }
  block_argmax(best, best_id, sv, si);
  float sum = 0.0f;
  if (best > -INFINITY) {
#pragma unroll
    for (int j = 0; j < kValuesPerThread; ++j) sum += __expf(v[j] - best);
  }
  sum = block_sum_in_order(sum, ss);
  if (threadIdx.x == 0) out[row * gridDim.x + blockIdx.x] = {best, best_id, sum};
}

// Weighted histogram as two 32-bit words per bucket: native 32-bit shared atomics instead of 64-bit ones
// (a compare-and-swap loop under contention). The low word's wrap-arounds are carried into the high word
// by the thread whose addition wrapped, so the 64-bit totals stay exact in any order.
struct SelectShared {
  uint32_t lo[kBuckets], hi[kBuckets];
  unsigned long long warp_sums[32];
  uint32_t found_bucket;
  unsigned long long found_above, found_tie;
};

struct SelectResult {
  uint32_t key;
  unsigned long long above;   // weight of candidates ranked above `key`
  unsigned long long tie;     // weight of candidates with exactly `key`
  unsigned long long target;
};

__device__ __forceinline__ void hist_add(SelectShared& sh, uint32_t bucket, unsigned long long w) {
  const auto w_lo = static_cast<uint32_t>(w), w_hi = static_cast<uint32_t>(w >> 32);
  const uint32_t old = atomicAdd(&sh.lo[bucket], w_lo);
  const uint32_t hi_add = w_hi + (old + w_lo < old ? 1u : 0u);
  if (hi_add) atomicAdd(&sh.hi[bucket], hi_add);
}
__device__ __forceinline__ unsigned long long hist_get(const SelectShared& sh, int bucket) {
  return (static_cast<unsigned long long>(sh.hi[bucket]) << 32) | sh.lo[bucket];
}

// Exclusive prefix sum over the block's threads in thread order; `total` gets the block sum.
__device__ unsigned long long block_exclusive_sum(unsigned long long v, SelectShared& sh, unsigned long long& total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  unsigned long long incl = v;
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned long long n = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += n;
  }
  if (lane == 31) sh.warp_sums[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    unsigned long long w = sh.warp_sums[lane];
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned long long n = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += n;
    }
    sh.warp_sums[lane] = w;
  }
  __syncthreads();
  total = sh.warp_sums[31];
  return (warp == 0 ? 0ull : sh.warp_sums[warp - 1]) + incl - v;
}

// Finds the candidate at which the weight, summed in descending key order, reaches the target: three
// digit passes, each a weighted histogram of the candidates that match the digits found so far. `item(i,
// key)` returns false for non-candidates and sets the key; `weight(i)` is asked only for matching ones.
// `target_of(total)` turns the first pass's total weight into the target (>= 1, <= total).
template <class Item, class Weight, class Target>
__device__ SelectResult radix_select(int64_t n, const Item& item, const Weight& weight, const Target& target_of,
                                     SelectShared& sh) {
  constexpr int kShift[3] = {21, 10, 0};
  constexpr uint32_t kDigit[3] = {0x7ffu, 0x7ffu, 0x3ffu};
  uint32_t prefix = 0, mask = 0;
  unsigned long long above = 0, tie = 0, target = 0;
  for (int pass = 0; pass < 3; ++pass) {
    for (int b = threadIdx.x; b < kBuckets; b += blockDim.x) {
      sh.lo[b] = 0;
      sh.hi[b] = 0;
    }
    __syncthreads();
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      uint32_t key;
      if (!item(i, key) || (key & mask) != prefix) continue;
      const unsigned long long w = weight(i);
      if (w) hist_add(sh, (key >> kShift[pass]) & kDigit[pass], w);
    }
    __syncthreads();
    // Thread t owns buckets hi = 2047 - 2t and hi - 1: thread order is descending bucket order.
    const int hi = kBuckets - 1 - 2 * static_cast<int>(threadIdx.x);
    const unsigned long long h0 = hist_get(sh, hi), h1 = hist_get(sh, hi - 1);
    unsigned long long total = 0;
    const unsigned long long excl = block_exclusive_sum(h0 + h1, sh, total);
    if (pass == 0) target = target_of(total);
    const unsigned long long rem = target - above;
    if (excl < rem && rem <= excl + h0) {
      sh.found_bucket = static_cast<uint32_t>(hi);
      sh.found_above = excl;
      sh.found_tie = h0;
    } else if (excl + h0 < rem && rem <= excl + h0 + h1) {
      sh.found_bucket = static_cast<uint32_t>(hi - 1);
      sh.found_above = excl + h0;
      sh.found_tie = h1;
    }
    __syncthreads();
    prefix |= sh.found_bucket << kShift[pass];
    mask |= kDigit[pass] << kShift[pass];
    above += sh.found_above;
    tie = sh.found_tie;
    __syncthreads();
  }
  return {prefix, above, tie, target};
}

// Among candidates with value key `key` (those for which `in_set(i)` holds), the id at which `needed` of
// them (lowest ids first) are kept.
template <class InSet>
__device__ int32_t tie_cut(const float* x, int64_t vocab, uint32_t key, unsigned long long needed, const InSet& in_set,
                           SelectShared& sh) {
  const SelectResult r = radix_select(
      vocab,
      [&](int64_t i, uint32_t& k) {
        if (order_key(sanitize(x[i])) != key || !in_set(i)) return false;
        k = ~static_cast<uint32_t>(i);  // descending ~id = ascending id
        return true;
      },
      [](int64_t) { return 1ull; }, [&](unsigned long long) { return needed; }, sh);
  return static_cast<int32_t>(~r.key);
}

__global__ void __launch_bounds__(kSelectThreads) cuts_kernel(const float* __restrict__ logits, int64_t vocab,
                                                              const SampleRowParams* __restrict__ params,
                                                              const StatsPartial* __restrict__ partials, int64_t chunks,
                                                              RowState* __restrict__ states) {
  __shared__ SelectShared sh;
  __shared__ float sv[32];
  __shared__ int32_t si[32];
  const int64_t row = blockIdx.x;
  const float* x = logits + row * vocab;
  float m = -INFINITY;
  int32_t argmax = INT32_MAX;
  for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
    const StatsPartial p = partials[row * chunks + c];
    if (better(p.value, p.id, m, argmax)) {
      m = p.value;
      argmax = p.id;
    }
  }
  block_argmax(m, argmax, sv, si);
  // The chunks' sums rescaled to the row maximum, merged in a fixed order: lane l takes chunks l, l + 32, ...
  // in turn, then a shuffle tree (warp 0; the result in thread 0).
  float sum_exp = 0.0f;
  if (threadIdx.x < 32 && m > -INFINITY) {
    for (int64_t c = threadIdx.x; c < chunks; c += 32) {
      const StatsPartial p = partials[row * chunks + c];
      if (p.value > -INFINITY) sum_exp += p.sum_exp * __expf(p.value - m);
    }
    for (int o = 16; o > 0; o >>= 1) sum_exp += __shfl_xor_sync(0xffffffffu, sum_exp, o);
  }
  const SampleRowParams p = params[row];
  RowState st;
  st.m = m;
  st.argmax = argmax;
  st.sum_exp = sum_exp;
  st.inv_t = m > -INFINITY ? inverse_temperature(p.temperature) : 0.0f;
  st.min_e = min_p_threshold(p.min_p);
  if (st.inv_t > 0.0f && has_top_k(p.top_k, vocab)) {
    const auto k = static_cast<unsigned long long>(p.top_k);
    const SelectResult r = radix_select(
        vocab,
        [&](int64_t i, uint32_t& key) {
          key = order_key(sanitize(x[i]));
          return true;
        },
        [](int64_t) { return 1ull; }, [&](unsigned long long) { return k; }, sh);
    st.k_cut.key = r.key;
    const unsigned long long needed = k - r.above;
    if (needed < r.tie) st.k_cut.id = tie_cut(x, vocab, r.key, needed, [](int64_t) { return true; }, sh);
  }
  if (st.inv_t > 0.0f && has_top_p(p.top_p)) {
    const Cut k_cut = st.k_cut;
    const float inv_t = st.inv_t, top_p = p.top_p;
    auto in_top_k = [&](int64_t i) { return within(order_key(sanitize(x[i])), static_cast<int32_t>(i), k_cut); };
    const SelectResult r = radix_select(
        vocab,
        [&](int64_t i, uint32_t& key) {
          key = order_key(sanitize(x[i]));
          return within(key, static_cast<int32_t>(i), k_cut);
        },
        [&](int64_t i) { return static_cast<unsigned long long>(mass_of(exp_nonpositive(scaled(sanitize(x[i]), m, inv_t)))); },
        [&](unsigned long long total) { return static_cast<unsigned long long>(top_p_target(total, top_p)); }, sh);
    st.p_cut.key = r.key;
    // Tokens with equal logits have equal masses: keep as many of the tie as the target still needs.
    const unsigned long long w = mass_of(exp_nonpositive(scaled(key_float(r.key), m, inv_t)));
    const unsigned long long needed = (r.target - r.above + w - 1) / w, ties = r.tie / w;
    if (needed < ties) st.p_cut.id = tie_cut(x, vocab, r.key, needed, in_top_k, sh);
  }
  if (threadIdx.x == 0) states[row] = st;
}

__global__ void draw_kernel(const float* __restrict__ logits, int64_t vocab, const SampleRowParams* __restrict__ params,
                            const RowState* __restrict__ states, DrawPartial* __restrict__ out) {
  __shared__ float sv[32];
  __shared__ int32_t si[32];
  const int64_t row = blockIdx.y, begin = static_cast<int64_t>(blockIdx.x) * kChunk;
  const int64_t end = min(vocab, begin + kChunk);
  const float* x = logits + row * vocab;
  const RowState st = states[row];
  if (!(st.inv_t > 0.0f)) return;  // greedy: finish takes the argmax of row_stats
  const SampleRowParams p = params[row];
  float best = -INFINITY;
  int32_t best_id = INT32_MAX;
  // Each thread takes groups of 4 consecutive tokens: one Philox call gives all four their words.
  for (int64_t g = begin + 4 * threadIdx.x; g < end; g += 4 * blockDim.x) {
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = g + j < end ? sanitize(x[g + j]) : -INFINITY;
    float s[4];
    bool live[4], any = false;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const auto id = static_cast<int32_t>(g + j);
      const uint32_t key = order_key(v[j]);
      s[j] = scaled(v[j], st.m, st.inv_t);
      live[j] = g + j < end && within(key, id, st.k_cut) && within(key, id, st.p_cut) &&
                can_win(s[j], best) && !(st.min_e > 0.0f && exp_nonpositive(s[j]) < st.min_e);
      any |= live[j];
    }
    if (!any) continue;
    const Philox4 words = token_words(p.seed, p.step, static_cast<uint64_t>(g / 4));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (!live[j]) continue;
      const float key = gumbel_key(s[j], words.w[j]);
      if (better(key, static_cast<int32_t>(g + j), best, best_id)) {
        best = key;
        best_id = static_cast<int32_t>(g + j);
      }
    }
  }
  block_argmax(best, best_id, sv, si);
  if (threadIdx.x == 0) out[row * gridDim.x + blockIdx.x] = {best, best_id};
}

__global__ void finish_kernel(const float* __restrict__ logits, int64_t vocab, const RowState* __restrict__ states,
                              const DrawPartial* __restrict__ partials, int64_t chunks, int32_t* __restrict__ tokens,
                              float* __restrict__ logprobs) {
  const int64_t row = blockIdx.x;
  const int lane = threadIdx.x;
  const RowState st = states[row];
  const bool sampling = st.inv_t > 0.0f;  // else draw wrote nothing for this row
  float best = -INFINITY;
  int32_t best_id = INT32_MAX;
  for (int64_t c = lane; sampling && c < chunks; c += 32) {
    const DrawPartial d = partials[row * chunks + c];
    if (better(d.key, d.id, best, best_id)) {
      best = d.key;
      best_id = d.id;
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, best_id, o);
    if (better(ov, oi, best, best_id)) {
      best = ov;
      best_id = oi;
    }
  }
  if (lane != 0) return;
  const int32_t token = sampling && best_id != INT32_MAX ? best_id : st.argmax;
  tokens[row] = token;
  if (logprobs)
    logprobs[row] = st.m > -INFINITY ? (sanitize(logits[row * vocab + token]) - st.m) - logf(st.sum_exp) : -INFINITY;
}

// Grammar masks: one thread per mask word of a masked row; a row whose flag is 0 returns at once, so an
// unconstrained batch pays one flag read per block.
__global__ void apply_token_mask_kernel(float* __restrict__ logits, int64_t vocab, const uint32_t* __restrict__ mask,
                                        const int32_t* __restrict__ mask_rows) {
  const int64_t row = blockIdx.y;
  if (mask_rows[row] == 0) return;
  const int64_t words = mask_words(vocab);
  const int64_t w = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (w >= words) return;
  const uint32_t bits = mask[row * words + w];
  if (bits == 0xffffffffu) return;
  float* x = logits + row * vocab;
  const int64_t end = w * 32 + 32 < vocab ? w * 32 + 32 : vocab;
  for (int64_t i = w * 32; i < end; ++i) {
    if (!((bits >> (i & 31)) & 1u)) x[i] = -INFINITY;
  }
}

}  // namespace

Status launch_apply_token_mask(float* logits, int64_t rows, int64_t vocab, const uint32_t* mask,
                               const int32_t* mask_rows, cudaStream_t stream) {
  if (rows == 0) return Status::ok();
  if (rows > 65535) return invalid_argument("token mask: at most 65535 rows per call");
  const int64_t blocks = (mask_words(vocab) + kStreamThreads - 1) / kStreamThreads;
  apply_token_mask_kernel<<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(rows)), kStreamThreads, 0, stream>>>(
      logits, vocab, mask, mask_rows);
  MX_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::ok();
}

int64_t sample_scratch_bytes(int64_t rows, int64_t vocab) {
  const int64_t chunks = num_chunks(vocab);
  return rows * (chunks * static_cast<int64_t>(sizeof(StatsPartial) + sizeof(DrawPartial)) + static_cast<int64_t>(sizeof(RowState))) + 256;
}

Status launch_sample(const SampleKernelParams& p, cudaStream_t stream) {
  if (p.rows == 0) return Status::ok();
  if (p.rows > 65535) return invalid_argument("sample: at most 65535 rows per call");
  if (p.vocab <= 0 || p.vocab > INT32_MAX - 4) return invalid_argument("sample: vocabulary size out of range");
  const int64_t chunks = num_chunks(p.vocab);
  if (p.scratch_bytes < sample_scratch_bytes(p.rows, p.vocab)) return internal_error("sample: scratch too small");
  auto* draw = static_cast<DrawPartial*>(p.scratch);
  auto* stats = reinterpret_cast<StatsPartial*>(draw + p.rows * chunks);
  auto* states = reinterpret_cast<RowState*>(stats + p.rows * chunks);
  const dim3 stream_grid(static_cast<unsigned>(chunks), static_cast<unsigned>(p.rows));
  row_stats_kernel<<<stream_grid, kStreamThreads, 0, stream>>>(p.logits, p.vocab, stats);
  cuts_kernel<<<static_cast<unsigned>(p.rows), kSelectThreads, 0, stream>>>(p.logits, p.vocab, p.params, stats, chunks,
                                                                           states);
  draw_kernel<<<stream_grid, kStreamThreads, 0, stream>>>(p.logits, p.vocab, p.params, states, draw);
  finish_kernel<<<static_cast<unsigned>(p.rows), 32, 0, stream>>>(p.logits, p.vocab, states, draw, chunks, p.tokens,
                                                                  p.logprobs);
  MX_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::ok();
}

}  // namespace mx::cuda
