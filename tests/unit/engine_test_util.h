// Shared by the engine tests: the tiny fixtures (model, prompts, transformers' greedy tokens) and a driver
// that runs an EngineCore to completion, checking the scheduler's invariants after every step.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/model.h"
#include "runtime/engine_core.h"

namespace mx::test {

struct Fixture {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int32_t>> greedy;  // transformers' greedy continuation of each prompt
};

// Loaded once per process and shared (read-only after loading).
const Fixture& fixture_model(const std::string& name);

struct Arrival {
  int64_t step = 0;  // added just before this engine step (0 = before the first)
  RequestInput input;
};

struct DriveResult {
  std::vector<RequestOutput> outputs;  // merged, one per arrival, in arrival order
  EngineStats stats;
  int64_t steps = 0;
  std::string error;  // first invariant violation or add failure; empty when all went well
};

// Runs the arrivals through `core` until every request has finished. `each_step` (optional) runs after
// every step with the step index and may add or abort requests through the core.
using StepHook = std::function<void(EngineCore& core, int64_t step)>;
DriveResult drive(EngineCore& core, std::vector<Arrival> arrivals, const StepHook& each_step = {});

// Greedy, max_tokens n, no stop ids.
RequestInput greedy_request(const std::vector<int32_t>& prompt, int64_t n);

// Small pages (4 tokens: windows release pages and rollbacks cross page boundaries) and, with k > 0,
// `algorithm` drafting k tokens with the draft model in `draft_dir`; k = 0 is the plain engine to compare with.
EngineConfig draft_model_config(SpeculativeAlgorithm algorithm, int64_t k, const std::string& draft_dir);

// An engine of `config` over fx.model driven through `arrivals`, expecting no error; a speculating engine must
// have called its drafter.
DriveResult run_engine(const Fixture& fx, const EngineConfig& config, const std::vector<Arrival>& arrivals);

// Each prompt of `fx` twice (30 greedy tokens each) through a plain engine and a speculating one, both with a
// pool of 48 pages and steps of `step_tokens`: the outputs are equal, requests were preempted, prompts hit
// the prefix cache, drafts were verified and every page came back (draft models' preemption and reuse test).
void expect_speculation_survives_preemption_and_prefix_hits(const Fixture& fx, EngineConfig plain, EngineConfig spec,
                                                           int64_t step_tokens);

}  // namespace mx::test
