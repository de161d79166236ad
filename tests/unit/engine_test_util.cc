// See engine_test_util.h.
#include "engine_test_util.h"

#include <gtest/gtest.h>

#include <mutex>

#include "fixture_reference_util.h"
#include "model/model_registry.h"
#include "test_util.h"

namespace mx::test {

const Fixture& fixture_model(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Fixture>> cache;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = cache[name];
  if (slot) return *slot;
  slot = std::make_unique<Fixture>();
  const std::string dir = fixture(name);
  CpuBackendOptions options;
  options.num_threads = 2;
  slot->backend = make_cpu_backend(options);
  auto model = load_model(dir, *slot->backend);
  EXPECT_TRUE(model.is_ok()) << model.status().to_string();
  slot->model = std::move(*model);
  auto ref = load_fixture_reference(dir);
  EXPECT_TRUE(ref.is_ok()) << ref.status().to_string();
  slot->prompts = std::move(ref->prompts);
  slot->greedy = std::move(ref->greedy);
  return *slot;
}

RequestInput greedy_request(const std::vector<int32_t>& prompt, int64_t n) {
  RequestInput r;
  r.prompt = prompt;
  r.max_tokens = n;
  return r;
}

DriveResult drive(EngineCore& core, std::vector<Arrival> arrivals, const StepHook& each_step) {
  DriveResult result;
  result.outputs.resize(arrivals.size());
  std::map<RequestId, size_t> index;
  RequestId next_id = 1000;
  size_t added = 0;
  std::vector<RequestOutput> deltas;
  for (int64_t step = 0;; ++step) {
    for (size_t i = 0; i < arrivals.size(); ++i) {
      if (arrivals[i].step != step) continue;
      const RequestId id = next_id++;
      const Status s = core.add_request(id, arrivals[i].input);
      if (!s.is_ok()) {
        result.error = "add: " + s.to_string();
        return result;
      }
      index[id] = i;
      ++added;
    }
    if (added == arrivals.size() && !core.has_work()) break;
    core.step(&deltas);
    result.steps = step + 1;
    for (RequestOutput& d : deltas) {
      auto it = index.find(d.id);
      if (it != index.end()) result.outputs[it->second].merge(std::move(d));
    }
    const Status inv = core.check_invariants();
    if (!inv.is_ok()) {
      result.error = "after step " + std::to_string(step) + ": " + inv.to_string();
      return result;
    }
    if (each_step) each_step(core, step);
    if (step > 100000) {
      result.error = "no progress";
      return result;
    }
  }
  result.stats = core.stats();
  return result;
}

EngineConfig draft_model_config(SpeculativeAlgorithm algorithm, int64_t k, const std::string& draft_dir) {
  EngineConfig c;
  c.page_size = 4;
  if (k > 0) {
    c.speculative.algorithm = algorithm;
    c.speculative.num_draft_tokens = k;
    c.speculative.draft_model = draft_dir;
  }
  return c;
}

DriveResult run_engine(const Fixture& fx, const EngineConfig& config, const std::vector<Arrival>& arrivals) {
  auto core = EngineCore::create(*fx.model, config);
  EXPECT_TRUE(core.is_ok()) << core.status().to_string();
  if (!core.is_ok()) return {};
  DriveResult r = drive(**core, arrivals);
  EXPECT_EQ(r.error, "");
  if (config.speculative.enabled()) {
    EXPECT_GT((*core)->runner().num_draft_calls(), 0);
  }
  return r;
}

void expect_speculation_survives_preemption_and_prefix_hits(const Fixture& fx, EngineConfig plain, EngineConfig spec,
                                                           int64_t step_tokens) {
  std::vector<Arrival> arrivals;
  for (int rep = 0; rep < 2; ++rep)
    for (size_t i = 0; i < fx.prompts.size(); ++i)
      arrivals.push_back({static_cast<int64_t>(rep * 3 + i), greedy_request(fx.prompts[i], 30)});
  std::vector<DriveResult> results;
  for (EngineConfig* c : {&plain, &spec}) {
    c->num_kv_pages = 48;
    c->max_num_batched_tokens = step_tokens;
    auto core = EngineCore::create(*fx.model, *c);
    ASSERT_TRUE(core.is_ok()) << core.status().to_string();
    results.push_back(drive(**core, arrivals));
    ASSERT_EQ(results.back().error, "");
    ASSERT_EQ(results.back().outputs.size(), arrivals.size());
  }
  for (size_t i = 0; i < arrivals.size(); ++i) EXPECT_EQ(results[1].outputs[i].token_ids, results[0].outputs[i].token_ids) << i;
  const SchedulerStats& s = results[1].stats.scheduler;
  EXPECT_GT(s.preemptions, 0);
  EXPECT_GT(s.prefix_hit_tokens, 0);
  EXPECT_GT(s.spec_drafts, 0);
  EXPECT_EQ(results[1].stats.pages_used, 0);
}

}  // namespace mx::test
