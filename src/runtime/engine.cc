// The engine thread. Everything here but add_request/abort/shutdown runs on it; the queues it shares with
// other threads are in engine_queues.cc.
#include "runtime/engine.h"

#include <cstdio>

#include "core/log.h"

namespace mx {

Result<std::unique_ptr<Engine>> Engine::start(const Model& model, const EngineConfig& config,
                                              DetokenizeFn detokenize) {
  MX_ASSIGN_OR_RETURN(auto core, EngineCore::create(model, config, std::move(detokenize)));
  std::unique_ptr<Engine> engine(new Engine(std::move(core)));
  engine->stats_.set(engine->core_->stats());
  engine->thread_ = std::thread([e = engine.get()] { e->loop(); });
  return engine;
}

Engine::~Engine() { shutdown(); }

Result<std::shared_ptr<RequestStream>> Engine::add_request(RequestInput input) {
  MX_RETURN_IF_ERROR(core_->validate(input));
  const EngineConfig& c = core_->config();
  const int64_t live = live_.fetch_add(1) + 1;
  if (c.max_queued_requests > 0 && live > c.max_running_requests + c.max_queued_requests) {
    live_.fetch_sub(1);
    return resource_exhausted("the engine is full (" + std::to_string(c.max_running_requests) + " running + " +
                              std::to_string(c.max_queued_requests) + " queued requests); retry later");
  }
  EngineCommand command;
  command.kind = EngineCommand::Kind::kAdd;
  command.id = next_id_.fetch_add(1);
  command.input = std::move(input);
  command.stream = std::make_shared<RequestStream>(command.id);
  auto stream = command.stream;
  if (!inbox_.push(std::move(command))) {
    live_.fetch_sub(1);
    return Status(StatusCode::kResourceExhausted, "the engine is shutting down");
  }
  return stream;
}

void Engine::abort(RequestId id) {
  EngineCommand command;
  command.kind = EngineCommand::Kind::kAbort;
  command.id = id;
  (void)inbox_.push(std::move(command));  // after shutdown everything is aborted anyway
}

void Engine::shutdown() {
  inbox_.stop();
  if (thread_.joinable() && !joined_.exchange(true)) thread_.join();
}

void Engine::apply(EngineCommand& command) {
  if (command.kind == EngineCommand::Kind::kAbort) {
    core_->abort(command.id);
    return;
  }
  const Status status = core_->add_request(command.id, std::move(command.input));
  if (!status.is_ok()) {  // validated already; only a core-side refusal can land here
    RequestOutput out;
    out.id = command.id;
    out.finish = FinishReason::kError;
    out.error = status.to_string();
    live_.fetch_sub(1);
    command.stream->push(std::move(out));
    return;
  }
  streams_.emplace(command.id, std::move(command.stream));
}

void Engine::deliver(std::vector<RequestOutput>& outputs) {
  for (RequestOutput& out : outputs) {
    auto it = streams_.find(out.id);
    if (it == streams_.end()) continue;
    const bool done = out.finished();
    // A reader that sees the finish may add a request at once: it must no longer count as live by then.
    if (done) live_.fetch_sub(1);
    it->second->push(std::move(out));
    if (done) streams_.erase(it);
  }
  outputs.clear();  // delivered once
}

void Engine::log_stats() {
  // At most one line per kStatsInterval at INFO, and only when something ran since the last one.
  constexpr auto kStatsInterval = std::chrono::seconds(5);
  const auto now = std::chrono::steady_clock::now();
  const EngineStats s = core_->stats();
  if (now - last_log_ < kStatsInterval || s.scheduler.steps == last_logged_steps_) return;
  // Per step since the last line: its wall time; of that, the host blocked on the device's results
  // ("device wait"), delivered the previous step's outputs while the device ran, and did the rest of its work
  // (scheduling, staging, launch, the update, the outputs), of which some with nothing queued on the device
  // (from a step's results to the next launch: all of it without overlapped steps).
  const double steps = static_cast<double>(s.scheduler.steps - last_logged_steps_);
  const double wait = core_->runner().device_wait_seconds(), idle = core_->runner().idle_seconds();
  const double step_ms = 1e3 * (step_seconds_ - logged_step_seconds_) / steps;
  const double wait_ms = 1e3 * (wait - logged_wait_seconds_) / steps;
  const double deliver_ms = 1e3 * (deliver_seconds_ - logged_deliver_seconds_) / steps;
  const double idle_ms = 1e3 * (idle - logged_idle_seconds_) / steps;
  char per_step[224];
  std::snprintf(per_step, sizeof(per_step),
                "; per step %.2f ms: device wait %.2f, delivery %.2f, other host work %.2f (%.2f with the device idle)",
                step_ms, wait_ms, deliver_ms, step_ms - wait_ms - deliver_ms, idle_ms);
  MX_LOG(Info) << "engine: running " << s.num_running << ", waiting " << s.num_waiting << ", KV pages used "
               << s.pages_used << "/" << s.num_pages << " (" << s.pages_cached << " cached), steps "
               << s.scheduler.steps << ", generated " << s.scheduler.generated_tokens << ", prefix-hit tokens "
               << s.scheduler.prefix_hit_tokens << ", preemptions " << s.scheduler.preemptions << ", overlapped steps "
               << s.scheduler.overlapped_steps << per_step;
  last_log_ = now;
  last_logged_steps_ = s.scheduler.steps;
  logged_step_seconds_ = step_seconds_;
  logged_deliver_seconds_ = deliver_seconds_;
  logged_wait_seconds_ = wait;
  logged_idle_seconds_ = idle;
}

void Engine::loop() {
  std::vector<EngineCommand> commands;
  std::vector<RequestOutput> outputs;
  bool running = true;
  while (running) {
    running = inbox_.take(&commands, /*block=*/!core_->has_work());
    for (EngineCommand& c : commands) apply(c);
    commands.clear();
    if (!running) break;
    // A reader that dropped its stream will never read: abort its request rather than compute for nobody.
    abandoned_.clear();
    for (const auto& [id, stream] : streams_)
      if (stream.use_count() == 1) abandoned_.push_back(id);
    for (RequestId id : abandoned_) core_->abort(id);
    // The outputs of a step reach their streams while the device runs the next one (a stream's push and its
    // reader's wake-up cost the host microseconds, hundreds of them a step at serving batches), or at once
    // when no step follows. A replayed decode graph is still running when begin_step returns.
    if (core_->has_work()) {
      const auto t0 = std::chrono::steady_clock::now();
      core_->begin_step();
      const auto t1 = std::chrono::steady_clock::now();
      deliver(outputs);
      deliver_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
      core_->finish_step(&outputs);
      step_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    if (!core_->has_work()) deliver(outputs);
    stats_.set(core_->stats());
    log_stats();
  }
  // Shutdown: every live request ends with kAbort.
  deliver(outputs);  // the last step's, if it left work behind
  for (const auto& [id, stream] : streams_) core_->abort(id);
  core_->step(&outputs);  // schedules nothing: every request is finished; collects the final outputs
  deliver(outputs);
  stats_.set(core_->stats());
}

}  // namespace mx
