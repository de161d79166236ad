// What a tensor-parallel rank of gpt-oss holds (model_shard.h): its query heads (with their sinks and o_proj
// columns), its KV heads (replicated when there are more ranks than KV heads), its experts and its rows of
// the lm_head; norms, embeddings and the router are whole on every rank.
#pragma once

#include "model/gpt_oss/gpt_oss_config.h"
#include "model/model_shard.h"

namespace mx {

struct GptOssShardPlan {
  int64_t first_head = 0, heads = 0;
  int64_t first_kv_head = 0, kv_heads = 0;
  int64_t first_expert = 0, experts = 0;
  int64_t first_vocab = 0, vocab = 0;
  bool adds_o_bias = true;  // o_proj is row-parallel: one rank adds its bias
};

// The plan of `shard.rank`, or a clear error when the shapes do not split over shard.size ranks.
Result<GptOssShardPlan> plan_gpt_oss_shard(const GptOssConfig& config, const ModelShard& shard);

}  // namespace mx
