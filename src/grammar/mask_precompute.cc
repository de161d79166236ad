#include "grammar/mask_precompute.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

namespace mx::grammar {

MaskPrecompute::MaskPrecompute(int threads, int64_t max_cache_bytes_per_grammar)
    : max_cache_bytes_(max_cache_bytes_per_grammar) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { work(); });
}

MaskPrecompute::~MaskPrecompute() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  ready_.notify_all();
  for (std::thread& t : threads_) t.join();
}

int MaskPrecompute::default_threads() {
  return std::clamp(static_cast<int>(std::thread::hardware_concurrency() / 4), 1, 4);
}

void MaskPrecompute::add(const std::shared_ptr<const CompiledGrammar>& grammar) {
  if (threads_.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(Job{next_id_++, grammar});
  }
  ready_.notify_all();
}

void MaskPrecompute::work() {
  // Linux gives each thread its own nice value: this one yields to every normal-priority thread.
  setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      ready_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      job = queue_.front();
      ++busy_;
    }
    if (auto grammar = job.grammar.lock()) grammar->precompute_masks(stop_, max_cache_bytes_);
    // Every node of the grammar is taken (or it is gone): the first worker back retires the job.
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!queue_.empty() && queue_.front().id == job.id) queue_.pop_front();
      --busy_;
    }
    idle_.notify_all();
  }
}

void MaskPrecompute::wait_idle() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [&] { return threads_.empty() || (queue_.empty() && busy_ == 0); });
}

}  // namespace mx::grammar
