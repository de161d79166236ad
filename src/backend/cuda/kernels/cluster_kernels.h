// Launches of the decode kernels whose CTAs reduce across a CTA cluster in distributed shared memory (sm_90+),
// apart from kernels.h (which every kernel file includes: a change here rebuilds only the files that use these).
#pragma once

#include "backend/cuda/cluster_configs.h"
#include "backend/cuda/kernels/kernels.h"

namespace mx::cuda {

// attention_decode_swap.cu at head dims 256 and 512 with c.num_splits == kAttnSwapClusterSplits: a token's splits
// of a kv head are one cluster and merge in distributed shared memory (no partials, no merge kernel).
Status launch_attention_decode_swap_cluster(const AttentionKernelParams& p, const AttentionDecodeSwapConfig& c,
                                            cudaStream_t stream);

}  // namespace mx::cuda
