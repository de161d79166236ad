// Compiled with -ffp-contract=off (src/backend/CMakeLists.txt): sampling_math.h's arithmetic must round
// exactly as the CUDA kernels' explicitly rounded operations do.
#include "backend/cpu/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cpu/ops.h"

namespace mx::cpu {
namespace {

using namespace mx::sampling;

uint32_t key_at(const float* x, int64_t i) { return order_key(sanitize(x[i])); }

// Rank order: higher logit first, then lower id.
struct RanksBefore {
  const float* x;
  bool operator()(int32_t a, int32_t b) const {
    const uint32_t ka = key_at(x, a), kb = key_at(x, b);
    return ka > kb || (ka == kb && a < b);
  }
};

// Both cuts first take one radix pass: the candidates' counts or masses summed per bucket of the order key's top
// 16 bits (a bucket's tokens all rank before a lower bucket's), walked from the top bucket down to the one the cut
// falls in; only that bucket's tokens are then ranked (selected for top-k, sorted for top-p's prefix sums). Sorting
// every candidate took ~30-60 ms a row of gpt-oss's 201,088 logits (top-p alone) on one core. Top-p sorts a few
// candidates (top-k's) directly.
constexpr int kBucketShift = 16;
constexpr size_t kBuckets = size_t{1} << (32 - kBucketShift);
constexpr size_t kSortDirectly = 4096;
uint32_t bucket_of(uint32_t key) { return key >> kBucketShift; }

Cut top_k_cut(const float* x, int64_t vocab, int32_t k, SampleScratch* s) {
  s->counts.assign(kBuckets, 0);
  for (int64_t i = 0; i < vocab; ++i) ++s->counts[bucket_of(key_at(x, i))];
  size_t bucket = kBuckets;
  int64_t above = 0;  // tokens in higher buckets
  while (above + s->counts[--bucket] < k) above += s->counts[bucket];
  s->ids.clear();
  for (int64_t i = 0; i < vocab; ++i)
    if (bucket_of(key_at(x, i)) == bucket) s->ids.push_back(static_cast<int32_t>(i));
  const auto nth = s->ids.begin() + (k - 1 - above);
  std::nth_element(s->ids.begin(), nth, s->ids.end(), RanksBefore{x});
  s->ranked += static_cast<int64_t>(s->ids.size());
  return {key_at(x, *nth), *nth};
}

// The shortest rank-order prefix of the top-k set whose integer mass reaches the target. Zero-mass tokens
// cannot complete a prefix, so only tokens with mass are candidates.
Cut top_p_cut(const float* x, int64_t vocab, float m, float inv_t, float top_p, const Cut& k_cut, SampleScratch* s) {
  s->ids.clear();
  s->mass.resize(static_cast<size_t>(vocab));
  uint64_t total = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    const float v = sanitize(x[i]);
    if (!within(order_key(v), static_cast<int32_t>(i), k_cut)) continue;
    const uint64_t w = mass_of(exp_nonpositive(scaled(v, m, inv_t)));
    if (w == 0) continue;
    s->mass[static_cast<size_t>(i)] = w;
    total += w;
    s->ids.push_back(static_cast<int32_t>(i));
  }
  const uint64_t target = top_p_target(total, top_p);
  uint64_t acc = 0;  // mass ranked before the sorted candidates
  if (s->ids.size() > kSortDirectly) {
    s->bucket_mass.assign(kBuckets, 0);
    for (int32_t id : s->ids) s->bucket_mass[bucket_of(key_at(x, id))] += s->mass[static_cast<size_t>(id)];
    size_t bucket = kBuckets;
    while (acc + s->bucket_mass[--bucket] < target) acc += s->bucket_mass[bucket];
    std::erase_if(s->ids, [&](int32_t id) { return bucket_of(key_at(x, id)) != bucket; });
  }
  std::sort(s->ids.begin(), s->ids.end(), RanksBefore{x});
  s->ranked += static_cast<int64_t>(s->ids.size());
  for (int32_t id : s->ids) {
    acc += s->mass[static_cast<size_t>(id)];
    if (acc >= target) return {key_at(x, id), id};
  }
  return {};  // unreachable: target <= total
}

}  // namespace

void apply_token_mask(float* logits, int64_t vocab, const uint32_t* mask_row) {
  for (int64_t i = 0; i < vocab; ++i) {
    if (!token_allowed(mask_row, i)) logits[i] = -std::numeric_limits<float>::infinity();
  }
}

