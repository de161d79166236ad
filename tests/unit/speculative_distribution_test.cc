// Temperature > 0: speculative decoding samples the target distribution (issue 16's statistical check).
// 4000 seeded requests of 4 tokens (temperature 1, top-k 4: 256 possible continuations) run with a
// drafter that proposes the target's most likely next tokens (accepted about a quarter of the time, at both
// draft positions); the joint distribution of the 4 tokens is compared by a
// chi-square test with the target's exact one, the product of the model's top-4 softmaxes along each of the
// 64 three-token prefixes. The same test rejects a wrong target (one position sampled at temperature 0.5),
// so it has the power to see a sampling bug.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "engine_test_util.h"
#include "fixture_reference_util.h"
#include "spec/drafter.h"

namespace mx::test {
namespace {

constexpr int kTopK = 4;
constexpr int kTokens = 4;

// The top-4 token ids of a logits row (descending) and their softmax at `temperature`.
struct TopK {
  std::vector<int32_t> ids;
  std::vector<double> p;
};

TopK top_k(const float* logits, int64_t vocab, double temperature) {
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  for (int32_t i = 0; i < vocab; ++i) order[static_cast<size_t>(i)] = i;
  std::partial_sort(order.begin(), order.begin() + kTopK, order.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  TopK t;
  double sum = 0;
  for (int i = 0; i < kTopK; ++i) {
    t.ids.push_back(order[static_cast<size_t>(i)]);
    t.p.push_back(std::exp((logits[order[static_cast<size_t>(i)]] - logits[order[0]]) / temperature));
    sum += t.p.back();
  }
  for (double& p : t.p) p /= sum;
  return t;
}

// The next-token distribution after each generated prefix of 0..3 tokens (only prefixes the sampler can make).
using Table = std::map<std::vector<int32_t>, TopK>;

Table exact_table(const Model& model, const std::vector<int32_t>& prompt, double temperature) {
  const int64_t vocab = model.dims().vocab_size;
  Table table;
  // Breadth first: each level's prefixes extended by their top 4, then one batched prefill for the next.
  std::vector<std::vector<int32_t>> level = {{}};
  for (int depth = 0; depth < kTokens; ++depth) {
    std::vector<std::vector<int32_t>> seqs;
    for (const auto& g : level) {
      seqs.push_back(prompt);
      seqs.back().insert(seqs.back().end(), g.begin(), g.end());
    }
    auto logits = prefill_logits(model, seqs);
    MX_CHECK(logits.is_ok()) << logits.status().to_string();
    int64_t row = 0;
    std::vector<std::vector<int32_t>> next;
    for (size_t i = 0; i < level.size(); ++i) {
      row += static_cast<int64_t>(seqs[i].size());
      const TopK t = top_k(logits->data() + (row - 1) * vocab, vocab, temperature);
      table[level[i]] = t;
      for (int32_t id : t.ids) {
        next.push_back(level[i]);
        next.back().push_back(id);
      }
    }
    level = std::move(next);
  }
  return table;
}

// Proposes the target's most likely next tokens after the generated part of the sequence (from the table).
class MostLikelyDrafter final : public Drafter {
 public:
  MostLikelyDrafter(const Table& table, size_t prompt_len) : table_(table), prompt_len_(prompt_len) {}
  void propose(std::span<const int32_t> tokens, int64_t max_tokens, std::vector<int32_t>* out) const override {
    out->clear();
    std::vector<int32_t> g(tokens.begin() + static_cast<std::ptrdiff_t>(prompt_len_), tokens.end());
    for (int64_t i = 0; i < max_tokens; ++i) {
      const auto it = table_.find(g);
      if (it == table_.end()) return;
      out->push_back(it->second.ids[0]);
      g.push_back(it->second.ids[0]);
    }
  }

 private:
  const Table& table_;
  size_t prompt_len_;
};

// Probability of a 4-token continuation under `table` (0 if it leaves the top-4 sets).
double probability(const Table& table, const std::vector<int32_t>& seq) {
  double p = 1;
  std::vector<int32_t> g;
  for (int32_t id : seq) {
    const auto it = table.find(g);
    if (it == table.end()) return 0;
    const auto pos = std::find(it->second.ids.begin(), it->second.ids.end(), id);
    if (pos == it->second.ids.end()) return 0;
    p *= it->second.p[static_cast<size_t>(pos - it->second.ids.begin())];
    g.push_back(id);
  }
  return p;
}

struct ChiSquare {
  double statistic = 0;
  double critical = 0;  // at p = 0.001
  int64_t bins = 0;
  bool rejects() const { return statistic > critical; }
};

// Pearson's chi-square of observed counts against probabilities over the same bins; bins expected below 5
// counts are pooled into one. Critical value by the Wilson-Hilferty approximation.
ChiSquare chi_square(const std::vector<int64_t>& observed, const std::vector<double>& p, int64_t n) {
  ChiSquare c;
  double pooled_o = 0, pooled_e = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double e = p[i] * static_cast<double>(n);
    if (e < 5) {
      pooled_o += static_cast<double>(observed[i]);
      pooled_e += e;
      continue;
    }
    c.statistic += (static_cast<double>(observed[i]) - e) * (static_cast<double>(observed[i]) - e) / e;
    ++c.bins;
  }
  if (pooled_e > 0) {
    c.statistic += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
    ++c.bins;
  }
  const double df = static_cast<double>(c.bins - 1), z = 3.0902;  // the 0.999 quantile of N(0, 1)
  c.critical = df * std::pow(1 - 2 / (9 * df) + z * std::sqrt(2 / (9 * df)), 3);
  return c;
}

TEST(EngineSpeculative, SampledTokensFollowTheTargetDistribution) {
  const Fixture& fx = fixture_model("tiny-gpt-oss-b");
  const std::vector<int32_t>& prompt = fx.prompts[0];
  const Table table = exact_table(*fx.model, prompt, 1.0);
  EngineConfig c;
  c.page_size = 4;
  c.max_running_requests = 256;
  c.speculative.algorithm = SpeculativeAlgorithm::kExternal;
  c.speculative.num_draft_tokens = 2;  // 4 tokens: the first verify step carries 2 drafts
  c.speculative.external = std::make_shared<const MostLikelyDrafter>(table, prompt.size());
  const int64_t n = 4000;
  std::vector<Arrival> arrivals;
  for (int64_t i = 0; i < n; ++i) {
    RequestInput in = greedy_request(prompt, kTokens);
    in.ignore_eos = true;
    in.sampling.temperature = 1.0f;
    in.sampling.top_k = kTopK;
    in.sampling.seed = static_cast<uint64_t>(1000 + i);
    arrivals.push_back({0, in});
  }
  auto core = EngineCore::create(*fx.model, c);
  ASSERT_TRUE(core.is_ok()) << core.status().to_string();
  const DriveResult run = drive(**core, arrivals);
  ASSERT_EQ(run.error, "");
  const SchedulerStats& s = run.stats.scheduler;
  // Drafts at every position were accepted and rejected many times.
  for (size_t pos = 0; pos < 2; ++pos) EXPECT_GT(s.spec_accepted_per_pos[pos], 100) << pos;
  EXPECT_GT(s.spec_draft_tokens - s.spec_accepted_tokens, 1000);

  std::map<std::vector<int32_t>, int64_t> counts;
  for (const RequestOutput& o : run.outputs) {
    ASSERT_EQ(static_cast<int64_t>(o.token_ids.size()), kTokens);
    ASSERT_GT(probability(table, o.token_ids), 0.0) << "a token outside the top 4";
    ++counts[o.token_ids];
  }
  // Bins: every continuation the target can sample, with its exact probability.
  std::vector<std::vector<int32_t>> seqs = {{}};
  for (int depth = 0; depth < kTokens; ++depth) {
    std::vector<std::vector<int32_t>> next;
    for (const auto& g : seqs)
      for (int32_t id : table.at(g).ids) {
        next.push_back(g);
        next.back().push_back(id);
      }
    seqs = std::move(next);
  }
  ASSERT_EQ(seqs.size(), 256u);
  // A wrong target for the power check: the third token at temperature 0.5.
  Table wrong = table;
  for (auto& [g, t] : wrong) {
    if (g.size() != 2) continue;
    double sum = 0;
    for (double& p : t.p) sum += (p = p * p);  // p^(1/0.5), renormalized below
    for (double& p : t.p) p /= sum;
  }
  std::vector<int64_t> observed;
  std::vector<double> p_right, p_wrong;
  double total = 0;
  for (const auto& seq : seqs) {
    observed.push_back(counts.count(seq) ? counts.at(seq) : 0);
    p_right.push_back(probability(table, seq));
    p_wrong.push_back(probability(wrong, seq));
    total += p_right.back();
  }
  EXPECT_NEAR(total, 1.0, 1e-9);
  const ChiSquare right = chi_square(observed, p_right, n), bad = chi_square(observed, p_wrong, n);
  std::printf("[chi-square] target: %.1f (critical %.1f, %lld bins); temperature 0.5 at token 3: %.1f (critical %.1f); "
              "drafts %lld, accepted %lld\n",
              right.statistic, right.critical, static_cast<long long>(right.bins), bad.statistic, bad.critical,
              static_cast<long long>(s.spec_draft_tokens), static_cast<long long>(s.spec_accepted_tokens));
  EXPECT_FALSE(right.rejects()) << right.statistic << " > " << right.critical;
  EXPECT_TRUE(bad.rejects()) << bad.statistic << " <= " << bad.critical;
}

}  // namespace
}  // namespace mx::test
