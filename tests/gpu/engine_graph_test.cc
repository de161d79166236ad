// The engine on CUDA with the tiny fixtures: (1) decode steps replayed from the runner's CUDA graphs give
// the same tokens and logprobs, bit for bit, as the same padded steps run eagerly; (2) batching
// equivalence: all prompts together (small chunks, staggered arrivals) give each prompt's tokens alone,
// except at a near tie, reported with the margin and attributed (chunk shapes vs co-batched sequences):
// the kernels are batch-variant (cuBLASLt algorithm per M, MoE k-split per slot count, decode attention
// splits per batch size, prefill vs decode attention kernels), so bf16 logits move by ~1e-3 with the
// batch; (3) the KV pool planned from --mem-fraction; (4) speculative decoding (verify steps of k + 1 rows
// through the prefill kernels) gives plain decoding's greedy tokens, except at a near tie, with the n-gram
// drafter, the draft models (MTP, EAGLE-3) and with forced acceptance (the drafts are the plain run's outputs: accepted up to a near tie);
// (5) grammar masks (TokenConstraint) with graphs: masked decode steps replay the same graphs and give what
// eager steps give, and no token outside a mask; (6) tensor parallel at TP 2 (two GPUs): graphs that hold
// both ranks' work, NCCL collectives inside, replay what eager steps give.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>

#include "fixture_reference_util.h"
#include "model/model_registry.h"
#include "model/synthetic_model.h"
#include "model/tensor_parallel_model.h"
#include "gpu_test_util.h"
#include "route_trace_util.h"
#include "tensor_parallel_util.h"
#include "runtime/engine_core.h"
#include "spec/reference_drafter.h"
#include "runtime/token_constraint.h"
#include "striped_constraint_util.h"

