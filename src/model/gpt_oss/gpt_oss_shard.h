// What a tensor-parallel rank of gpt-oss holds (model_shard.h): its query heads (with their sinks and o_proj
// columns), its KV heads (replicated when there are more ranks than KV heads), its share of the experts and
// its rows of the lm_head; norms, embeddings and the router are whole on every rank.
//
// The experts split one of two ways (MoeSplit): by intermediate dimension, every rank a slice of every
// expert's channels (gate_up rows, down_proj's K columns; the down bias added by rank 0 only), so every rank
// streams 1/N of each active expert; or by expert, each rank 1/N of the experts whole, so at batch 1 the
// 4 active experts sit on one or two ranks while the others idle. Either way the ranks' partial sums meet in
// the same all-reduce (fused with the residual add and the next norm).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "model/gpt_oss/gpt_oss_config.h"
#include "model/load_options.h"
#include "model/model_shard.h"

namespace mx {

// The split when the user names none (MoeSplit::kAuto): by intermediate dimension, faster than by expert at
// every batch measured (4 x H100, docs/PERF.md "Tensor parallel: the MoE split"; 120b TP 4 TPOT b=1 2.65 ms,
// b=64 9.75 ms; TP 2 b=1 3.10 vs 3.44 ms, b=64 13.49 vs 15.34 ms). A model whose channels do not make one
// whole slice per rank falls back to the expert split (the start-up log names the split each rank took).
inline constexpr MoeSplit kGptOssDefaultMoeSplit = MoeSplit::kByIntermediate;

// The intermediate split deals out whole slices of this many channels: the CUDA MoE kernels take K in
// 64-wide tiles (rows % 16, k % 64 = two MXFP4 blocks of 32), and a rank's slice is down_proj's K. gpt-oss's
// 2880 channels are 45 slices: TP 2 gets 1472 + 1408, TP 4 768 + 3 x 704, TP 8 5 x 384 + 3 x 320.
inline constexpr int64_t kExpertSliceChannels = 64;

struct GptOssShardPlan {
  int64_t first_head = 0, heads = 0;
  int64_t first_kv_head = 0, kv_heads = 0;
  MoeSplit moe_split = MoeSplit::kByExpert;            // never kAuto
  int64_t first_expert = 0, experts = 0;               // by intermediate: all of them
  int64_t first_intermediate = 0, intermediate = 0;    // by expert: all of them
  int64_t first_vocab = 0, vocab = 0;
  bool adds_o_bias = true;     // o_proj is row-parallel: one rank adds its bias
  bool adds_down_bias = true;  // by intermediate, down_proj is too
};

// The plan of `shard.rank`, or a clear error when the shapes do not split over shard.size ranks.
Result<GptOssShardPlan> plan_gpt_oss_shard(const GptOssConfig& config, const ModelShard& shard,
                                           MoeSplit moe_split = MoeSplit::kAuto);

// How the slice copies below spread over threads: a rank of 120b copies tens of GiB out of the checkpoint's mmap
// (page faults included), which one thread does at well under 1 GiB/s, so a big tensor's copy is split by its
// outer rows among threads of at least min_bytes_per_thread each. Tests lower the threshold to reach the
// threaded path with small tensors.
struct SliceCopyThreads {
  int64_t min_bytes_per_thread = int64_t{64} << 20;
  int64_t max_threads = 0;  // 0: the host's cores
};

// Channels [first, first + count) of every expert of `whole` (host memory, checkpoint layout): gate_up rows
// [2 first, 2 (first + count)) (the checkpoint interleaves gate and up by row, so each pair stays together),
// down_proj's K columns [first, first + count) in whole MXFP4 blocks (first and count multiples of 32), the
// down bias where `down_bias`, else zeros (the ranks' sum adds it once). The tensors are copies appended to
// `storage`, which must outlive the result.
Result<ExpertWeights> slice_expert_intermediate(const ExpertWeights& whole, int64_t first, int64_t count, bool down_bias,
                                                std::vector<std::vector<uint8_t>>* storage,
                                                const SliceCopyThreads& threads = {});

}  // namespace mx
