// Host-side repacking of MXFP4 expert matrices into the "swap AB" layout the CUDA MoE kernels read
// (ExpertLayout::kMxfp4SwapAb). Plain C++ so that CPU unit tests can check it element by element.
//
// The weights become the A operand (16 rows x 16 k) of mma.sync.m16n8k16. For each strip of 16 rows and
// each 64-wide k tile, lane l (r = l / 4, q = l % 4) owns 16 contiguous bytes: its A-fragment nibbles for
// the tile's 4 k-steps. The k order inside a tile is permuted so that lane q's 16 weights of a row are the
// physical k range [64t + 16q, 64t + 16q + 16): one MX block per lane (two scales per tile), and the
// matching activations are one 32-byte run. The 32-bit word of k-step kk (physical k base b = 64t + 16q +
// 4kk) holds the 8 codes of A registers 0..3: (r, b | b+1), (r+8, b | b+1), (r, b+2 | b+3), (r+8, b+2 | b+3),
// each code's bits scattered so that the decode is a rotation and a mask per register (mxfp4_word.h).
// Scales: [strip][tile][block 0/1][16 rows], each e8m0 + 126, so that (s << 7) is the bf16 of
// 2^126 * 2^(s - 127): the fp4 magnitude bits placed in a bf16's low exponent bits carry a 2^-126 factor.
// That needs s <= 128 (|scale| <= 2): checked at upload.
// For W1 (gate/up interleaved by row), strip s holds the gate rows of channels 8s..8s+7 in rows 0..7 and
// their up rows in rows 8..15: one lane's accumulators then hold gate and up of the same channel.
#pragma once

#include <cstdint>

#include "core/status.h"

namespace mx::cuda {

inline constexpr int kSwapAbMaxScale = 128;

// Checks that a [rows, k] MXFP4 matrix can be repacked (rows % 16, k % 64, every scale <= 128).
Status check_swap_ab(int64_t rows, int64_t k, const uint8_t* scales);

// Repacks one expert matrix. blocks [rows, k/32, 16], scales [rows, k/32] -> out_blocks (rows * k / 2 bytes),
// out_scales (rows * k / 32 bytes). `gate_up_pairs`: rows interleave gate (even) and up (odd).
void repack_mxfp4_swap_ab(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int64_t k, bool gate_up_pairs,
                          uint8_t* out_blocks, uint8_t* out_scales);

// The checkpoint row held by row `rr` (0..15) of packed strip `strip`.
int64_t swap_ab_source_row(int64_t strip, int rr, bool gate_up_pairs);

// Reads weight (row, k) back from the packed layout, emulating the kernel's fragment decode (for tests).
float swap_ab_weight(const uint8_t* out_blocks, const uint8_t* out_scales, int64_t rows, int64_t k, int64_t packed_row,
                     int64_t col);

}  // namespace mx::cuda
