// The sampling algorithm both backends implement, in one place so that the CPU twin and the CUDA kernels
// pick the same token from the same logits, bit for bit. Compiled by the host compiler and by nvcc.
//
// Per row, with x' the sanitized logits (NaN -> -inf, +inf -> FLT_MAX, -0 -> +0) and m their maximum:
//   greedy (temperature <= 0, or nothing finite): the first index of the maximum.
//   otherwise s_i = (x'_i - m) * (1 / temperature), e_i = exp(s_i) in [0, 1] (e = 1 for the maximum), and
//   the token is the argmax over the kept set K of the Gumbel key s_i - log(-log(u_i)), ties to the lower
//   id, where u_i in (0, 1) comes from Philox4x32-10 keyed by the row's seed, counter (i / 4, domain, step).
//   The draw depends only on the row's logits, seed and step: not on the batch or on reduction order.
// Rank order: descending x', ties by ascending id. K is the intersection of
//   top-k: the first k tokens in rank order (k <= 0 or k >= vocab: all);
//   min-p: tokens with e_i >= min(min_p, 1) (min_p <= 0: all);
//   top-p: the shortest rank-order prefix of the top-k set whose mass reaches ceil(top_p * W), where a
//          token's mass is the integer floor(e_i * 2^40) and W is the mass of the top-k set (top_p >= 1:
//          all). Integer masses make the sums exact in any order; tokens more than ~27.7 nats (scaled)
//          below the maximum have mass 0 and are never needed to reach the target.
// K always holds the first token in rank order. A cut through tokens of equal x' keeps the lower ids.
// Every float operation below is an explicitly rounded add/sub/mul/div (no fused multiply-add), and
// exp/log are our own polynomials built from them, so host and device agree exactly. Host files that
// evaluate these functions must be compiled with -ffp-contract=off.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define MX_HD __host__ __device__ __forceinline__
#else
#define MX_HD inline
#endif

