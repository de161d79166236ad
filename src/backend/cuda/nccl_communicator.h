// Tensor-parallel collectives between the GPUs of one process over NCCL (communicator.h), each on its rank's
// CUDA stream. NCCL is loaded when the first group is made (dlopen libnccl.so.2), so mxserve needs it only
// for tensor parallel on CUDA. The ranks other than 0 read rank 0's staged batch (token ids, positions, page
// tables) directly from its memory: the group enables peer access from every rank's device to rank 0's.
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/communicator.h"

namespace mx {

// One communicator per CUDA backend in `ranks` (each on its own device), in rank order.
Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_communicators(const std::vector<Backend*>& ranks);

}  // namespace mx
