// Collectives among the ranks of one tensor-parallel group (model/tensor_parallel_model.h). Every rank calls
// the same collectives in the same order, each from its own thread, with tensors of the same shape; a rank
// that fails calls abort() so that the others return an error instead of waiting for it forever.
#pragma once

#include "core/status.h"
#include "core/tensor_view.h"

namespace mx {

// The message of the error a rank gets when another rank aborted the round.
inline constexpr const char* kTensorParallelAborted = "another tensor-parallel rank failed";

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // x <- the sum of every rank's x, added in rank order (so every rank gets the same bits). f32 or bf16
  // (summed in f32).
  virtual Status all_reduce_sum(TensorView x) = 0;
  // out [R, sum of n_r] <- every rank's `local` [R, n_r] side by side in rank order (f32), on every rank.
  virtual Status all_gather_columns(const TensorView& local, TensorView out) = 0;
  // Wakes every rank waiting in a collective of this round, and fails the rest of the round's collectives,
  // with an error. Whoever runs the ranks resets the group before the next round.
  virtual void abort() = 0;
};

}  // namespace mx
