// Declarative, strict weight loading: a model lists every tensor it expects (name, dtype, shape, where
// to put it); loading fails on a missing, unexpected, mistyped or mis-shaped tensor and names it.
#pragma once

#include <string>
#include <vector>

#include "core/tensor_view.h"
#include "io/safetensors.h"

namespace mx {

struct WeightSpec {
  std::string name;
  DType dtype;
  Shape shape;
  TensorView* destination;  // receives the host view (into the checkpoint's mmap)
};

// Resolves every spec against the checkpoint; every checkpoint tensor must be claimed by a spec or start
// with one of `skipped_prefixes` (parts of a checkpoint a model does not run, e.g. a vision tower).
Status bind_weights(const Checkpoint& checkpoint, const std::vector<WeightSpec>& specs,
                    const std::vector<std::string>& skipped_prefixes = {});

}  // namespace mx
