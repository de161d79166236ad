// The MXFP4 decode GEMMs' (moe_decode.cu) shared-memory size and kAuto's k split per GEMM and form, shared by the
// config (kernel_configs.cc: choose_moe_fused_config), the launcher's check and the CPU tests.
//
// Staged scales (the default since session 20): each warp's scale bytes (32 a k tile: 16 rows x 2 blocks of 32 k)
// are copied into shared memory with its first weights, so the ring holds only weights and activations (56
// registers), and kAuto runs the first GEMM at one token in 3 warps a CTA and the second in 6. Scales in registers
// (the form before, a measured option: kernels/moe_decode_forms.h): each ring slot keeps its tile's two scale bytes
// (64-70 registers), 4 warps a CTA at one token. Both give the same bits at the same k split.
#pragma once

#include <cstdint>

namespace mx::cuda {

// A CTA of k_split warps' dynamic shared memory (MoeFusedConfig::smem_bytes): the (k_split - 1) x 512 bytes of the
// k split's reduction, then each warp's staged scales, ceil(k tiles / k_split) blocks of 32.
int64_t moe_fused_smem_bytes(int64_t k, int k_split);

// kAuto's k tiles per warp for this many routed slots in the first GEMM or the second (staged: 16 and 8 up to 4
// slots, 16 in both up to `three_warp_slots`: 3 warps at gpt-oss's k); with the scales in registers the form
// before's choice, moe_fused_auto_k_tiles_per_warp(num_slots) (kernel_configs.h). Session 20's kAuto: 4 three-warp
// slots (2 warps from 5 slots on).
inline constexpr int64_t kMoeFusedAutoThreeWarpSlots = 8;
int moe_fused_auto_k_tiles_per_warp(int64_t num_slots, bool first_gemm, bool scales_in_registers,
                                    int64_t three_warp_slots = kMoeFusedAutoThreeWarpSlots);

}  // namespace mx::cuda
