// Tensor-parallel collectives between the GPUs of one process (communicator.h), each on its rank's CUDA
// stream. Small all-reduces (decode rows) take a one-shot kernel over peer memory (kernels/all_reduce.h:
// each rank writes its message into every rank's exchange and sums them all in rank order, no host
// involved, graph-safe); large ones and the all-gather take NCCL (all_reduce_config.h picks). NCCL is loaded
// when the first group is made (dlopen libnccl.so.2), so mxserve needs it only for tensor parallel on CUDA.
// The ranks other than 0 read rank 0's staged batch (token ids, positions, page tables) directly from its
// memory: the group enables peer access from every rank's device to rank 0's, and between every pair where
// it can (the one-shot path needs all pairs; without them every all-reduce takes NCCL).
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"
#include "backend/cuda/all_reduce_config.h"

namespace mx {

struct AllReduceOptions {
  // Largest message (bytes per rank) an all-reduce sends one-shot: cuda::kOneShotAutoMaxBytes for the measured
  // default (all_reduce_config.cc), 0 for NCCL always, at most cuda::kOneShotSlotBytes. Tests and the
  // all-reduce benchmark set it to compare the paths.
  int64_t one_shot_max_bytes = cuda::kOneShotAutoMaxBytes;
};

// One communicator per CUDA backend in `ranks` (each on its own device), in rank order.
Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_communicators(const std::vector<Backend*>& ranks,
                                                                          const AllReduceOptions& options = {});

}  // namespace mx
