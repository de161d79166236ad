// All of the engine's locking lives here. Each lock guards one small object and is held only to move
// data in or out, never while calling back into other code.
#include "runtime/engine_queues.h"

#include <utility>

namespace mx {

bool RequestStream::poll(RequestOutput* out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!has_pending_) return false;
  out->clear();
  std::swap(*out, pending_);  // the caller's old buffers come back to us for reuse
  has_pending_ = false;
  return true;
}

bool RequestStream::wait(RequestOutput* out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return has_pending_; })) return false;
  out->clear();
  std::swap(*out, pending_);
  has_pending_ = false;
  return true;
}

bool RequestStream::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_;
}

void RequestStream::set_notify(std::function<void()> notify) {
  std::lock_guard<std::mutex> lock(mu_);
  notify_ = std::move(notify);
}

void RequestStream::push(RequestOutput&& delta) {
  std::function<void()> notify;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (has_pending_) {
      pending_.merge(std::move(delta));
    } else {
      pending_.clear();
      pending_.merge(std::move(delta));
      has_pending_ = true;
    }
    finished_ = finished_ || pending_.finished();
    notify = notify_;
  }
  cv_.notify_all();
  if (notify) notify();
}

bool EngineInbox::push(EngineCommand&& command) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return false;
    queued_.push_back(std::move(command));
  }
  cv_.notify_one();
  return true;
}

bool EngineInbox::take(std::vector<EngineCommand>* out, bool block) {
  std::unique_lock<std::mutex> lock(mu_);
  if (block) cv_.wait(lock, [&] { return stopped_ || !queued_.empty(); });
  for (auto& c : queued_) out->push_back(std::move(c));
  queued_.clear();
  return !stopped_;
}

void EngineInbox::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
  }
  cv_.notify_all();
}

void StatsBox::set(const EngineStats& stats) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_ = stats;
}

EngineStats StatsBox::get() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace mx
