#include "model/gpt_oss/gpt_oss_shard.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>

namespace mx {

Result<GptOssShardPlan> plan_gpt_oss_shard(const GptOssConfig& c, const ModelShard& shard, MoeSplit moe_split) {
  const int64_t n = shard.size, r = shard.rank;
  if (n < 1 || r < 0 || r >= n)
    return invalid_argument("tensor-parallel rank " + std::to_string(r) + " of " + std::to_string(n));
  // Query heads split evenly; KV heads too, or each is replicated on n / KV heads ranks (a GQA group then
  // never straddles two ranks).
  MX_RETURN_IF_ERROR(check_even_split("attention heads", c.num_heads, static_cast<int>(n)));
  if (n % c.num_kv_heads != 0) MX_RETURN_IF_ERROR(check_even_split("KV heads", c.num_kv_heads, static_cast<int>(n)));
  // Whole slices of the intermediate dimension, the first ranks one more where they do not divide evenly.
  const int64_t slices = c.intermediate_size / kExpertSliceChannels;
  const bool slices_split = c.intermediate_size % kExpertSliceChannels == 0 && slices >= n;
  GptOssShardPlan p;
  p.moe_split = moe_split;
  if (moe_split == MoeSplit::kAuto)
    p.moe_split = kGptOssDefaultMoeSplit == MoeSplit::kByIntermediate && !slices_split && c.num_experts % n == 0
                      ? MoeSplit::kByExpert
                      : kGptOssDefaultMoeSplit;
  p.heads = c.num_heads / n;
  p.first_head = r * p.heads;
  p.kv_heads = std::max<int64_t>(1, c.num_kv_heads / n);
  p.first_kv_head = c.num_kv_heads >= n ? r * p.kv_heads : r / (n / c.num_kv_heads);
  p.experts = c.num_experts;
  p.intermediate = c.intermediate_size;
  if (n > 1 && p.moe_split == MoeSplit::kByExpert) {
    MX_RETURN_IF_ERROR(check_even_split("experts", c.num_experts, static_cast<int>(n)));
    p.experts = c.num_experts / n;
    p.first_expert = r * p.experts;
  } else if (n > 1) {
    if (!slices_split)
      return invalid_argument("the experts' " + std::to_string(c.intermediate_size) + " intermediate channels do not split into " +
                              std::to_string(n) + " slices of whole " + std::to_string(kExpertSliceChannels) +
                              "-channel tiles (try --enable-expert-parallel)");
    const auto [s0, s1] = shard_range(slices, static_cast<int>(r), static_cast<int>(n));
    p.first_intermediate = s0 * kExpertSliceChannels;
    p.intermediate = (s1 - s0) * kExpertSliceChannels;
    p.adds_down_bias = r == 0;
  }
  const auto [v0, v1] = shard_range(c.vocab_size, static_cast<int>(r), static_cast<int>(n));
  p.first_vocab = v0;
  p.vocab = v1 - v0;
  p.adds_o_bias = r == 0;
  return p;
}

namespace {

// Rows [first, first + count) of the middle axis of each of `outer` stacked [n, ...] blocks of `t`, as a
// copy appended to `storage` and viewed with `shape`; big copies split among threads by outer block.
TensorView middle_rows(const TensorView& t, int64_t outer, int64_t n, int64_t first, int64_t count, Shape shape,
                       const SliceCopyThreads& threading, std::vector<std::vector<uint8_t>>* storage) {
  const int64_t row_bytes = t.bytes() / (outer * n), out_bytes = outer * count * row_bytes;
  std::vector<uint8_t>& out = storage->emplace_back(static_cast<size_t>(out_bytes));
  const auto* src = t.ptr<const uint8_t>();
  auto copy = [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o)
      std::memcpy(out.data() + o * count * row_bytes, src + (o * n + first) * row_bytes,
                  static_cast<size_t>(count * row_bytes));
  };
  const int64_t most = threading.max_threads > 0 ? threading.max_threads : std::thread::hardware_concurrency();
  const int64_t workers =
      std::clamp<int64_t>(std::min<int64_t>(most, out_bytes / std::max<int64_t>(1, threading.min_bytes_per_thread)), 1, outer);
  std::vector<std::thread> threads;
  for (int64_t w = 1; w < workers; ++w)
    threads.emplace_back([&, w] { copy(outer * w / workers, outer * (w + 1) / workers); });
  copy(0, outer / workers);
  for (std::thread& th : threads) th.join();
  return TensorView(out.data(), t.dtype(), shape);
}

}  // namespace

Result<ExpertWeights> slice_expert_intermediate(const ExpertWeights& whole, int64_t first, int64_t count, bool down_bias,
                                                std::vector<std::vector<uint8_t>>* storage,
                                                const SliceCopyThreads& threads) {
  const int64_t E = whole.num_experts, H = whole.hidden, I = whole.intermediate;
  if (whole.layout != ExpertLayout::kMxfp4Checkpoint)
    return internal_error("slice_expert_intermediate: checkpoint layout expected");
  if (first < 0 || count <= 0 || first + count > I || first % 32 != 0 || count % 32 != 0)
    return invalid_argument("expert channels [" + std::to_string(first) + ", " + std::to_string(first + count) +
                            ") are not whole MXFP4 blocks of the " + std::to_string(I));
  ExpertWeights s = whole;
  s.intermediate = count;
  s.w1_blocks = middle_rows(whole.w1_blocks, E, 2 * I, 2 * first, 2 * count, {E, 2 * count, H / 32, 16}, threads, storage);
  s.w1_scales = middle_rows(whole.w1_scales, E, 2 * I, 2 * first, 2 * count, {E, 2 * count, H / 32}, threads, storage);
  s.w1_bias = middle_rows(whole.w1_bias, E, 2 * I, 2 * first, 2 * count, {E, 2 * count}, threads, storage);
  // down_proj [E, H, I / 32 blocks, 16 bytes]: every output row keeps its blocks of the slice.
  s.w2_blocks = middle_rows(whole.w2_blocks, E * H, I / 32, first / 32, count / 32, {E, H, count / 32, 16}, threads, storage);
  s.w2_scales = middle_rows(whole.w2_scales, E * H, I / 32, first / 32, count / 32, {E, H, count / 32}, threads, storage);
  if (!down_bias) {
    std::vector<uint8_t>& zeros = storage->emplace_back(static_cast<size_t>(whole.w2_bias.bytes()), uint8_t{0});
    s.w2_bias = TensorView(zeros.data(), whole.w2_bias.dtype(), whole.w2_bias.shape());
  }
  return s;
}

}  // namespace mx
