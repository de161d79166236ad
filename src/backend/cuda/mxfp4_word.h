// The bit layout of one 32-bit word of the swap-AB MXFP4 expert layout (expert_repack.h), shared by the
// host repack (and its unit tests' decode) and every CUDA kernel that decodes it (mxfp4_swap_ab.cuh), so
// the two cannot drift apart.
//
// A word holds the 8 e2m1 codes of one mma.sync A fragment's k-step: register j (0: row r, k b and b+1;
// 1: row r+8, same k; 2: row r, k b+2 and b+3; 3: row r+8, same k), half h (0: the first k, 1: the second).
// A decoded half is a bf16 with the code's sign at bit 15 and its three magnitude bits at bits 6-8 (the
// value times 2^-126, which the row's scale cancels). Why not one code per nibble: the decode would then need
// two shifts and two masks per register (a sign and a magnitude land 7 bits apart) plus the shift to the next
// nibble, ~15 ALU instructions per word, a third of the decode kernels' issue slots at one token. Here each
// code's four bits sit where one 32-bit rotation puts all of them in place at once for registers 0-2 (sign
// and magnitudes of both halves: rotate, then one mask), and register 3 takes two rotations (no four
// rotations of the pattern {6, 7, 8, 15, 22, 23, 24, 31} tile 32 bits): 9 integer instructions per word,
// two of which a kernel may take as plain left shifts (swap_ab_decode_word<true>).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MX_SWAP_AB_FN __host__ __device__ __forceinline__
#else
#define MX_SWAP_AB_FN inline
#endif

namespace mx::cuda {

// Left rotation of register j's code bit (0 mantissa, 1 and 2 exponent, 3 sign) from where the word stores it
// to where the decoded bf16x2 has it: bit (6, 7, 8, 15)[bit] + 16 h of register j is stored at that position
// minus this rotation, mod 32.
inline constexpr int kSwapAbRotation[4][4] = {{0, 0, 0, 0}, {4, 4, 4, 4}, {10, 10, 10, 10}, {6, 6, 14, 6}};
inline constexpr int kSwapAbTargetBit[4] = {6, 7, 8, 15};

constexpr int swap_ab_stored_bit(int reg, int half, int bit) {
  return (kSwapAbTargetBit[bit] + 16 * half - kSwapAbRotation[reg][bit] + 32) % 32;
}

MX_SWAP_AB_FN uint32_t swap_ab_rotl(uint32_t v, int s) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_l(v, v, s);
#else
  return s == 0 ? v : (v << s) | (v >> (32 - s));
#endif
}

// Whether every code bit that register `reg` takes through the left rotation by `rot` is stored at least `rot`
// bits below the word's top, so that a left shift by `rot` puts it where the rotation does (the bits only the
// rotation carries around the top land outside the register's mask).
constexpr bool swap_ab_rotation_is_shift(int reg, int rot) {
  for (int half = 0; half < 2; ++half)
    for (int bit = 0; bit < 4; ++bit)
      if (kSwapAbRotation[reg][bit] == rot && swap_ab_stored_bit(reg, half, bit) + rot >= 32) return false;
  return true;
}

// The four A registers of a word, unscaled (each half: sign at bit 15, magnitude at bits 6-8, rest zero).
// kShifts: register 1's rotation by 4 and register 3's by 6 as left shifts (swap_ab_rotation_is_shift: the same
// bits), which the compiler can issue as IMAD.SHL on the FMA pipe instead of a funnel shift on the ALU pipe,
// where the masks and the other two rotations already are. The 16-token MoE wgmma kernel at batched decode is
// bound by the ALU pipe (ncu, gpt-oss-120b at 8 tokens per expert, H200, session 14) and measured 4.7% faster
// with them (session 15 W2); in the 96-token kernel they made ptxas serialize every wgmma (C7511: 121 -> 96
// registers). The MXFP4 decode GEMMs (moe_decode.cu) take them up to kMoeFusedShiftSlots routed slots (session 24: one
// token's layer 22.44 -> 21.05 us); the rest keep the rotations they were measured with.
template <bool kShifts = false>
MX_SWAP_AB_FN void swap_ab_decode_word(uint32_t v, uint32_t (&a)[4]) {
  static_assert(swap_ab_rotation_is_shift(1, 4) && swap_ab_rotation_is_shift(3, 6), "see above");
  constexpr uint32_t kCode = 0x81C081C0u;  // sign and magnitude bits of both halves
  a[0] = v & kCode;
  a[1] = (kShifts ? v << 4 : swap_ab_rotl(v, 4)) & kCode;
  a[2] = swap_ab_rotl(v, 10) & kCode;
  a[3] = ((kShifts ? v << 6 : swap_ab_rotl(v, 6)) & 0x80C080C0u) | (swap_ab_rotl(v, 14) & 0x01000100u);
}

}  // namespace mx::cuda

#undef MX_SWAP_AB_FN