const std::array<float, 256>& gumbel_bounds() {
  // gumbel_key grows with the word, so each range's largest word gives its bound (sampling_op_test checks
  // every word).
  static const std::array<float, 256> bounds = [] {
    std::array<float, 256> b{};
    for (uint32_t r = 0; r < 256; ++r) b[r] = gumbel_key(0.0f, (r << 24) | 0xffffffu);
    return b;
  }();
  return bounds;
}

SampledRow sample_row(const float* x, int64_t vocab, const SampleRowParams& p, SampleScratch* scratch,
                      bool with_logprob) {
  float m = -std::numeric_limits<float>::infinity();
  int32_t argmax = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    const float v = sanitize(x[i]);
    if (v > m) {
      m = v;
      argmax = static_cast<int32_t>(i);
    }
  }
  SampledRow out;
  out.token = argmax;
  scratch->ranked = 0;
  const float inv_t = inverse_temperature(p.temperature);
  if (inv_t > 0.0f && m > -std::numeric_limits<float>::infinity()) {
    Cut k_cut, p_cut;
    if (has_top_k(p.top_k, vocab)) k_cut = top_k_cut(x, vocab, p.top_k, scratch);
    if (has_top_p(p.top_p)) p_cut = top_p_cut(x, vocab, m, inv_t, p.top_p, k_cut, scratch);
    const float min_e = min_p_threshold(p.min_p);
    float best = -std::numeric_limits<float>::infinity();
    int32_t best_id = std::numeric_limits<int32_t>::max();
    const std::array<float, 256>& bounds = gumbel_bounds();
    Philox4 words{};
    int64_t group = -1;
    for (int64_t i = 0; i < vocab; ++i) {
      const float v = sanitize(x[i]);
      const uint32_t key = order_key(v);
      const auto id = static_cast<int32_t>(i);
      if (!within(key, id, k_cut) || !within(key, id, p_cut)) continue;
      const float s = scaled(v, m, inv_t);
      if (!can_win(s, best)) continue;
      if (min_e > 0.0f && exp_nonpositive(s) < min_e) continue;
      if (i / 4 != group) {
        group = i / 4;
        words = token_words(p.seed, p.step, static_cast<uint64_t>(group));
      }
      const uint32_t word = words.w[i % 4];
      if (add_rn(s, bounds[word >> 24]) < best) continue;  // most tokens end here, without the two logs
      const float g = gumbel_key(s, word);
      if (g > best || (g == best && id < best_id)) {
        best = g;
        best_id = id;
      }
    }
    if (best_id != std::numeric_limits<int32_t>::max()) out.token = best_id;  // always: the argmax is kept
  }
  if (!with_logprob) return out;
  if (m == -std::numeric_limits<float>::infinity()) {
    out.logprob = -std::numeric_limits<float>::infinity();
  } else {
    double sum = 0;
    for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(sanitize(x[i])) - m);
    out.logprob = static_cast<float>(static_cast<double>(sanitize(x[out.token])) - m - std::log(sum));
  }
  return out;
}

void sample(ThreadPool& pool, const SampleParams& p) {
  const int64_t rows = p.logits.dim(0), vocab = p.logits.dim(1);
  MX_CHECK_EQ(p.params.bytes(), rows * static_cast<int64_t>(sizeof(SampleRowParams)));
  MX_CHECK_EQ(p.tokens.numel(), rows);
  float* logits = p.logits.ptr<float>();
  const auto* params = p.params.ptr<const SampleRowParams>();
  MX_CHECK_EQ(p.token_mask.empty(), p.mask_rows.empty());
  if (!p.token_mask.empty()) {
    MX_CHECK_EQ(p.token_mask.numel(), rows * mask_words(vocab));
    MX_CHECK_EQ(p.mask_rows.numel(), rows);
  }
  pool.parallel_for(rows, 1, [&](int64_t begin, int64_t end) {
    SampleScratch scratch;
    for (int64_t r = begin; r < end; ++r) {
      if (!p.token_mask.empty() && p.mask_rows.ptr<const int32_t>()[r] != 0) {
        apply_token_mask(logits + r * vocab, vocab,
                         reinterpret_cast<const uint32_t*>(p.token_mask.ptr<const int32_t>()) + r * mask_words(vocab));
      }
      const SampledRow s = sample_row(logits + r * vocab, vocab, params[r], &scratch, !p.logprobs.empty());
      p.tokens.ptr<int32_t>()[r] = s.token;
      if (!p.logprobs.empty()) p.logprobs.ptr<float>()[r] = s.logprob;
    }
  });
}

}  // namespace mx::cpu
