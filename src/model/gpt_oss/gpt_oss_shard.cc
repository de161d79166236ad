#include "model/gpt_oss/gpt_oss_shard.h"

#include <algorithm>
#include <string>

namespace mx {

Result<GptOssShardPlan> plan_gpt_oss_shard(const GptOssConfig& c, const ModelShard& shard) {
  const int64_t n = shard.size, r = shard.rank;
  if (n < 1 || r < 0 || r >= n)
    return invalid_argument("tensor-parallel rank " + std::to_string(r) + " of " + std::to_string(n));
  // Query heads and experts split evenly; KV heads too, or each is replicated on n / KV heads ranks (a GQA
  // group then never straddles two ranks).
  MX_RETURN_IF_ERROR(check_even_split("attention heads", c.num_heads, static_cast<int>(n)));
  if (n % c.num_kv_heads != 0) MX_RETURN_IF_ERROR(check_even_split("KV heads", c.num_kv_heads, static_cast<int>(n)));
  MX_RETURN_IF_ERROR(check_even_split("experts", c.num_experts, static_cast<int>(n)));
  GptOssShardPlan p;
  p.heads = c.num_heads / n;
  p.first_head = r * p.heads;
  p.kv_heads = std::max<int64_t>(1, c.num_kv_heads / n);
  p.first_kv_head = c.num_kv_heads >= n ? r * p.kv_heads : r / (n / c.num_kv_heads);
  p.experts = c.num_experts / n;
  p.first_expert = r * p.experts;
  const auto [v0, v1] = shard_range(c.vocab_size, static_cast<int>(r), static_cast<int>(n));
  p.first_vocab = v0;
  p.vocab = v1 - v0;
  p.adds_o_bias = r == 0;
  return p;
}

}  // namespace mx