namespace mx::gpu_test {
namespace {

struct Loaded {
  std::unique_ptr<Model> model;
  std::vector<std::vector<int32_t>> prompts, greedy;
};

// The fixture's model on `backend` (CUDA unless given), split over `tp` ranks on devices 0..tp-1 when tp > 1.
Loaded load_fixture(const std::string& name, Backend& backend = cuda_backend(), int tp = 1,
                    const ModelLoadOptions& options = {}) {
  const char* env = std::getenv("MX_FIXTURES_DIR");
  const std::string dir = std::string(env ? env : MX_FIXTURES_DIR) + "/" + name;
  Loaded f;
  auto model = tp == 1 ? load_model(dir, backend) : load_tensor_parallel_model(dir, backend, BackendOptions{"cuda", 0, 0}, tp, options);
  MX_CHECK(model.is_ok()) << model.status().to_string();
  f.model = std::move(*model);
  auto ref = test::load_fixture_reference(dir);
  MX_CHECK(ref.is_ok()) << ref.status().to_string();
  f.prompts = std::move(ref->prompts);
  f.greedy = std::move(ref->greedy);
  return f;
}

struct Arrival {
  int64_t step = 0;
  size_t prompt = 0;
};

// Runs the arrivals to completion; outputs in arrival order. `constrain(i)` gives arrival i's constraint;
// `edit(i, &input)` changes arrival i's request before it is added.
std::vector<RequestOutput> drive(EngineCore& core, const Loaded& f, const std::vector<Arrival>& arrivals,
                                 int64_t top_logprobs,
                                 const std::function<std::shared_ptr<TokenConstraint>(size_t)>& constrain = nullptr,
                                 const std::function<void(size_t, RequestInput*)>& edit = nullptr) {
  std::vector<RequestOutput> out(arrivals.size());
  std::vector<RequestOutput> deltas;
  size_t added = 0;
  for (int64_t step = 0; added < arrivals.size() || core.has_work(); ++step) {
    for (size_t i = 0; i < arrivals.size(); ++i) {
      if (arrivals[i].step != step) continue;
      RequestInput in;
      in.prompt = f.prompts[arrivals[i].prompt];
      in.max_tokens = static_cast<int64_t>(f.greedy[arrivals[i].prompt].size());
      in.ignore_eos = true;
      in.sampling.logprobs = true;
      in.sampling.top_logprobs = top_logprobs;
      if (constrain) in.constraint = constrain(i);
      if (edit) edit(i, &in);
      MX_CHECK_OK(core.add_request(static_cast<RequestId>(i), std::move(in)));
      ++added;
    }
    core.step(&deltas);
    for (RequestOutput& d : deltas) out[static_cast<size_t>(d.id)].merge(std::move(d));
    MX_CHECK_OK(core.check_invariants());
  }
  return out;
}

std::unique_ptr<EngineCore> make_core(const Loaded& f, EngineConfig c) {
  auto core = EngineCore::create(*f.model, c);
  MX_CHECK(core.is_ok()) << core.status().to_string();
  return std::move(*core);
}

// The graph tests' engine: 256 pages of `page_size` tokens, up to 8 requests, graphs for batches of 1, 2, 4 and 8.
EngineConfig graph_config(int64_t page_size) {
  EngineConfig c;
  c.num_kv_pages = 256;
  c.page_size = page_size;
  c.max_running_requests = 8;
  c.cuda_graph_batch_sizes = {1, 2, 4, 8};
  return c;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Tokens whose id, logprob or top logprobs differ in any bit between two runs of the same arrivals.
int64_t count_differing(const std::vector<RequestOutput>& runs_a, const std::vector<RequestOutput>& runs_b, int64_t* tokens) {
  int64_t differing = 0;
  for (size_t i = 0; i < runs_a.size(); ++i) {
    const auto& a = runs_a[i];
    const auto& b = runs_b[i];
    EXPECT_EQ(a.token_ids.size(), b.token_ids.size());
    EXPECT_EQ(a.logprobs.size(), b.logprobs.size());
    const size_t n = std::min({a.token_ids.size(), b.token_ids.size(), a.logprobs.size(), b.logprobs.size()});
    differing += static_cast<int64_t>(std::max(a.token_ids.size(), b.token_ids.size()) - n);
    for (size_t t = 0; t < n; ++t) {
      ++*tokens;
      bool same = a.token_ids[t] == b.token_ids[t] && same_bits(a.logprobs[t].logprob, b.logprobs[t].logprob) &&
                  a.logprobs[t].top.size() == b.logprobs[t].top.size();
      for (size_t k = 0; same && k < a.logprobs[t].top.size(); ++k)
        same = a.logprobs[t].top[k].token == b.logprobs[t].top[k].token &&
               same_bits(a.logprobs[t].top[k].logprob, b.logprobs[t].top[k].logprob);
      differing += same ? 0 : 1;
    }
  }
  return differing;
}

class EngineGraphTest : public ::testing::TestWithParam<std::string> {};

// How a graph test's runs sample: every row on the host (whole steps: top 3 logprobs drawn and ranked there, the
// path of steps whose every row has penalties), the sample op drawing and the host ranking the top 3 logprobs from
// the copied rows, or the sample op alone (logprobs on).
struct SampleMode {
  const char* name;
  int64_t top_logprobs;
  bool whole_host;
};
constexpr SampleMode kSampleModes[] = {
    {"host sampling", 3, true}, {"sample op + host top-3", 3, false}, {"sample op", 0, false}};

TEST_P(EngineGraphTest, ReplayedDecodeEqualsEagerPaddedBitForBit) {
  const Loaded f = load_fixture(GetParam());
  const EngineConfig c = graph_config(8);
  std::vector<Arrival> arrivals;
  for (size_t i = 0; i < f.prompts.size(); ++i) arrivals.push_back({static_cast<int64_t>(2 * i), i});
  for (const SampleMode& mode : kSampleModes) {
    std::vector<RequestOutput> runs[2];
    int64_t replays[2] = {0, 0}, padded[2] = {0, 0}, in_graph[2] = {0, 0}, op_steps = 0;
    for (int replay = 0; replay < 2; ++replay) {
      auto core = make_core(f, c);
      ASSERT_EQ(core->runner().startup().graph_batch_sizes, (std::vector<int64_t>{1, 2, 4, 8}));
      core->runner().set_graph_replay(replay == 1);
      core->runner().set_whole_batch_host_sampling(mode.whole_host);
      runs[replay] = drive(*core, f, arrivals, mode.top_logprobs);
      replays[replay] = core->runner().num_graph_replays();
      padded[replay] = core->runner().num_padded_steps();
      in_graph[replay] = core->runner().graph_sampled_steps();
      op_steps = core->runner().sample_op_steps();
    }
    int64_t tokens = 0;
    const int64_t differing = count_differing(runs[0], runs[1], &tokens);
    record("runner graphs == eager padded",
           GetParam() + ": " + std::to_string(tokens) + " tokens, " + std::to_string(replays[1]) + " replayed / " +
               std::to_string(padded[1]) + " padded steps (token, logprob" + (mode.top_logprobs ? ", top-3" : "") + " bits; " +
               mode.name + ", " + std::to_string(op_steps) + " op steps, " + std::to_string(in_graph[1]) + " sampled in the graph)",
           static_cast<double>(differing), 0, 0, differing == 0 && replays[1] > 0);
    EXPECT_EQ(replays[0], 0);
    EXPECT_GT(replays[1], 0);
    EXPECT_EQ(padded[0], padded[1]);
    EXPECT_EQ(differing, 0);
    EXPECT_EQ(in_graph[0], 0);
    if (!mode.whole_host) {
      EXPECT_GT(op_steps, 0);
      EXPECT_EQ(in_graph[1], replays[1]);  // every replayed step sampled inside its graph
    } else {
      EXPECT_EQ(in_graph[1], 0);
    }
  }
}

// Verify steps (k = 3 forced drafts, every request verifying) replayed from the runner's verify graphs
// give the same tokens and logprobs, bit for bit, as the same padded steps run eagerly.
TEST_P(EngineGraphTest, ReplayedVerifyEqualsEagerPaddedBitForBit) {
  const Loaded f = load_fixture(GetParam());
  EngineConfig c = graph_config(4);  // 4 verify rows cross pages
  std::vector<Arrival> arrivals;
  for (size_t i = 0; i < f.prompts.size(); ++i) arrivals.push_back({static_cast<int64_t>(i), i});
  auto plain_core = make_core(f, c);
  const auto plain = drive(*plain_core, f, arrivals, 0);
  std::vector<ReferenceDrafter::Reference> refs;
  for (size_t i = 0; i < f.prompts.size(); ++i) refs.push_back({f.prompts[i], plain[i].token_ids});
  c.speculative.algorithm = SpeculativeAlgorithm::kExternal;
  c.speculative.num_draft_tokens = 3;
  c.speculative.external = std::make_shared<const ReferenceDrafter>(std::move(refs));
  for (const SampleMode& mode : kSampleModes) {
    std::vector<RequestOutput> runs[2];
    int64_t verify_replays[2] = {0, 0}, padded[2] = {0, 0};
    for (int replay = 0; replay < 2; ++replay) {
      auto core = make_core(f, c);
      ASSERT_EQ(core->runner().startup().verify_graph_batch_sizes, (std::vector<int64_t>{1, 2, 4, 8}));
      core->runner().set_graph_replay(replay == 1);
      core->runner().set_whole_batch_host_sampling(mode.whole_host);
      runs[replay] = drive(*core, f, arrivals, mode.top_logprobs);
      verify_replays[replay] = core->runner().num_verify_replays();
      padded[replay] = core->runner().num_padded_steps();
    }
    int64_t differing = 0, tokens = 0;
    for (size_t i = 0; i < arrivals.size(); ++i) {
      ASSERT_EQ(runs[0][i].token_ids.size(), runs[1][i].token_ids.size());
      for (size_t t = 0; t < runs[0][i].token_ids.size(); ++t) {
        ++tokens;
        const auto& a = runs[0][i].logprobs[t];
        const auto& b = runs[1][i].logprobs[t];
        bool same = runs[0][i].token_ids[t] == runs[1][i].token_ids[t] && same_bits(a.logprob, b.logprob) && a.top.size() == b.top.size();
        for (size_t k = 0; same && k < a.top.size(); ++k) same = a.top[k].token == b.top[k].token && same_bits(a.top[k].logprob, b.top[k].logprob);
        differing += same ? 0 : 1;
      }
    }
    record("verify graphs == eager padded",
           GetParam() + ": " + std::to_string(tokens) + " tokens, " + std::to_string(verify_replays[1]) +
               " verify steps replayed, " + std::to_string(padded[1]) + " padded steps (" + mode.name + ")",
           static_cast<double>(differing), 0, 0, differing == 0 && verify_replays[1] > 0);
    EXPECT_EQ(verify_replays[0], 0);
    EXPECT_GT(verify_replays[1], 0);
    EXPECT_EQ(padded[0], padded[1]);
    EXPECT_EQ(differing, 0);
  }
}

// A deterministic mask per step (StripedConstraint, striped_constraint_util.h; every third request is left
// unconstrained: masked and unmasked rows share batches).
using test::StripedConstraint;

TEST_P(EngineGraphTest, MaskedDecodeReplaysTheSameGraphsAsEager) {
  const Loaded f = load_fixture(GetParam());
  const EngineConfig c = graph_config(8);
  std::vector<Arrival> arrivals;
  for (size_t i = 0; i < f.prompts.size(); ++i) arrivals.push_back({static_cast<int64_t>(i), i});
  for (const SampleMode& mode : kSampleModes) {
    std::vector<RequestOutput> runs[2];
    int64_t replays[2] = {0, 0}, violations = 0, op_steps = 0;
    for (int replay = 0; replay < 2; ++replay) {
      auto core = make_core(f, c);
      core->runner().set_graph_replay(replay == 1);
      core->runner().set_whole_batch_host_sampling(mode.whole_host);
      std::vector<std::shared_ptr<StripedConstraint>> constraints(arrivals.size());
      runs[replay] = drive(*core, f, arrivals, mode.top_logprobs, [&](size_t i) -> std::shared_ptr<TokenConstraint> {
        if (i % 3 == 2) return nullptr;
        constraints[i] = std::make_shared<StripedConstraint>(static_cast<uint32_t>(i));
        return constraints[i];
      });
      replays[replay] = core->runner().num_graph_replays();
      op_steps = core->runner().sample_op_steps();
      for (const auto& k : constraints) violations += k ? k->violations : 0;
    }
    int64_t differing = 0, tokens = 0;
    for (size_t i = 0; i < arrivals.size(); ++i) {
      ASSERT_EQ(runs[0][i].token_ids.size(), runs[1][i].token_ids.size());
      for (size_t t = 0; t < runs[0][i].token_ids.size(); ++t) {
        ++tokens;
        differing += runs[0][i].token_ids[t] == runs[1][i].token_ids[t] &&
                             same_bits(runs[0][i].logprobs[t].logprob, runs[1][i].logprobs[t].logprob)
                         ? 0
                         : 1;
      }
    }
    const bool pass = differing == 0 && violations == 0 && replays[1] > 0 && replays[0] == 0;
    record("masked decode: graphs == eager",
           GetParam() + ": " + std::to_string(tokens) + " tokens, " + std::to_string(replays[1]) + " replayed steps, " +
               std::to_string(violations) + " tokens outside their masks (" +
               mode.name + ", " + std::to_string(op_steps) + " sample op steps)",
           static_cast<double>(differing + violations), 0, 0, pass);
    EXPECT_EQ(differing, 0);
    EXPECT_EQ(violations, 0);
    EXPECT_GT(replays[1], 0);
    EXPECT_EQ(replays[0], 0);
    if (!mode.whole_host) {
      EXPECT_GT(op_steps, 0);
    }
  }
}

// Where two greedy runs of one prompt first disagree, and how close the top two candidates were there.
struct Divergence {
  size_t agree = 0;   // tokens equal before the first difference
  bool equal = true;
  double margin = 0;  // top-1 minus top-2 logprob of run `a` at the difference
  std::string where;
};

Divergence first_divergence(const RequestOutput& a, const RequestOutput& b) {
  Divergence d;
  while (d.agree < a.token_ids.size() && d.agree < b.token_ids.size() && a.token_ids[d.agree] == b.token_ids[d.agree])
    ++d.agree;
  d.equal = d.agree == a.token_ids.size() && d.agree == b.token_ids.size();
  if (d.equal) return d;
  const auto& ta = a.logprobs[d.agree].top;
  const auto& tb = b.logprobs[d.agree].top;
  if (ta.size() >= 2) d.margin = ta[0].logprob - ta[1].logprob;
  char buf[200];
  std::snprintf(buf, sizeof buf, " at token %zu: %d:%.5f %d:%.5f vs %d:%.5f %d:%.5f", d.agree, ta[0].token, ta[0].logprob,
                ta[1].token, ta[1].logprob, tb[0].token, tb[0].logprob, tb[1].token, tb[1].logprob);
  d.where = buf;
  return d;
}

// A greedy choice between two candidates closer than this (nats) may go either way under bf16 rounding.
constexpr double kNearTie = 0.02;

// Greedy tokens of every prompt batched (5-token chunks, pages of 4, staggered arrivals, graphs on) vs
// each prompt alone (one prefill step, graphs on). A difference is accepted only at a near tie; each
// difference is attributed by a third run: the prompt alone with the same 5-token chunks (same chunk
// shapes, no other sequences in the batch).
TEST_P(EngineGraphTest, BatchingEquivalenceWithGraphs) {
  const Loaded f = load_fixture(GetParam());
  EngineConfig c;
  c.num_kv_pages = 256;
  c.page_size = 4;
  c.max_num_batched_tokens = 5;
  c.max_running_requests = 8;
  std::vector<Arrival> together;
  for (size_t i = 0; i < f.prompts.size(); ++i) together.push_back({static_cast<int64_t>(i), i});
  auto batched_core = make_core(f, c);
  const auto batched = drive(*batched_core, f, together, 2);
  int64_t failures = 0;
  for (size_t i = 0; i < f.prompts.size(); ++i) {
    EngineConfig one_step = c;
    one_step.max_num_batched_tokens = 2048;
    auto alone_core = make_core(f, one_step);
    const auto alone = drive(*alone_core, f, {{0, i}}, 2);
    auto chunked_core = make_core(f, c);
    const auto chunked = drive(*chunked_core, f, {{0, i}}, 2);
    const Divergence d = first_divergence(alone[0], batched[i]);
    const Divergence chunk_only = first_divergence(alone[0], chunked[0]);
    const Divergence batch_only = first_divergence(chunked[0], batched[i]);
    const bool near_tie = !d.equal && d.margin < kNearTie;
    const bool pass = d.equal || near_tie;
    failures += pass ? 0 : 1;
    std::string detail = GetParam() + " prompt " + std::to_string(i) + ": batched = alone for " +
                         std::to_string(d.agree) + "/" + std::to_string(alone[0].token_ids.size());
    if (!d.equal) {
      char buf[160];
      std::snprintf(buf, sizeof buf, " (near tie %.4f nats%s; alone-chunked = alone for %zu, batched = alone-chunked for %zu)",
                    d.margin, near_tie ? "" : " NOT", chunk_only.agree, batch_only.agree);
      detail += buf + d.where;
    }
    std::printf("[batching] %s\n", detail.c_str());
    record("engine batching (cuda, graphs)", detail, static_cast<double>(alone[0].token_ids.size() - d.agree), 0, 0, pass);
  }
  EXPECT_EQ(failures, 0);
}

// Steps whose rows are split between the sample op (inside the decode graphs) and the host sampler (penalties: the
// host draws; top logprobs alone: the op draws, the host ranks) draw what the same steps drew with every row on the
// host (the form before 2026-11-29): the same tokens,
// the host rows' logprobs and top logprobs bit for bit, the sample op's logprobs within 1e-4 (the GPU's log-softmax
// against the host's, as SampleOp's tests). Each request alone is recorded beside them: its tokens differ only where
// the batch moved its bf16 logits (batch-variant kernels, as BatchingEquivalenceWithGraphs), the same in both forms.
TEST_P(EngineGraphTest, SplitSamplingDrawsWhatWholeHostStepsDraw) {
  const Loaded f = load_fixture(GetParam());
  const EngineConfig c = graph_config(8);
  // Two requests a prompt, three arriving a step: seeded sampling (top-p on some) and greedy; every third request
  // needs the host (3 top logprobs; a presence penalty besides on every sixth).
  std::vector<Arrival> arrivals;
  for (size_t i = 0; i < 2 * f.prompts.size(); ++i) arrivals.push_back({static_cast<int64_t>(i / 3), i % f.prompts.size()});
  auto params = [](size_t i, RequestInput* in) {
    in->sampling.temperature = i % 2 == 0 ? 0.8f : 0.0f;
    in->sampling.top_p = i % 4 == 0 ? 0.9f : 1.0f;
    in->sampling.seed = 40 + i;
    if (i % 3 == 2) in->sampling.top_logprobs = 3;
    if (i % 6 == 5) in->sampling.presence_penalty = 0.4f;
  };
  auto host = [](size_t i) { return i % 3 == 2; };
  // `first`: the index in `arrivals` of a's first request (a's requests are consecutive there).
  auto run = [&](const std::vector<Arrival>& a, size_t first, bool whole_host, int64_t* split_steps, int64_t* in_graph) {
    auto core = make_core(f, c);
    core->runner().set_whole_batch_host_sampling(whole_host);
    std::vector<RequestOutput> out = drive(*core, f, a, 0, nullptr, [&](size_t i, RequestInput* in) { params(first + i, in); });
    *split_steps = core->runner().split_sample_steps();
    *in_graph = core->runner().graph_sampled_steps();
    return out;
  };
  int64_t split_steps[2] = {0, 0}, in_graph[2] = {0, 0}, unused = 0;
  const std::vector<RequestOutput> split = run(arrivals, 0, false, &split_steps[0], &in_graph[0]);
  const std::vector<RequestOutput> whole = run(arrivals, 0, true, &split_steps[1], &in_graph[1]);
  int64_t tokens = 0, differing = 0, op_logprobs_off = 0, agree_alone = 0;
  double worst = 0;
  for (size_t i = 0; i < arrivals.size(); ++i) {
    const RequestOutput& a = split[i];
    const RequestOutput& b = whole[i];
    ASSERT_EQ(a.token_ids.size(), b.token_ids.size()) << i;
    ASSERT_EQ(a.logprobs.size(), b.logprobs.size()) << i;
    for (size_t t = 0; t < a.token_ids.size(); ++t) {
      ++tokens;
      const float x = a.logprobs[t].logprob, y = b.logprobs[t].logprob;
      bool same = a.token_ids[t] == b.token_ids[t] && a.logprobs[t].top.size() == b.logprobs[t].top.size();
      for (size_t k = 0; same && k < a.logprobs[t].top.size(); ++k)
        same = a.logprobs[t].top[k].token == b.logprobs[t].top[k].token &&
               same_bits(a.logprobs[t].top[k].logprob, b.logprobs[t].top[k].logprob);
      if (host(i)) {
        same = same && same_bits(x, y);
      } else if (std::isfinite(x) && std::isfinite(y)) {
        worst = std::max(worst, static_cast<double>(std::fabs(x - y)));
        op_logprobs_off += std::fabs(x - y) <= 1e-4f * std::max(1.0f, std::fabs(y)) ? 0 : 1;
      } else {
        same = same && x == y;
      }
      differing += same ? 0 : 1;
    }
    const std::vector<RequestOutput> alone = run({{0, arrivals[i].prompt}}, i, false, &unused, &unused);
    for (size_t t = 0; t < std::min(a.token_ids.size(), alone[0].token_ids.size()) && a.token_ids[t] == alone[0].token_ids[t]; ++t)
      ++agree_alone;
  }
  const bool pass = differing == 0 && op_logprobs_off == 0 && split_steps[0] > 0 && split_steps[1] == 0;
  char detail[512];
  std::snprintf(detail, sizeof detail,
                "%s: %lld tokens, %lld split steps (%lld steps sampled in graphs; whole-host: %lld): %lld differ from "
                "the whole-host steps' draws, sample op logprobs within %.2g; alone = split up to the first difference "
                "for %lld tokens",
                GetParam().c_str(), static_cast<long long>(tokens), static_cast<long long>(split_steps[0]),
                static_cast<long long>(in_graph[0]), static_cast<long long>(in_graph[1]), static_cast<long long>(differing),
                worst, static_cast<long long>(agree_alone));
  record("split sampling == whole-host steps", detail, static_cast<double>(differing + op_logprobs_off), 0, 0, pass);
  EXPECT_EQ(differing, 0);
  EXPECT_EQ(op_logprobs_off, 0);
  EXPECT_GT(split_steps[0], 0);
  EXPECT_GT(in_graph[0], 0);
  EXPECT_EQ(split_steps[1], 0);
}

// The largest |difference| of the chosen tokens' logprobs over the first n tokens of two runs.
double max_logprob_delta(const RequestOutput& a, const RequestOutput& b, size_t n) {
  double m = 0;
  for (size_t t = 0; t < n; ++t) m = std::max(m, std::fabs(static_cast<double>(a.logprobs[t].logprob) - b.logprobs[t].logprob));
  return m;
}

// Speculation on CUDA vs plain decoding, every prompt together: the verify rows run through the prefill
// kernels, so their bf16 logits differ from a decode step's by ~1e-3. A token may differ at a near tie of
// its own logits; elsewhere only where the two runs' routes differed upstream and every first difference
// was a near tie of the router (RouteTrace, route_trace_util.h): identical routes, or a root far from a tie,
// fail. Both runs are traced; graph steps run eagerly with their padding, bit for bit what replay gives
// (ReplayedDecodeEqualsEagerPaddedBitForBit). Forced acceptance checks that the recorded drafts are accepted.
TEST_P(EngineGraphTest, SpeculationEqualsPlainDecodingOnCuda) {
  test::RouteTrace trace(cuda_backend());
  const Loaded f = load_fixture(GetParam(), trace);
  EngineConfig c;
  c.num_kv_pages = 256;
  c.page_size = 4;
  c.max_running_requests = 8;
  std::vector<Arrival> together;
  for (size_t i = 0; i < f.prompts.size(); ++i) together.push_back({0, i});
  auto traced_core = [&](const EngineConfig& config) {
    auto core = make_core(f, config);
    core->runner().set_graph_replay(false);
    core->runner().set_step_observer([&](const ScheduledBatch& b) { trace.begin_step(b); });
    return core;
  };
  auto plain_core = traced_core(c);
  const auto plain = drive(*plain_core, f, together, 2);
  const test::RouteLog plain_routes = trace.take();
  std::vector<ReferenceDrafter::Reference> refs;
  for (size_t i = 0; i < f.prompts.size(); ++i) refs.push_back({f.prompts[i], plain[i].token_ids});
  auto forced = std::make_shared<const ReferenceDrafter>(std::move(refs));
  int64_t failures = 0;
  std::vector<std::pair<SpeculativeAlgorithm, int64_t>> cases = {
      {SpeculativeAlgorithm::kNgram, 3}, {SpeculativeAlgorithm::kExternal, 1}, {SpeculativeAlgorithm::kExternal, 3},
      {SpeculativeAlgorithm::kExternal, 7}};
  // The MTP assistant fixture drafts for the text-only Gemma-4 fixture (random weights: mostly rejected).
  const char* fixtures_env = std::getenv("MX_FIXTURES_DIR");
  const std::string assistant = std::string(fixtures_env ? fixtures_env : MX_FIXTURES_DIR) + "/tiny-gemma4-text-assistant";
  if (GetParam() == "tiny-gemma4-text") {
    cases.push_back({SpeculativeAlgorithm::kMtp, 1});
    cases.push_back({SpeculativeAlgorithm::kMtp, 4});
  }
  // EAGLE-3 drafts of the gpt-oss fixtures' shapes (synthetic presets, random weights: mostly rejected).
  const std::string eagle3 = (std::filesystem::temp_directory_path() / ("mx-gpu-" + GetParam() + "-eagle3")).string();
  if (GetParam() == "tiny-gpt-oss" || GetParam() == "tiny-gpt-oss-b") {
    ASSERT_TRUE(write_synthetic_model(GetParam() + "-eagle3", eagle3, SyntheticOptions{}).is_ok());
    cases.push_back({SpeculativeAlgorithm::kEagle3, 1});
    cases.push_back({SpeculativeAlgorithm::kEagle3, 4});
  }
  for (const auto& [algorithm, k] : cases) {
    EngineConfig sc = c;
    sc.speculative.algorithm = algorithm;
    sc.speculative.num_draft_tokens = k;
    if (algorithm == SpeculativeAlgorithm::kExternal) sc.speculative.external = forced;
    if (algorithm == SpeculativeAlgorithm::kMtp) sc.speculative.draft_model = assistant;
    if (algorithm == SpeculativeAlgorithm::kEagle3) sc.speculative.draft_model = eagle3;
    auto core = traced_core(sc);
    const auto spec = drive(*core, f, together, 2);
    const test::RouteLog spec_routes = trace.take();
    const SchedulerStats st = core->stats().scheduler;
    const std::string what = std::string(algorithm == SpeculativeAlgorithm::kExternal ? "forced" : speculative_algorithm_name(algorithm)) +
                             " k=" + std::to_string(k);
    for (size_t i = 0; i < f.prompts.size(); ++i) {
      const Divergence d = first_divergence(plain[i], spec[i]);
      std::string detail = GetParam() + " " + what + " prompt " + std::to_string(i) + ": speculative = plain for " +
                           std::to_string(d.agree) + "/" + std::to_string(plain[i].token_ids.size());
      bool pass = d.equal || d.margin < kNearTie;
      if (!d.equal) {
        // Token d.agree was sampled from the logits of position prompt + d.agree - 1.
        const auto last = static_cast<int64_t>(f.prompts[i].size() + d.agree) - 1;
        const test::RouteComparison routes = test::compare_routes(plain_routes, spec_routes, static_cast<RequestId>(i), last);
        pass = pass || routes.explains_divergence();
        char buf[96];
        std::snprintf(buf, sizeof buf, "; max |logprob delta| before it %.2e; ", max_logprob_delta(plain[i], spec[i], d.agree));
        detail += std::string(d.margin < kNearTie ? " (near tie)" : routes.explains_divergence() ? " (after a routing near tie)"
                                                                                                  : " (NOT a near tie)") +
                  d.where + buf + routes.describe();
      }
      failures += pass ? 0 : 1;
      if (d.equal) {  // reported: where equal tokens still went through different experts
        const auto last = static_cast<int64_t>(f.prompts[i].size() + d.agree) - 2;
        detail += "; " + test::compare_routes(plain_routes, spec_routes, static_cast<RequestId>(i), last).describe();
      }
      std::printf("[spec] %s\n", detail.c_str());
      record("speculation == plain (cuda)", detail, static_cast<double>(plain[i].token_ids.size() - d.agree), 0, 0, pass);
    }
    // Forced: the drafts are accepted until a near tie sends a sequence off its recorded path (random
    // weights have many; after one the recorded drafts are rejected): a mean accepted length of 1.5 at
    // least (seen on an H100: 1.76-1.78 at k = 1, 2.83-2.85 at k = 3, 3.9-4.3 at k = 7).
    const bool accepted = algorithm != SpeculativeAlgorithm::kExternal || mean_accepted_length(st) >= 1.5;
    record("speculation acceptance (cuda)",
           GetParam() + " " + what + ": " + std::to_string(st.spec_accepted_tokens) + "/" +
               std::to_string(st.spec_draft_tokens) + " drafts accepted in " + std::to_string(st.spec_drafts) +
               " verify steps, mean accepted length " + std::to_string(mean_accepted_length(st)),
           0, 0, 0, accepted && st.spec_drafts > 0 && core->stats().pages_used == 0);
    EXPECT_TRUE(accepted) << what;
    EXPECT_GT(st.spec_drafts, 0) << what;
    EXPECT_EQ(core->stats().pages_used, 0) << what;
  }
  EXPECT_EQ(failures, 0);
}

// --mem-fraction on CUDA: the pool is planned from measured memory and the process stays inside the
// fraction (graphs excepted, which come out of the rest). Other processes on the device (the suite's parallel
// test processes) may allocate or free at any time: the fraction leaves 6 GiB over what the device holds now,
// so their growth during the plan still leaves a pool, and the checks count only what this process owns
// (Backend::allocated_bytes) on top of what the device held when the plan measured it.
TEST_P(EngineGraphTest, PlannedKvPoolStaysInsideTheFraction) {
  const Loaded f = load_fixture(GetParam());
  auto mem = cuda_backend().memory_info();
  ASSERT_TRUE(mem.is_ok());
  const int64_t used = mem->total_bytes - mem->free_bytes;
  EngineConfig c;
  c.mem_fraction = std::min(1.0, static_cast<double>(used + (6ll << 30)) / static_cast<double>(mem->total_bytes));
  c.max_running_requests = 8;
  const int64_t owned_before = cuda_backend().allocated_bytes();
  ASSERT_GE(owned_before, 0);
  auto core = make_core(f, c);
  const RunnerStartup& s = core->runner().startup();
  const int64_t owned = cuda_backend().allocated_bytes() - owned_before;  // the engine's buffers and pool
  const KvMemoryInputs& in = s.memory;
  const auto limit = static_cast<int64_t>(c.mem_fraction * static_cast<double>(mem->total_bytes));
  const int64_t held = in.weights_bytes + in.other_bytes;  // the device's use (every process) as the plan began
  const int64_t pool_budget = limit - held - in.activation_bytes;
  std::printf("[plan] %s; graphs %lld bytes; owned by the engine %lld; held at the plan %lld; limit %lld\n",
              describe_kv_memory_plan(in, s.plan).c_str(), static_cast<long long>(s.graph_bytes),
              static_cast<long long>(owned), static_cast<long long>(held), static_cast<long long>(limit));
  // The pool fills what the plan left it (within a page a group) and is most of the 6 GiB; the engine's own
  // buffers besides the pool fit the activations the plan measured; the process stays inside the fraction.
  const bool pass = s.planned && s.kv_bytes <= pool_budget && s.kv_bytes > (3ll << 30) &&
                    owned - s.kv_bytes <= in.activation_bytes + (64ll << 20) && held + owned <= limit + (64ll << 20);
  record("KV pool from --mem-fraction", GetParam() + ": " + std::to_string(s.kv_pages) + " pages planned", 0, 0, 0, pass);
  EXPECT_TRUE(pass);
  const auto out = drive(*core, f, {{0, 0}}, 0);
  EXPECT_EQ(out[0].token_ids.size(), f.greedy[0].size());
}

// TP N on devices 0..N-1 (test::kTensorParallelCases): the runner captures graphs through the tensor-parallel
// model (each rank records its own stream, NCCL all-reduces and the lm_head's all-gather inside), and
// replaying them gives the tokens and logprobs of the same padded steps run eagerly, bit for bit, with host
// and device sampling. Greedy agreement with TP 1 (graphs too) is reported, not gated: bf16 routing near
// ties may part them.
class TensorParallelGraphTest : public ::testing::TestWithParam<test::TensorParallelCase> {};

TEST_P(TensorParallelGraphTest, ReplayedDecodeEqualsEagerBitForBit) {
  const test::TensorParallelCase& param = GetParam();
  if (const std::string why = tensor_parallel_skip_reason(param); !why.empty()) GTEST_SKIP() << why;
  const std::string& name = param.fixture;
  const int tp = param.tp;
  const Loaded f = load_fixture(name, cuda_backend(), tp, tensor_parallel_load_options(param)), one = load_fixture(name);
  const EngineConfig c = graph_config(8);
  std::vector<Arrival> arrivals;
  for (size_t i = 0; i < f.prompts.size(); ++i) arrivals.push_back({static_cast<int64_t>(2 * i), i});
  const std::string what =
      "TP " + std::to_string(tp) + " MoE split " + moe_split_name(param.moe_split) + " graphs == eager padded";
  for (const SampleMode& mode : kSampleModes) {
    std::vector<RequestOutput> runs[2];
    int64_t replays[2] = {0, 0};
    for (int replay = 0; replay < 2; ++replay) {
      auto core = make_core(f, c);
      ASSERT_EQ(core->runner().startup().graph_batch_sizes, (std::vector<int64_t>{1, 2, 4, 8}));
      core->runner().set_graph_replay(replay == 1);
      core->runner().set_whole_batch_host_sampling(mode.whole_host);
      runs[replay] = drive(*core, f, arrivals, mode.top_logprobs);
      replays[replay] = core->runner().num_graph_replays();
    }
    int64_t tokens = 0;
    const int64_t differing = count_differing(runs[0], runs[1], &tokens);
    auto single = make_core(one, c);
    single->runner().set_whole_batch_host_sampling(mode.whole_host);
    const std::vector<RequestOutput> tp1 = drive(*single, one, arrivals, mode.top_logprobs);
    int64_t agree = 0, total = 0;
    for (size_t i = 0; i < arrivals.size(); ++i) {
      size_t t = 0;
      while (t < tp1[i].token_ids.size() && t < runs[1][i].token_ids.size() && tp1[i].token_ids[t] == runs[1][i].token_ids[t]) ++t;
      agree += static_cast<int64_t>(t);
      total += static_cast<int64_t>(tp1[i].token_ids.size());
    }
    record(what,
           name + ": " + std::to_string(tokens) + " tokens, " + std::to_string(replays[1]) + " replayed steps (" +
               mode.name + "); greedy prefix = TP 1 for " + std::to_string(agree) +
               "/" + std::to_string(total) + " tokens",
           static_cast<double>(differing), 0, 0, differing == 0 && replays[1] > 0);
    EXPECT_EQ(replays[0], 0);
    EXPECT_GT(replays[1], 0);
    EXPECT_EQ(differing, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TensorParallelGraphTest, ::testing::ValuesIn(test::kTensorParallelCases),
                         test::TensorParallelCaseName());

INSTANTIATE_TEST_SUITE_P(Fixtures, EngineGraphTest, ::testing::ValuesIn(test::all_tiny_fixtures()), test::FixtureParamName());

}  // namespace
}  // namespace mx::gpu_test
