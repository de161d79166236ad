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

}  // namespace mx::test
