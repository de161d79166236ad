// Tensor-parallel collectives between threads of one process (the CPU backend's ranks): each rank
// publishes a pointer to its tensor, waits for the others, and reads theirs directly from memory.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "backend/communicator.h"

namespace mx {

class CpuCommGroup : public std::enable_shared_from_this<CpuCommGroup> {
 public:
  static std::shared_ptr<CpuCommGroup> create(int size);
  int size() const { return size_; }
  // Rank `rank`'s communicator; it keeps the group alive.
  std::unique_ptr<Communicator> communicator(int rank);
  // Clears an abort before the next round (no rank may be inside a collective).
  void reset();

 private:
  friend class CpuCommunicator;
  explicit CpuCommGroup(int size);
  // Waits until every rank arrived; false when the round was aborted.
  bool arrive_and_wait();
  void abort();

  const int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int64_t generation_ = 0;
  bool aborted_ = false;
  std::vector<const void*> published_;  // [size] each rank's tensor for the current collective
  std::vector<int64_t> widths_;         // [size] all_gather_columns: each rank's column count
};

}  // namespace mx
