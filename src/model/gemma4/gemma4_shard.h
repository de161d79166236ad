// What a tensor-parallel rank of Gemma-4 holds (model_shard.h): its query heads (their rows of q and
// columns of o_proj), each layer's KV heads for them (a layer with fewer KV heads than ranks, such as the
// full layers' 2, replicates each on size / KV heads ranks), its share of the dense MLP's intermediate
// dimension and of every expert's (so every rank routes to every expert, each computing its slice), and its
// rows of the tied lm_head; embeddings, norms, the router and the layer scalars are whole on every rank.
// o_proj, the dense MLP and the experts each end in an all-reduce (each branch is normed after its sum);
// the logits' columns meet in an all-gather.
#pragma once

#include <cstdint>
#include <vector>

#include "model/gemma4/gemma4_config.h"
#include "model/model_shard.h"

namespace mx {

struct Gemma4ShardPlan {
  int64_t first_head = 0, heads = 0;
  std::vector<int64_t> first_kv_head, kv_heads;  // [num_layers]
  int64_t first_intermediate = 0, intermediate = 0;              // dense MLP
  int64_t first_expert_intermediate = 0, expert_intermediate = 0;  // each expert's
  int64_t first_vocab = 0, vocab = 0;
};

// The plan of `shard.rank`, or a clear error when the shapes do not split over shard.size ranks.
Result<Gemma4ShardPlan> plan_gemma4_shard(const Gemma4Config& config, const ModelShard& shard);

// The block [r0, r1) x [c0, c1) of a row-major bf16 matrix of `cols` columns at `src`, appended to `out`
// (a rank's rows or columns of a weight, copied out of the checkpoint).
void append_bf16_block(const uint16_t* src, int64_t cols, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                       std::vector<uint16_t>* out);

}  // namespace mx
