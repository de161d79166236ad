// Engine: an EngineCore stepping on its own thread, with a thread-safe front: add_request returns a
// RequestStream to read output from (poll, wait, or a notify callback for event loops), abort works at any
// moment (pages freed within one step), and a request whose stream is dropped by its reader is aborted.
//
// The engine thread's loop: take commands (blocking only when idle) -> apply adds and aborts ->
// core step -> deliver deltas to streams -> publish stats.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <unordered_map>

#include "runtime/engine_core.h"
#include "runtime/engine_queues.h"

namespace mx {

class Engine {
 public:
  // Builds the core (KV pool, runner) and starts the thread. The model must outlive the engine.
  static Result<std::unique_ptr<Engine>> start(const Model& model, const EngineConfig& config,
                                               DetokenizeFn detokenize = {});
  // shutdown(), then frees the core.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const EngineConfig& config() const { return core_->config(); }

  // Validates on the caller's thread (invalid_argument for bad input), checks admission (resource_exhausted
  // when max_queued_requests would be exceeded, unavailable after shutdown), then queues the request.
  Result<std::shared_ptr<RequestStream>> add_request(RequestInput input);
  void abort(RequestId id);
  // The snapshot taken after the engine's latest step.
  EngineStats stats() const { return stats_.get(); }
  // Live requests: added and not yet finished (final output delivered).
  int64_t num_live() const { return live_.load(); }
  // Stops accepting, aborts every live request (each stream gets a kAbort final output) and joins the thread.
  void shutdown();

 private:
  explicit Engine(std::unique_ptr<EngineCore> core) : core_(std::move(core)) {}
  void loop();
  void apply(EngineCommand& command);
  void deliver(std::vector<RequestOutput>& outputs);
  void log_stats();

  std::unique_ptr<EngineCore> core_;
  EngineInbox inbox_;
  StatsBox stats_;
  std::thread thread_;
  std::atomic<RequestId> next_id_{1};
  std::atomic<int64_t> live_{0};
  std::atomic<bool> joined_{false};
  // Engine thread only.
  std::unordered_map<RequestId, std::shared_ptr<RequestStream>> streams_;
  std::vector<RequestId> abandoned_;
  std::chrono::steady_clock::time_point last_log_{};
  int64_t last_logged_steps_ = 0;
  // Wall time of the steps and of delivering outputs (inside the next step), and the runner's device wait,
  // in all and at the last stats line (each line reports the interval since the one before).
  double step_seconds_ = 0, deliver_seconds_ = 0;
  double logged_step_seconds_ = 0, logged_deliver_seconds_ = 0, logged_wait_seconds_ = 0, logged_idle_seconds_ = 0;
};

}  // namespace mx
