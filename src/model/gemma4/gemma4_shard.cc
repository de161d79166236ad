#include "model/gemma4/gemma4_shard.h"

#include <algorithm>
#include <string>
#include <utility>

namespace mx {
namespace {

// A rank's share of an intermediate dimension `width`: in slices of 8 where every rank gets at least one
// (CUDA's bf16 GeGLU experts take inner dimensions in multiples of 8), else as evenly as single columns go.
std::pair<int64_t, int64_t> intermediate_range(int64_t width, int rank, int size) {
  constexpr int64_t kSlice = 8;
  if (width % kSlice != 0 || width / kSlice < size) return shard_range(width, rank, size);
  const auto [b, e] = shard_range(width / kSlice, rank, size);
  return {b * kSlice, e * kSlice};
}

}  // namespace

Result<Gemma4ShardPlan> plan_gemma4_shard(const Gemma4Config& c, const ModelShard& shard) {
  const int n = shard.size, r = shard.rank;
  if (n < 1 || r < 0 || r >= n) return invalid_argument("tensor-parallel rank " + std::to_string(r) + " of " + std::to_string(n));
  MX_RETURN_IF_ERROR(check_even_split("attention heads", c.num_heads, n));
  Gemma4ShardPlan p;
  p.heads = c.num_heads / n;
  p.first_head = r * p.heads;
  for (const int64_t kv : c.layer_kv_heads) {
    // KV heads split evenly, or each replicated on n / kv ranks: a GQA group never straddles two ranks.
    if (n % kv != 0) MX_RETURN_IF_ERROR(check_even_split("KV heads", kv, n));
    const int64_t own = std::max<int64_t>(1, kv / n);
    p.kv_heads.push_back(own);
    p.first_kv_head.push_back(kv >= n ? r * own : r / (n / kv));
  }
  // Intermediate dimensions split as evenly as they go (every slice's partial sums add up to the whole), as
  // long as every rank gets some.
  if (c.intermediate_size < n || (c.moe && c.moe_intermediate_size < n))
    return invalid_argument("tensor parallel size " + std::to_string(n) + " exceeds the model's MLP widths (" +
                            std::to_string(c.intermediate_size) + " dense, " + std::to_string(c.moe_intermediate_size) +
                            " per expert)");
  const auto [i0, i1] = intermediate_range(c.intermediate_size, r, n);
  p.first_intermediate = i0;
  p.intermediate = i1 - i0;
  if (c.moe) {
    const auto [m0, m1] = intermediate_range(c.moe_intermediate_size, r, n);
    p.first_expert_intermediate = m0;
    p.expert_intermediate = m1 - m0;
  }
  const auto [v0, v1] = shard_range(c.vocab_size, r, n);
  p.first_vocab = v0;
  p.vocab = v1 - v0;
  return p;
}

void append_bf16_block(const uint16_t* src, int64_t cols, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                       std::vector<uint16_t>* out) {
  for (int64_t row = r0; row < r1; ++row) out->insert(out->end(), src + row * cols + c0, src + row * cols + c1);
}

}  // namespace mx
