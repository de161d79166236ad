// The CUDA sample op against its CPU twin: identical tokens on the same logits for every kind of row
// (ties, flat rows, huge, infinite and NaN logits, extreme temperatures, top-p near 0 and 1, top-k 1, V - 1,
// V and above, min-p), vocabularies that are and are not multiples of the kernels' chunk; then batch
// invariance, run-to-run determinism and graph replay.
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>

#include "gpu_test_util.h"

namespace mx::gpu_test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> make_logits(std::mt19937& rng, int kind, int64_t vocab) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(static_cast<size_t>(vocab));
  for (auto& f : x) f = normal(rng);
  auto pick = [&] { return static_cast<size_t>(rng() % static_cast<uint32_t>(vocab)); };
  switch (kind) {
    case 0:  // typical
      break;
    case 1:  // one dominant token, a few runners-up
      x[pick()] += 15.0f;
      for (int i = 0; i < 5; ++i) x[pick()] += 10.0f;
      break;
    case 2:  // few distinct values: cuts fall inside runs of equal logits
      for (auto& f : x) f = static_cast<float>(rng() % 4);
      break;
    case 3:  // flat
      for (auto& f : x) f = 0.25f;
      break;
    case 4: {  // huge and non-finite
      const float specials[] = {1e30f, -1e30f, FLT_MAX, -FLT_MAX, kInf, -kInf, std::nanf(""), 88.0f, -0.0f};
      for (int i = 0; i < 12; ++i) x[pick()] = specials[rng() % 9];
      break;
    }
    case 5:  // almost everything impossible
      for (auto& f : x) f = -kInf;
      for (int i = 0; i < 3; ++i) x[pick()] = normal(rng);
      break;
    default:  // nothing finite
      for (auto& f : x) f = rng() % 2 ? -kInf : std::nanf("");
  }
  return x;
}
constexpr int kLogitKinds = 7;

SampleRowParams make_params(std::mt19937& rng, int kind, int64_t vocab) {
  SampleRowParams p;
  p.seed = (static_cast<uint64_t>(rng()) << 32) | rng();
  p.step = rng() % 5000;
  p.temperature = 1.0f;
  const auto v = static_cast<int32_t>(vocab);
  switch (kind) {
    case 0: p.temperature = 0.0f; break;
    case 1: break;
    case 2: p.temperature = 0.7f; p.top_k = 50; p.top_p = 0.9f; break;
    case 3: p.top_p = 0.9f; break;
    case 4: p.top_p = 1e-6f; break;
    case 5: p.top_p = 0.9999f; break;
    case 6: p.top_k = 1; break;
    case 7: p.top_k = std::max(1, v - 1); break;
    case 8: p.top_k = v; break;
    case 9: p.top_k = v + 5; p.top_p = 0.5f; break;
    case 10: p.min_p = 0.05f; break;
    case 11: p.min_p = 1.0f; break;
    case 12: p.temperature = 1e-4f; p.top_p = 0.95f; break;
    case 13: p.temperature = 100.0f; p.top_k = 7; break;
    case 14: p.temperature = 1e4f; break;
    default: p.top_k = 1000; p.top_p = 0.5f; p.min_p = 0.01f; p.temperature = 1.3f;
  }
  return p;
}
constexpr int kParamKinds = 16;

struct Batch {
  int64_t rows = 0, vocab = 0;
  std::vector<float> logits;
  std::vector<SampleRowParams> params;
};