namespace mx {

// One row's sampling parameters as the sample op reads them (host or device memory; 32 bytes, no padding).
struct SampleRowParams {
  float temperature = 0.0f;  // <= 0 (or NaN): greedy
  float top_p = 1.0f;        // >= 1 (or NaN): off
  float min_p = 0.0f;        // <= 0 (or NaN): off; above 1 acts as 1
  int32_t top_k = 0;         // <= 0 or >= vocab: off
  uint64_t seed = 0;
  uint64_t step = 0;  // the draw's index in the request's stream (tokens sampled before this one)
};
static_assert(sizeof(SampleRowParams) == 32);

namespace sampling {

// A Gumbel variate from a 23-bit uniform is at most -log(-log(1 - 2^-24)) = 16.64: a token whose scaled
// logit is more than this below the best key found so far cannot win (an exact shortcut).
inline constexpr float kGumbelMax = 17.0f;
// The most likely token (s = 0) is always kept and its key is at least -log(-log(2^-24)) = -2.8116, so a
// token with s + kGumbelMax below this floor cannot win either.
inline constexpr float kBestKeyFloor = -2.82f;
inline constexpr uint32_t kPhiloxDomain = 0x53414d50u;  // "SAMP": separates these draws from other uses
inline constexpr float kMassScale = 1099511627776.0f;   // 2^40

// Explicitly rounded float operations and bit casts (nvcc's device pass sees the intrinsics).
#ifdef __CUDA_ARCH__
MX_HD float add_rn(float a, float b) { return __fadd_rn(a, b); }
MX_HD float sub_rn(float a, float b) { return __fsub_rn(a, b); }
MX_HD float mul_rn(float a, float b) { return __fmul_rn(a, b); }
MX_HD float div_rn(float a, float b) { return __fdiv_rn(a, b); }
MX_HD uint32_t float_bits(float f) { return __float_as_uint(f); }
MX_HD float bits_float(uint32_t u) { return __uint_as_float(u); }
#else
MX_HD float add_rn(float a, float b) { return a + b; }
MX_HD float sub_rn(float a, float b) { return a - b; }
MX_HD float mul_rn(float a, float b) { return a * b; }
MX_HD float div_rn(float a, float b) { return a / b; }
MX_HD uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
MX_HD float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
#endif

MX_HD float sanitize(float x) {
  if (x != x) return -INFINITY;
  if (x > FLT_MAX) return FLT_MAX;
  if (x == 0.0f) return 0.0f;  // -0 and +0 are one value: the rank order must not split them
  return x;
}

// A uint32 whose unsigned order is the float order (for sanitized values: no NaN, no -0).
MX_HD uint32_t order_key(float x) {
  const uint32_t u = float_bits(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
MX_HD float key_float(uint32_t k) { return bits_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k); }

// A rank-order cut: tokens at or above (key, id) are kept. Keep-all is (0, INT32_MAX).
struct Cut {
  uint32_t key = 0;
  int32_t id = INT32_MAX;
};
MX_HD bool within(uint32_t key, int32_t id, const Cut& c) { return key > c.key || (key == c.key && id <= c.id); }

// Philox4x32-10 (Salmon et al., SC'11): 10 rounds over a 4-word counter with a 2-word key.
struct Philox4 {
  uint32_t w[4];
};
MX_HD Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0, p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}
// The four random words of tokens 4g .. 4g + 3 of a row.
MX_HD Philox4 token_words(uint64_t seed, uint64_t step, uint64_t group) {
  return philox4x32_10(static_cast<uint32_t>(group), kPhiloxDomain, static_cast<uint32_t>(step),
                       static_cast<uint32_t>(step >> 32), static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// Polynomial constants are decimal literals (parsed correctly rounded by every compiler), never folded
// divisions.
// exp(x) for x <= 0 (relative error ~1e-7); 0 below -80 and for NaN. exp(0) is exactly 1.
MX_HD float exp_nonpositive(float x) {
  if (!(x >= -80.0f)) return 0.0f;
  const float t = mul_rn(x, 1.44269504f);
  const float kf = floorf(add_rn(t, 0.5f));
  // Cody-Waite: ln2_hi has 16 significant bits, so kf * ln2_hi is exact for |k| < 256.
  const float r = sub_rn(sub_rn(x, mul_rn(kf, 0.693145751953125f)), mul_rn(kf, 1.428606820309417e-6f));
  float p = 1.98412698e-4f;
  p = add_rn(mul_rn(p, r), 1.38888889e-3f);
  p = add_rn(mul_rn(p, r), 8.33333333e-3f);
  p = add_rn(mul_rn(p, r), 4.16666667e-2f);
  p = add_rn(mul_rn(p, r), 1.66666667e-1f);
  p = add_rn(mul_rn(p, r), 0.5f);
  p = add_rn(mul_rn(p, r), 1.0f);
  p = add_rn(mul_rn(p, r), 1.0f);
  const int k = static_cast<int>(kf);  // in [-116, 0]
  return mul_rn(p, bits_float(static_cast<uint32_t>(k + 127) << 23));
}

// log(x) for positive normal x (absolute error ~1e-7 near 1).
MX_HD float log_positive(float x) {
  const uint32_t u = float_bits(x);
  int e = static_cast<int>((u >> 23) & 0xffu) - 127;
  float m = bits_float((u & 0x7fffffu) | 0x3f800000u);  // [1, 2)
  if (m > 1.41421356f) {
    m = mul_rn(m, 0.5f);
    ++e;
  }
  const float f = sub_rn(m, 1.0f);  // exact (Sterbenz)
  const float s = div_rn(f, add_rn(2.0f, f));
  const float z = mul_rn(s, s);
  float p = 1.11111111e-1f;
  p = add_rn(mul_rn(p, z), 1.42857143e-1f);
  p = add_rn(mul_rn(p, z), 0.2f);
  p = add_rn(mul_rn(p, z), 3.33333333e-1f);
  p = add_rn(mul_rn(p, z), 1.0f);
  const float log_m = mul_rn(add_rn(s, s), p);  // 2 atanh(s)
  const float ef = static_cast<float>(e);
  return add_rn(mul_rn(ef, 0.693145751953125f), add_rn(log_m, mul_rn(ef, 1.428606820309417e-6f)));
}

// Whether a kept token with scaled logit `s` can still beat `best` (the best key seen so far): an exact
// shortcut that spares the draw of tokens far below the top.
MX_HD bool can_win(float s, float best) {
  return !(add_rn(s, kGumbelMax) < (best > kBestKeyFloor ? best : kBestKeyFloor));
}

// The Gumbel key of a kept token: s - log(-log(u)), u = (2j + 1) / 2^24 from the top 23 bits of `word`.
MX_HD float gumbel_key(float s, uint32_t word) {
  const float u = mul_rn(static_cast<float>(((word >> 9) << 1) | 1u), 5.9604644775390625e-8f);
  return sub_rn(s, log_positive(-log_positive(u)));
}

// 1 / temperature, or 0 when the row is greedy (temperature <= 0 or NaN, or so small that 1/T overflows).
MX_HD float inverse_temperature(float temperature) {
  if (!(temperature > 0.0f)) return 0.0f;
  const float inv = div_rn(1.0f, temperature);
  return inv <= FLT_MAX ? inv : 0.0f;
}
// Scaled logit s = (x' - m) / T in [-inf, 0]; NaN (an infinite difference times inv_t = 0) counts as -inf.
MX_HD float scaled(float x, float m, float inv_t) {
  const float s = mul_rn(sub_rn(x, m), inv_t);
  return s == s ? s : -INFINITY;
}
MX_HD uint64_t mass_of(float e) { return static_cast<uint64_t>(mul_rn(e, kMassScale)); }

// Grammar masks (constrained decoding): bit (id % 32) of word id / 32 of a row's mask set means the token is
// allowed. A masked row is sampled as if every disallowed logit were -inf (its logprob is then over the
// allowed tokens); the sample op writes those -inf into the logits first, on both backends.
MX_HD bool token_allowed(const uint32_t* mask_row, int64_t id) { return (mask_row[id >> 5] >> (id & 31)) & 1u; }
MX_HD int64_t mask_words(int64_t vocab) { return (vocab + 31) / 32; }

MX_HD bool has_top_k(int32_t top_k, int64_t vocab) { return top_k > 0 && top_k < vocab; }
MX_HD bool has_top_p(float top_p) { return top_p < 1.0f; }
MX_HD float min_p_threshold(float min_p) { return min_p > 0.0f ? (min_p < 1.0f ? min_p : 1.0f) : 0.0f; }

// The top-p target ceil(top_p * total) in [1, total], in double with round-to-nearest on both sides.
MX_HD uint64_t top_p_target(uint64_t total, float top_p) {
  const double p = top_p > 0.0f ? static_cast<double>(top_p) : 0.0;
#ifdef __CUDA_ARCH__
  const double t = ceil(__dmul_rn(__ull2double_rn(total), p));
#else
  const double t = std::ceil(static_cast<double>(total) * p);
#endif
  if (!(t >= 1.0)) return 1;
  const uint64_t v = t >= 18446744073709549568.0 ? total : static_cast<uint64_t>(t);
  return v < total ? v : total;
}

}  // namespace sampling
}  // namespace mx
