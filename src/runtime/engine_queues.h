// The two typed queues between the engine thread and everyone else, and the only locks of the engine:
//  - EngineInbox: callers (HTTP threads, the CLI) -> engine thread: add and abort commands.
//  - RequestStream: engine thread -> the request's consumer: output deltas, merged while unread.
// Plus StatsBox, the engine's latest stats snapshot. Native structs only, never JSON.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/engine_core.h"
#include "runtime/request.h"

namespace mx {

// One request's output, read by one consumer. Deltas pushed while the consumer is away merge into one,
// so a slow reader costs memory only for the tokens themselves, never a growing queue of deltas.
class RequestStream {
 public:
  explicit RequestStream(RequestId id) : id_(id) {}
  RequestId id() const { return id_; }

  // Non-blocking: replaces *out with everything delivered since the last call; false when nothing is new.
  bool poll(RequestOutput* out);
  // Like poll, but waits up to `timeout` for something new.
  bool wait(RequestOutput* out, std::chrono::milliseconds timeout);
  // True once the final delta (with a finish reason) has been delivered, read or not.
  bool finished() const;
  // Called on the engine thread after each delivery, outside the lock: keep it short (e.g. post a wake-up
  // to an event loop). Set it before the first delivery can matter, i.e. right after add_request.
  void set_notify(std::function<void()> notify);

  // Engine side.
  void push(RequestOutput&& delta);

 private:
  const RequestId id_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  RequestOutput pending_;
  bool has_pending_ = false;
  bool finished_ = false;
  std::function<void()> notify_;
};

struct EngineCommand {
  enum class Kind : uint8_t { kAdd, kAbort };
  Kind kind = Kind::kAdd;
  RequestId id = -1;
  RequestInput input;                      // kAdd
  std::shared_ptr<RequestStream> stream;  // kAdd
};

class EngineInbox {
 public:
  // False (and nothing queued) once stopped.
  bool push(EngineCommand&& command);
  // Moves queued commands into *out (appending). With `block`, first waits for one or for stop().
  // Returns false once stopped; *out then still receives what was queued, for the caller to finish.
  bool take(std::vector<EngineCommand>* out, bool block);
  void stop();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<EngineCommand> queued_;
  bool stopped_ = false;
};

class StatsBox {
 public:
  void set(const EngineStats& stats);
  EngineStats get() const;

 private:
  mutable std::mutex mu_;
  EngineStats stats_;
};

}  // namespace mx