struct Output {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

// `mask` / `flags`: grammar masks (SampleParams::token_mask, mask_rows), or null.
Output run(Backend& b, Arena& arena, const Batch& x, const std::vector<int32_t>* mask = nullptr,
           const std::vector<int32_t>* flags = nullptr) {
  const int64_t row_bytes = static_cast<int64_t>(sizeof(SampleRowParams));
  SampleParams p{arena.upload(DType::kF32, {x.rows, x.vocab}, x.logits.data()),
                 arena.upload(DType::kU8, {x.rows, row_bytes}, x.params.data()), arena.make(DType::kI32, {x.rows}),
                 arena.make(DType::kF32, {x.rows}), TensorView(), TensorView()};  // the masks: below, if any
  if (mask) {
    p.token_mask = arena.upload(DType::kI32, {x.rows, (x.vocab + 31) / 32}, mask->data());
    p.mask_rows = arena.upload(DType::kI32, {x.rows}, flags->data());
  }
  const Status st = b.sample(p);
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  Output out;
  const auto tok = arena.download_bytes(p.tokens);
  out.tokens.resize(static_cast<size_t>(x.rows));
  std::memcpy(out.tokens.data(), tok.data(), tok.size());
  out.logprobs = arena.download_f32(p.logprobs);
  return out;
}

Batch make_batch(std::mt19937& rng, int64_t vocab) {
  Batch b;
  b.vocab = vocab;
  for (int l = 0; l < kLogitKinds; ++l)
    for (int k = 0; k < kParamKinds; ++k) {
      const auto x = make_logits(rng, l, vocab);
      b.logits.insert(b.logits.end(), x.begin(), x.end());
      b.params.push_back(make_params(rng, k, vocab));
      ++b.rows;
    }
  return b;
}

bool same_logprob(float a, float b) {
  if (std::isinf(a) || std::isinf(b)) return a == b;
  return std::fabs(a - b) <= 1e-4f * std::max(1.0f, std::fabs(b));
}

TEST(SampleOp, MatchesTheCpuTwin) {
  Arena cpu(cpu_backend()), cuda(cuda_backend());
  std::mt19937 rng(test_seed());
  for (int64_t vocab : {201088, 4096 * 3 + 1, 1000, 37, 1}) {
    const Batch b = make_batch(rng, vocab);
    const Output want = run(cpu_backend(), cpu, b), got = run(cuda_backend(), cuda, b);
    int token_diff = 0, lp_diff = 0;
    double lp_err = 0;
    for (int64_t r = 0; r < b.rows; ++r) {
      const bool tok_ok = got.tokens[r] == want.tokens[r], lp_ok = same_logprob(got.logprobs[r], want.logprobs[r]);
      token_diff += tok_ok ? 0 : 1;
      lp_diff += lp_ok ? 0 : 1;
      if (std::isfinite(want.logprobs[r]) && std::isfinite(got.logprobs[r]))
        lp_err = std::max(lp_err, static_cast<double>(std::fabs(got.logprobs[r] - want.logprobs[r])));
      EXPECT_TRUE(tok_ok && lp_ok) << "V " << vocab << " row " << r << " (logits kind " << r / kParamKinds
                                   << ", params kind " << r % kParamKinds << "): cuda " << got.tokens[r] << " / "
                                   << got.logprobs[r] << ", cpu " << want.tokens[r] << " / " << want.logprobs[r];
    }
    record("sample vs cpu twin",
           "V=" + std::to_string(vocab) + ", " + std::to_string(b.rows) + " rows: " + std::to_string(token_diff) +
               " tokens, " + std::to_string(lp_diff) + " logprobs differ",
           token_diff, lp_err, 0, token_diff == 0 && lp_diff == 0);
  }
}

// Grammar masks: rows without a mask, with a few allowed tokens, with one, with every token; the tokens
// and logprobs equal the CPU twin's and every token is allowed.
TEST(SampleOp, TokenMasksMatchTheCpuTwin) {
  Arena cpu(cpu_backend()), cuda(cuda_backend());
  std::mt19937 rng(test_seed() + 17);
  for (int64_t vocab : {201088, 1000, 37}) {
    const Batch b = make_batch(rng, vocab);
    const int64_t words = (vocab + 31) / 32;
    std::vector<int32_t> mask(static_cast<size_t>(b.rows * words), 0), flags(static_cast<size_t>(b.rows), 0);
    for (int64_t r = 0; r < b.rows; ++r) {
      const int kind = static_cast<int>(r % 4);  // 0: unmasked, 1: few allowed, 2: one allowed, 3: all allowed
      flags[r] = kind != 0;
      auto* row = reinterpret_cast<uint32_t*>(mask.data() + r * words);
      if (kind == 3) {
        for (int64_t w = 0; w < words; ++w) row[w] = 0xffffffffu;
      }
      const int allowed = kind == 1 ? 1 + static_cast<int>(rng() % 40) : 1;
      for (int i = 0; i < allowed && kind != 3; ++i) {
        const int64_t id = rng() % static_cast<uint32_t>(vocab);
        row[id >> 5] |= 1u << (id & 31);
      }
    }
    const Output want = run(cpu_backend(), cpu, b, &mask, &flags), got = run(cuda_backend(), cuda, b, &mask, &flags);
    int diff = 0, disallowed = 0;
    for (int64_t r = 0; r < b.rows; ++r) {
      const bool ok = got.tokens[r] == want.tokens[r] && same_logprob(got.logprobs[r], want.logprobs[r]);
      diff += ok ? 0 : 1;
      const auto* row = reinterpret_cast<const uint32_t*>(mask.data() + r * words);
      const int32_t t = got.tokens[r];
      // A row with no finite allowed logit falls back to the first index (greedy of all -inf), as on the CPU.
      const bool finite_allowed = [&] {
        for (int64_t i = 0; i < vocab; ++i)
          if (((row[i >> 5] >> (i & 31)) & 1u) && std::isfinite(b.logits[r * vocab + i])) return true;
        return false;
      }();
      if (flags[r] && finite_allowed && !((row[t >> 5] >> (t & 31)) & 1u)) ++disallowed;
      EXPECT_TRUE(ok) << "V " << vocab << " row " << r << ": cuda " << got.tokens[r] << " / " << got.logprobs[r]
                      << ", cpu " << want.tokens[r] << " / " << want.logprobs[r];
    }
    EXPECT_EQ(disallowed, 0);
    record("masked sample vs cpu twin",
           "V=" + std::to_string(vocab) + ", " + std::to_string(b.rows) + " rows: " + std::to_string(diff) +
               " differ, " + std::to_string(disallowed) + " disallowed tokens",
           diff + disallowed, 0, 0, diff == 0 && disallowed == 0);
  }
}

TEST(SampleOp, BatchInvariantDeterministicAndReplayable) {
  Arena cuda(cuda_backend());
  std::mt19937 rng(test_seed() + 1);
  const Batch b = make_batch(rng, 201088);
  const Output full = run(cuda_backend(), cuda, b), again = run(cuda_backend(), cuda, b);
  const bool repeat = full.tokens == again.tokens &&
                      std::memcmp(full.logprobs.data(), again.logprobs.data(), full.logprobs.size() * 4) == 0;
  record("sample determinism", "112 rows x V=201088, twice: bitwise equal", repeat ? 0 : 1, 0, 0, repeat);
  EXPECT_TRUE(repeat);
  // Each row alone gives what it gave inside the batch, bit for bit.
  int differ = 0;
  for (int64_t r = 0; r < b.rows; r += 9) {
    Batch one;
    one.rows = 1;
    one.vocab = b.vocab;
    one.logits.assign(b.logits.begin() + r * b.vocab, b.logits.begin() + (r + 1) * b.vocab);
    one.params = {b.params[static_cast<size_t>(r)]};
    const Output o = run(cuda_backend(), cuda, one);
    differ += o.tokens[0] == full.tokens[r] && std::memcmp(&o.logprobs[0], &full.logprobs[r], 4) == 0 ? 0 : 1;
  }
  record("sample batch invariance", "13 rows alone vs in a batch of 112", differ, 0, 0, differ == 0);
  EXPECT_EQ(differ, 0);
  // Graph capture and replay (the scratch is already sized by the eager calls above).
  const int64_t row_bytes = static_cast<int64_t>(sizeof(SampleRowParams));
  SampleParams p{cuda.upload(DType::kF32, {b.rows, b.vocab}, b.logits.data()),
                 cuda.upload(DType::kU8, {b.rows, row_bytes}, b.params.data()), cuda.make(DType::kI32, {b.rows}),
                 cuda.make(DType::kF32, {b.rows}), TensorView(), TensorView()};  // no grammar masks
  auto graph = cuda_backend().capture([&] { return cuda_backend().sample(p); });
  ASSERT_TRUE(graph.is_ok()) << graph.status().to_string();
  ASSERT_TRUE((*graph)->replay().is_ok());
  const auto tok = cuda.download_bytes(p.tokens);
  const bool replay_same = std::memcmp(tok.data(), full.tokens.data(), tok.size()) == 0;
  record("sample graph replay", "112 rows x V=201088: same tokens as eager", replay_same ? 0 : 1, 0, 0, replay_same);
  EXPECT_TRUE(replay_same);
}

}  // namespace
}  // namespace mx::gpu_test
