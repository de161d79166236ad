// The sample op's algorithm on the CPU (backend/sampling_math.h, cpu/sampling.cc): Philox known answers,
// exp/log accuracy, greedy and tie rules, draw frequencies, and every filter against a plain restatement
// of its definition. The CUDA kernels are tested against this twin in tests/gpu/sampling_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/sampling.h"

namespace mx {
namespace {

using namespace mx::sampling;
constexpr float kInf = std::numeric_limits<float>::infinity();

SampleRowParams temp(float t, uint64_t seed = 1) {
  SampleRowParams p;
  p.temperature = t;
  p.seed = seed;
  return p;
}

int32_t draw(const std::vector<float>& logits, SampleRowParams p, uint64_t step) {
  cpu::SampleScratch scratch;
  p.step = step;
  return cpu::sample_row(logits.data(), static_cast<int64_t>(logits.size()), p, &scratch).token;
}

std::map<int32_t, int> histogram(const std::vector<float>& logits, const SampleRowParams& p, int n) {
  std::map<int32_t, int> seen;
  for (int i = 0; i < n; ++i) ++seen[draw(logits, p, static_cast<uint64_t>(i))];
  return seen;
}

std::set<int32_t> support(const std::vector<float>& logits, const SampleRowParams& p, int n = 3000) {
  std::set<int32_t> s;
  for (auto [t, c] : histogram(logits, p, n)) s.insert(t);
  return s;
}

TEST(SamplingOp, PhiloxKnownAnswers) {  // Random123's kat_vectors for philox4x32_10
  auto check = [](Philox4 got, std::array<uint32_t, 4> want) {
    for (int i = 0; i < 4; ++i) EXPECT_EQ(got.w[i], want[i]) << "word " << i;
  };
  check(philox4x32_10(0, 0, 0, 0, 0, 0), {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
  check(philox4x32_10(~0u, ~0u, ~0u, ~0u, ~0u, ~0u), {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
  check(philox4x32_10(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u),
        {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
}

TEST(SamplingOp, ExpAndLogAreAccurate) {
  EXPECT_EQ(exp_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(exp_nonpositive(-kInf), 0.0f);
  EXPECT_EQ(exp_nonpositive(std::nanf("")), 0.0f);
  EXPECT_EQ(exp_nonpositive(-81.0f), 0.0f);
  double worst = 0;
  for (float x = -80.0f; x <= 0.0f; x += 0.01337f)
    worst = std::max(worst, std::fabs(exp_nonpositive(x) - std::exp(static_cast<double>(x))) / std::exp(static_cast<double>(x)));
  EXPECT_LT(worst, 1e-6);
  worst = 0;
  for (float x = 5.96e-8f; x < 30.0f; x *= 1.0137f)
    worst = std::max(worst, std::fabs(log_positive(x) - std::log(static_cast<double>(x))) /
                                std::max(1.0, std::fabs(std::log(static_cast<double>(x)))));
  EXPECT_LT(worst, 1e-6);
}

TEST(SamplingOp, GumbelBoundsHoldForEveryWord) {  // the CPU draw's shortcut is exact
  const auto& bounds = cpu::gumbel_bounds();
  for (uint32_t j = 0; j < (1u << 23); ++j) {
    const uint32_t word = j << 9;
    ASSERT_LE(gumbel_key(0.0f, word), bounds[word >> 24]) << "word " << word;
  }
}

TEST(SamplingOp, OrderKeysFollowTheFloatOrder) {
  const std::vector<float> v = {-kInf, -FLT_MAX, -1.5f, -1e-30f, 0.0f, 1e-30f, 2.0f, FLT_MAX};
  for (size_t i = 0; i + 1 < v.size(); ++i) EXPECT_LT(order_key(v[i]), order_key(v[i + 1])) << v[i];
  for (float f : v) EXPECT_EQ(key_float(order_key(f)), f);
  EXPECT_EQ(order_key(sanitize(-0.0f)), order_key(0.0f));
  EXPECT_EQ(sanitize(std::nanf("")), -kInf);
  EXPECT_EQ(sanitize(kInf), FLT_MAX);
}

TEST(SamplingOp, GreedyTakesTheFirstMaximumAndIgnoresNaN) {
  const float nan = std::nanf("");
  EXPECT_EQ(draw({nan, 1.0f, 3.0f, 3.0f, -kInf}, SampleRowParams{}, 0), 2);
  EXPECT_EQ(draw({1.0f, kInf, kInf}, SampleRowParams{}, 0), 1);
  cpu::SampleScratch scratch;
  const std::vector<float> dead = {-kInf, nan, -kInf};
  for (const SampleRowParams& p : {SampleRowParams{}, temp(1.0f)}) {
    const auto r = cpu::sample_row(dead.data(), 3, p, &scratch);
    EXPECT_EQ(r.token, 0);
    EXPECT_EQ(r.logprob, -kInf);
  }
  const std::vector<float> x = {std::log(0.2f), std::log(0.5f), std::log(0.3f)};
  EXPECT_NEAR(cpu::sample_row(x.data(), 3, SampleRowParams{}, &scratch).logprob, std::log(0.5), 1e-6);
}

TEST(SamplingOp, DrawsFollowTheSoftmaxAtTheTemperature) {
  const std::vector<float> x = {0.0f, 1.0f, 2.0f, 0.5f};
  for (float t : {0.7f, 1.0f, 2.5f}) {
    double z = 0;
    for (float v : x) z += std::exp(v / t);
    const int n = 40000;
    const auto h = histogram(x, temp(t, 77), n);
    for (int i = 0; i < 4; ++i) {
      const double want = std::exp(x[static_cast<size_t>(i)] / t) / z;
      const double got = h.count(i) ? static_cast<double>(h.at(i)) / n : 0.0;
      EXPECT_NEAR(got, want, 4 * std::sqrt(want * (1 - want) / n) + 1e-3) << "T " << t << " token " << i;
    }
  }
}

TEST(SamplingOp, SeedAndStepAloneDecide) {
  const std::vector<float> x(50, 0.0f);
  std::vector<int32_t> a, b, c;
  for (uint64_t s = 0; s < 40; ++s) {
    a.push_back(draw(x, temp(1.0f, 9), s));
    b.push_back(draw(x, temp(1.0f, 9), s));
    c.push_back(draw(x, temp(1.0f, 10), s));
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_GT(std::set<int32_t>(a.begin(), a.end()).size(), 20u);  // steps move the stream
}

// The kept set by its definition: rank order, top-k prefix, min-p, shortest top-p prefix by integer mass.
std::set<int32_t> kept_by_definition(const std::vector<float>& x, const SampleRowParams& p) {
  const auto v = static_cast<int64_t>(x.size());
  std::vector<int32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return sanitize(x[a]) > sanitize(x[b]); });
  const float m = sanitize(x[order[0]]), inv_t = inverse_temperature(p.temperature);
  const size_t k = has_top_k(p.top_k, v) ? static_cast<size_t>(p.top_k) : x.size();
  std::vector<int32_t> top(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k));
  auto mass = [&](int32_t i) { return mass_of(exp_nonpositive(scaled(sanitize(x[i]), m, inv_t))); };
  size_t n = top.size();
  if (has_top_p(p.top_p)) {
    uint64_t total = 0, acc = 0;
    for (int32_t i : top) total += mass(i);
    const uint64_t target = top_p_target(total, p.top_p);
    for (n = 0; acc < target;) acc += mass(top[n++]);
  }
  std::set<int32_t> kept;
  for (size_t j = 0; j < n; ++j)
    if (exp_nonpositive(scaled(sanitize(x[top[j]]), m, inv_t)) >= min_p_threshold(p.min_p)) kept.insert(top[j]);
  return kept;
}

TEST(SamplingOp, FiltersKeepExactlyTheirDefinition) {
  std::mt19937 rng(2024);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  for (int c = 0; c < 60; ++c) {
    const int v = 3 + static_cast<int>(rng() % 8);
    std::vector<float> x(static_cast<size_t>(v));
    for (auto& f : x) f = c % 3 == 0 ? static_cast<float>(rng() % 3) : normal(rng);  // every third row: ties
    SampleRowParams p = temp(c % 4 == 0 ? 3.0f : 1.0f, static_cast<uint64_t>(c));
    p.top_k = static_cast<int32_t>(rng() % (v + 2));
    p.top_p = rng() % 3 == 0 ? 1.0f : 0.2f + 0.7f * static_cast<float>(rng() % 100) / 100.0f;
    p.min_p = rng() % 3 == 0 ? 0.15f : 0.0f;
    // Logits span ~2.5 nats: every kept token has probability above 1/100, so 4000 draws show them all.
    EXPECT_EQ(support(x, p, 4000), kept_by_definition(x, p))
        << "case " << c << " top_k " << p.top_k << " top_p " << p.top_p << " min_p " << p.min_p;
  }
}

// The draw by its definition: the Gumbel argmax over the kept set (ties to the lower id).
int32_t draw_by_definition(const std::vector<float>& x, const SampleRowParams& p) {
  float m = -kInf;
  for (float f : x) m = std::max(m, sanitize(f));
  const float inv_t = inverse_temperature(p.temperature);
  float best = -kInf;
  int32_t best_id = -1;
  for (int32_t id : kept_by_definition(x, p)) {  // ascending ids
    const uint32_t word = token_words(p.seed, p.step, static_cast<uint64_t>(id / 4)).w[id % 4];
    const float g = gumbel_key(scaled(sanitize(x[static_cast<size_t>(id)]), m, inv_t), word);
    if (best_id < 0 || g > best) best = g, best_id = id;
  }
  return best_id;
}

// gpt-oss's 201,088 logits (normal; with ties; a third at -inf, as a grammar mask leaves them): every draw under
// top-k, top-p and both is the definition's, and the cuts rank only the tokens of the one order-key bucket they fall
// in (a few hundred), where sorting every candidate cost ~40 ms a row (top-p alone: 201,088 ranked).
TEST(SamplingOp, CutsOnALargeVocabularyRankOneBucket) {
  constexpr int64_t kVocab = 201088;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::vector<float>> rows(3, std::vector<float>(kVocab));
  for (auto& row : rows)
    for (float& f : row) f = normal(rng);
  for (int64_t i = 0; i + 1 < kVocab; i += 7) rows[1][static_cast<size_t>(i)] = rows[1][static_cast<size_t>(i + 1)];
  for (int64_t i = 0; i < kVocab; i += 3) rows[2][static_cast<size_t>(i)] = -kInf;
  cpu::SampleScratch scratch;
  for (size_t r = 0; r < rows.size(); ++r) {
    for (const auto& [top_k, top_p] : {std::pair{40, 1.0f}, std::pair{0, 0.9f}, std::pair{0, 0.3f}, std::pair{40, 0.9f},
                                       std::pair{5000, 0.95f}}) {
      SampleRowParams p = temp(0.9f, 11 + r);
      p.top_k = top_k;
      p.top_p = top_p;
      p.step = r + static_cast<uint64_t>(top_k);
      const int32_t got = cpu::sample_row(rows[r].data(), kVocab, p, &scratch, false).token;
      EXPECT_EQ(got, draw_by_definition(rows[r], p)) << "row " << r << " top_k " << top_k << " top_p " << top_p;
      EXPECT_GT(scratch.ranked, 0);
      EXPECT_LT(scratch.ranked, 2000) << "row " << r << " top_k " << top_k << " top_p " << top_p;
    }
  }
}

TEST(SamplingOp, CutsThroughTiesKeepTheLowerIds) {
  const std::vector<float> flat(10, 1.0f);
  SampleRowParams p = temp(1.0f);
  p.top_k = 3;
  EXPECT_EQ(support(flat, p), (std::set<int32_t>{0, 1, 2}));
  p.top_k = 0;
  p.top_p = 0.35f;  // each token is a tenth of the mass: four reach 0.35
  EXPECT_EQ(support(flat, p), (std::set<int32_t>{0, 1, 2, 3}));
  p.top_p = 1e-6f;
  EXPECT_EQ(support(flat, p), (std::set<int32_t>{0}));
  const std::vector<float> x = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  p = temp(1.0f);
  p.min_p = 0.2f;  // keeps p >= 0.1
  EXPECT_EQ(support(x, p), (std::set<int32_t>{0, 1, 2}));
  p.min_p = 5.0f;  // acts as 1: only the most likely
  EXPECT_EQ(support(x, p), (std::set<int32_t>{0}));
  p = temp(1.0f);
  p.top_p = 0.75f;  // 0.5 + 0.3 reaches it
  EXPECT_EQ(support(x, p), (std::set<int32_t>{0, 1}));
  p.top_k = 1;
  EXPECT_EQ(support(x, p), (std::set<int32_t>{0}));
}

TEST(SamplingOp, ExtremeTemperaturesAndLogits) {
  EXPECT_EQ(support({1.0f, 2.0f, 2.0f, 1.999f}, temp(1e-6f)), (std::set<int32_t>{1, 2}));
  EXPECT_EQ(support({1.0f, 2.0f, 5.0f}, temp(1e6f), 600).size(), 3u);  // near uniform
  EXPECT_EQ(support({FLT_MAX, -FLT_MAX, kInf, 1e30f, -kInf}, temp(1.0f)), (std::set<int32_t>{0, 2}));
  EXPECT_EQ(support({-kInf, 3.0f, std::nanf(""), -kInf}, temp(1.0f)), (std::set<int32_t>{1}));
}

TEST(SamplingOp, BackendOpMatchesTheRowFunction) {
  auto backend = make_cpu_backend({2});
  const int64_t rows = 6, vocab = 1003;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(rows * vocab));
  for (auto& f : logits) f = normal(rng);
  std::vector<SampleRowParams> params(rows);
  for (int64_t r = 0; r < rows; ++r) {
    params[r] = temp(r == 0 ? 0.0f : 0.5f + 0.3f * static_cast<float>(r), static_cast<uint64_t>(r));
    params[r].top_k = r == 2 ? 40 : 0;
    params[r].top_p = r == 3 ? 0.9f : 1.0f;
    params[r].step = static_cast<uint64_t>(7 * r);
  }
  std::vector<int32_t> tokens(rows, -1);
  std::vector<float> logprobs(rows, 0.0f);
  SampleParams sp{TensorView(logits.data(), DType::kF32, {rows, vocab}),
                  TensorView(params.data(), DType::kU8, {rows, static_cast<int64_t>(sizeof(SampleRowParams))}),
                  TensorView(tokens.data(), DType::kI32, {rows}), TensorView(logprobs.data(), DType::kF32, {rows}),
                  TensorView(), TensorView()};  // no grammar masks
  ASSERT_TRUE(backend->sample(sp).is_ok());
  cpu::SampleScratch scratch;
  for (int64_t r = 0; r < rows; ++r) {
    const auto want = cpu::sample_row(logits.data() + r * vocab, vocab, params[r], &scratch);
    EXPECT_EQ(tokens[r], want.token) << "row " << r;
    EXPECT_EQ(logprobs[r], want.logprob) << "row " << r;
  }
}

// Grammar masks: a masked row samples exactly as the row with its disallowed logits at -inf; an unflagged
// row ignores its mask words.
TEST(SamplingOp, TokenMaskIsMinusInfinityForDisallowedTokens) {
  auto backend = make_cpu_backend({2});
  const int64_t rows = 4, vocab = 1003, words = (vocab + 31) / 32;
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(rows * vocab));
  for (auto& f : logits) f = normal(rng);
  const std::vector<float> raw = logits;
  std::vector<SampleRowParams> params(rows);
  for (int64_t r = 0; r < rows; ++r) params[r] = temp(r == 0 ? 0.0f : 1.0f, static_cast<uint64_t>(r));
  std::vector<int32_t> mask(static_cast<size_t>(rows * words), 0), flags{1, 1, 0, 1};
  for (int64_t r = 0; r < rows; ++r) {
    for (int i = 0; i < 5; ++i) {
      const int64_t id = rng() % vocab;
      mask[r * words + id / 32] |= static_cast<int32_t>(1u << (id % 32));
    }
  }
  std::vector<int32_t> tokens(rows, -1);
  std::vector<float> logprobs(rows, 0.0f);
  SampleParams sp{TensorView(logits.data(), DType::kF32, {rows, vocab}),
                  TensorView(params.data(), DType::kU8, {rows, static_cast<int64_t>(sizeof(SampleRowParams))}),
                  TensorView(tokens.data(), DType::kI32, {rows}), TensorView(logprobs.data(), DType::kF32, {rows}),
                  TensorView(mask.data(), DType::kI32, {rows, words}), TensorView(flags.data(), DType::kI32, {rows})};
  ASSERT_TRUE(backend->sample(sp).is_ok());
  cpu::SampleScratch scratch;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> want_row(raw.begin() + r * vocab, raw.begin() + (r + 1) * vocab);
    const auto* bits = reinterpret_cast<const uint32_t*>(mask.data() + r * words);
    if (flags[r]) {
      for (int64_t i = 0; i < vocab; ++i)
        if (!sampling::token_allowed(bits, i)) want_row[i] = -kInf;
      EXPECT_TRUE(sampling::token_allowed(bits, tokens[r])) << "row " << r;
    }
    const auto want = cpu::sample_row(want_row.data(), vocab, params[r], &scratch);
    EXPECT_EQ(tokens[r], want.token) << "row " << r;
    EXPECT_EQ(logprobs[r], want.logprob) << "row " << r;
  }
}

}  // namespace
}  // namespace mx
