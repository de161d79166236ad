// EngineCore: the single-threaded engine. Owns the scheduler (with the page pool) and the model runner,
// and steps them: schedule -> execute -> update -> outputs. It is deterministic for a given sequence of
// add/abort/step calls, which is how the tests drive it (checking invariants after every step); Engine
// (engine.h) runs one on its own thread for servers and the CLI.
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "model/model.h"
#include "runtime/engine_config.h"
#include "runtime/model_runner.h"
#include "runtime/request.h"
#include "runtime/scheduler.h"

namespace mx {

struct EngineStats {
  int64_t num_running = 0;
  int64_t num_waiting = 0;
  // The context's pool (the first full-attention KV layer group's; every full group holds the same pages).
  int64_t num_pages = 0;
  int64_t pages_used = 0;
  int64_t pages_free = 0;
  int64_t pages_cached = 0;
  std::vector<int64_t> group_pages_used;  // per KV layer group (sliding-window groups hold only their windows)
  SchedulerStats scheduler;
};

class EngineCore {
 public:
  // `config` is resolved here (see resolve_engine_config); `detokenize` may be empty (then requests
  // cannot use stop strings or return_text). The model must outlive the engine.
  static Result<std::unique_ptr<EngineCore>> create(const Model& model, const EngineConfig& config,
                                                    DetokenizeFn detokenize = {});

  const EngineConfig& config() const { return config_; }

  // Checks a request against the model and the engine's limits; thread-safe (reads immutable state only).
  // Every error is the caller's (invalid_argument), never a crash.
  Status validate(const RequestInput& input) const;
  // Validates and queues; `id` must be unique among live requests.
  Status add_request(RequestId id, RequestInput input);
  // Aborts a live request (queued or running): its pages are free when this returns, and its final
  // output (finish kAbort) comes with the next step's outputs. Unknown ids are ignored.
  void abort(RequestId id);

  // One engine step. `outputs` receives one delta per request that produced something (tokens, text or a
  // finish), including aborts since the previous step. A failed forward pass finishes the requests of
  // that batch with kError; the engine itself keeps going.
  void step(std::vector<RequestOutput>* outputs);
  // step() in two halves, for a caller with host work to do while the device computes (the engine thread
  // delivers the previous step's outputs): begin_step schedules a batch and launches it, finish_step waits
  // for its results, applies them and fills `outputs`. No other call may come between the two.
  // Overlapped steps (EngineConfig::overlap_steps): finish_step of a decode step schedules and packs the next
  // step before it waits, launches it as soon as the results are read, then applies them: the next
  // begin_step finds it running. Outputs are the same as without (a request that stops is computed one
  // step more, unseen).
  void begin_step();
  void finish_step(std::vector<RequestOutput>* outputs);
  // Benchmarks: overlapped steps on or off from the next finish_step (a step already launched runs on).
  void set_overlap_steps(bool on) { overlap_ = on; }
  // Benchmarks: tokens computed per step from the next scheduled step on, 1 to config().max_num_batched_tokens
  // (the buffers were sized for that): `bench latency --compare-batched-tokens` times prefill chunk sizes in
  // one process.
  Status set_step_token_budget(int64_t tokens);

  bool has_work() const { return scheduler_.has_work() || !touched_.empty() || launched_ != nullptr; }
  int64_t num_live() const { return static_cast<int64_t>(requests_.size()); }
  EngineStats stats() const;
  Status check_invariants() const { return scheduler_.check_invariants(); }
  // For benchmarks and tests: start-up facts, graph replay on/off, sampling time.
  ModelRunner& runner() { return *runner_; }

 private:
  EngineCore(const Model& model, EngineConfig config, DetokenizeFn detokenize);
  void collect_outputs(std::vector<RequestOutput>* outputs);

  const Model& model_;
  const EngineConfig config_;
  DetokenizeFn detokenize_;
  Scheduler scheduler_;
  std::unique_ptr<ModelRunner> runner_;
  std::unordered_map<RequestId, std::unique_ptr<Request>> requests_;
  std::vector<Request*> touched_;
  std::vector<RequestId> finished_ids_;
  // Finished while an overlapped step that may list them was in flight: forgotten at the next collect.
  std::vector<RequestId> retired_ids_;
  std::vector<SampledToken> sampled_;
  const ScheduledBatch* launched_ = nullptr;  // begin_step's batch (the scheduler's), until finish_step
  Status launch_status_ = Status::ok();
  int64_t next_arrival_ = 0;
  bool overlap_ = true;
};

}  // namespace mx
