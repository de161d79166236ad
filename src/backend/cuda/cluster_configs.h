// Configs of the decode kernels whose CTAs reduce across a CTA cluster in distributed shared memory (sm_90+).
// Apart from kernel_configs.h, which every .cu file includes through kernels.h: a change here rebuilds only the
// files that use these.
#pragma once

#include <cstdint>

#include "backend/cuda/device_info.h"
#include "backend/cuda/kernel_configs.h"

namespace mx::cuda {

// The swap-AB decode attention (attention_decode_swap.cu) with a token's splits of a kv head as one cluster of
// this many CTAs, which merge the splits' softmax states in distributed shared memory: no partials through
// global memory and no merge kernel.
inline constexpr int kAttnSwapClusterSplits = 16;

// `c` (choose_attention_decode_swap_config's for the same shape) for the clustered form: kAttnSwapClusterSplits
// splits of at least one 16-key stage, the ring's full depth where 2 CTAs still share an SM; not enabled off
// sm_90+ or at head dims other than 256 and 512 (clusters of 16 are Hopper's non-portable size).
AttentionDecodeSwapConfig attention_decode_swap_cluster_config(const DeviceInfo& dev, AttentionDecodeSwapConfig c,
                                                               int64_t head_dim, bool kv_shared);
// `cc` (an enabled cluster config) for one token where each split holds at most kAttnSwapShortRingKeys keys
// (Gemma-4's sliding layers: a 1024-key window over 16 splits of 64 keys, 4 stages): its ring cut to `stages` (2 to
// its own depth; 0 keeps it). At head dim 256 a ring of 2 stages is ~41 KB a CTA instead of ~74, so that two of the
// staged o_proj's 91-KB CTAs fit beside each attention CTA: they are resident, and copy o_proj's whole weight, while
// the attention runs (with 4 stages one fits: about half of it). Elsewhere (longer splits: full layers, the ring's
// depth hides the keys' latency) `cc` as it is.
inline constexpr int64_t kAttnSwapShortRingKeys = 64;
AttentionDecodeSwapConfig attention_decode_swap_one_token_ring(AttentionDecodeSwapConfig cc, int64_t head_dim,
                                                               bool kv_shared, int64_t max_keys, int stages);
// Whether kAuto takes the clustered form (an enabled cluster config) for this shape, many tokens and kv heads:
// where it was measured faster.
bool attention_decode_swap_cluster_by_default(const DeviceInfo& dev, const AttentionDecodeSwapConfig& c,
                                              int64_t head_dim, bool kv_shared, int64_t num_tokens, int64_t n_kv);

}  // namespace mx::cuda
