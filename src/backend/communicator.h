// Collectives among the ranks of one tensor-parallel group (model/tensor_parallel_model.h). Every rank calls
// the same collectives in the same order, each from its own thread, with tensors of the same shape; a rank
// that fails calls abort() so that the others return an error instead of waiting for it forever.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "core/tensor_view.h"

namespace mx {

// The message of the error a rank gets when another rank aborted the round.
inline constexpr const char* kTensorParallelAborted = "another tensor-parallel rank failed";

// [begin, end) of `rank`'s share of `n` items split over `size` ranks: the first n % size ranks get one more.
inline std::pair<int64_t, int64_t> split_range(int64_t n, int rank, int size) {
  const int64_t base = n / size, extra = n % size;
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Called on one rank before the ranks start a round of collectives (a forward pass): clears the abort of
  // an earlier round where the transport allows it.
  virtual void begin_round() {}
  // x <- the sum of every rank's x, added in rank order (so every rank gets the same bits). f32 or bf16
  // (summed in f32).
  virtual Status all_reduce_sum(TensorView x) = 0;
  // all_reduce_sum(x), then backend.add_rms_norm(residual, x, weight, eps, out): the step after a row-parallel
  // projection. A transport may do both in one pass (CUDA's one-shot path, for a few rows); the result is the
  // pair's. `backend` is this rank's.
  virtual Status all_reduce_add_rms_norm(TensorView x, Backend& backend, TensorView residual, const TensorView& weight,
                                         float eps, TensorView out) {
    MX_RETURN_IF_ERROR(all_reduce_sum(x));
    return backend.add_rms_norm(residual, x, weight, eps, out);
  }
  // out [R, N] <- every rank's `local` [R, n_r] side by side in rank order (f32), on every rank; the widths
  // n_r split N as split_range does.
  virtual Status all_gather_columns(const TensorView& local, TensorView out) = 0;
  // Sizes whatever scratch all_gather_columns needs for up to [rows, columns], before any graph is captured
  // (a model calls it when it makes its workspace): scratch grown later would not be the scratch that the
  // graphs captured before hold.
  virtual Status prepare_all_gather(int64_t rows, int64_t columns) {
    (void)rows, (void)columns;
    return Status::ok();
  }
  // Wakes every rank waiting in a collective of this round, and fails the rest of the round's collectives,
  // with an error. Whoever runs the ranks resets the group before the next round.
  virtual void abort() = 0;
};

// One communicator per rank, rank r's on ranks[r] (all of one kind: the CPU's threads, or CUDA devices over
// NCCL); they share whatever connects them and keep it alive.
Result<std::vector<std::unique_ptr<Communicator>>> make_communicators(const std::vector<Backend*>& ranks);

}  // namespace mx
