// Background threads that build the node masks of newly compiled grammars (CompiledGrammar::
// precompute_masks), so that the engine thread, which fills masks between launching a forward pass and
// sampling, rarely builds one itself: a node costs a walk of the whole vocabulary (a few ms), and one new
// schema would otherwise stall every running request for each node its first requests reach. For gpt-oss
// the answer's grammar is needed only after the analysis, which usually leaves the threads time to finish.
// The threads run at the lowest CPU priority: spare cores do the work, the engine and the HTTP threads
// come first; a node not built yet when a matcher needs it is built by the matcher (or waited for).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "grammar/grammar_matcher.h"

namespace mx::grammar {

class MaskPrecompute {
 public:
  // `threads` workers (0: none, add() does nothing); each grammar's precomputation stops once its node
  // caches hold `max_cache_bytes_per_grammar` (the rest are built on demand).
  MaskPrecompute(int threads, int64_t max_cache_bytes_per_grammar);
  ~MaskPrecompute();  // stops between two nodes and joins
  MaskPrecompute(const MaskPrecompute&) = delete;
  MaskPrecompute& operator=(const MaskPrecompute&) = delete;

  // Queues `grammar` (held weakly: a grammar nobody uses any more is skipped). All workers share a grammar
  // until its nodes are built, then move to the next.
  void add(const std::shared_ptr<const CompiledGrammar>& grammar);
  // Returns once every queued grammar is done (tests; a server never waits for it).
  void wait_idle();
  // A default worker count for this machine: a quarter of the cores, 1 to 4.
  static int default_threads();

 private:
  struct Job {
    uint64_t id;
    std::weak_ptr<const CompiledGrammar> grammar;
  };
  void work();

  const int64_t max_cache_bytes_;
  std::mutex mu_;
  std::condition_variable ready_, idle_;
  int busy_ = 0;  // workers inside a job
  std::deque<Job> queue_;
  uint64_t next_id_ = 0;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

}  // namespace mx::grammar
