// Tensor parallel: one model split over `size` ranks (model_shard.h: heads, KV heads, experts and the
// lm_head's vocabulary split; the rest replicated), each rank on its own backend and its own thread, run by
// the engine as one Model. A forward pass runs every rank on the same batch at once; the ranks' partial sums
// meet in their communicator's collectives, and rank 0's hidden rows and logits are the model's.
//
// The KV cache the engine allocates holds every rank's layers one after another (rank r's at r x layers), so
// page tables, prefix caching and the memory plan need nothing new: each rank's layers are just narrower, and
// on CUDA each rank's layers live on its own device (device + r). Ranks other than 0 read the staged batch
// where rank 0's backend put it (host memory on the CPU; rank 0's device memory over peer access on CUDA).
//
// CUDA graphs: capturing on the model's backend (rank 0's, as the engine sees it) records every rank. Rank
// 0's stream is captured around the caller's whole body; each forward pass inside it captures every other
// rank's share on that rank's thread and stream, NCCL collectives included; replay launches rank 0's graph
// and then the others' from the calling thread, and waits for the others as an eager pass does.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "model/load_options.h"
#include "model/model.h"

namespace mx {

// `size` ranks of the model in `model_dir`: rank 0 on `backend` (which must outlive the model), ranks 1.. on
// backends the model makes from `options` and owns. size 1 is load_model itself. Clear errors for a size the
// model's shapes cannot split and for backends that cannot run ranks yet.
// Whether ranks can run on that backend (checked before anything is loaded).
Status check_tensor_parallel_backend(const BackendOptions& options, int size);

Result<std::unique_ptr<Model>> load_tensor_parallel_model(const std::string& model_dir, Backend& backend,
                                                          const BackendOptions& options, int size,
                                                          const ModelLoadOptions& load_options = {});

}  // namespace mx
