// A tensor-parallel rank's share of a model (model/tensor_parallel_model.h): attention heads and KV heads
// split evenly, experts split evenly (expert parallel), the vocabulary of the lm_head split as evenly as it
// goes; everything else replicated. The rank's partial sums (o_proj, experts) meet in an all-reduce and its
// logits columns in an all-gather through `comm`.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "backend/communicator.h"
#include "core/status.h"

namespace mx {

struct ModelShard {
  int rank = 0;
  int size = 1;                   // 1: the whole model, no communicator
  Communicator* comm = nullptr;
  int64_t kv_layer_offset = 0;    // the rank's layers start here in the KV cache all ranks share
};

// [begin, end) of `rank`'s share of `n` items: the first n % size ranks get one more (as the communicators'
// all-gather expects).
inline std::pair<int64_t, int64_t> shard_range(int64_t n, int rank, int size) { return split_range(n, rank, size); }

// `what` (e.g. "KV heads") must split evenly over the ranks, or a clear error names the sizes that work.
inline Status check_even_split(const char* what, int64_t n, int size) {
  if (size >= 1 && n % size == 0) return Status::ok();
  return invalid_argument("tensor parallel size " + std::to_string(size) + " does not divide the model's " +
                          std::to_string(n) + " " + what);
}

}  // namespace mx
