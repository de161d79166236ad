// The family-independent half of synthetic checkpoints (model/synthetic_model.h): seeded random tensors from
// a model's weight table, written as Hugging Face sharded safetensors (model-0000i-of-0000n.safetensors +
// model.safetensors.index.json) or into anonymous memory as one file's bytes. A family supplies its tensor list,
// how each tensor is filled, and its config files.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/synthetic_model.h"
#include "model/weight_loader.h"

namespace mx {

// How one tensor's elements are made. Counter-based: element i of the tensor at index t of the list depends
// only on (seed, t, i), so any thread may make any chunk and the bytes are the same.
struct SyntheticFill {
  enum class Kind { kNormal, kRandomBytes, kConstantByte };
  Kind kind = Kind::kNormal;
  float mean = 0, stddev = 1;  // kNormal: bf16 values mean + stddev * z, z ~ N(0, 1) (a 4-uniform sum)
  uint8_t byte = 0;            // kConstantByte
};
using SyntheticFillRule = std::function<SyntheticFill(const WeightSpec&)>;

// config.json and generation_config.json as the family writes them.
struct SyntheticConfigFiles {
  std::string config_json;
  std::string generation_config_json;
};

// Writes the config files and the tensors of `specs` (in order) into `dir`, created if missing; a shard
// closes once it passes options.max_shard_bytes. Same seed, same bytes.
Status write_synthetic_checkpoint(const std::vector<WeightSpec>& specs, const SyntheticFillRule& rule,
                                  const SyntheticConfigFiles& files, const std::string& dir,
                                  const SyntheticOptions& options);

// The same tensors (same seed, same bytes) as one shard's bytes in anonymous memory (huge pages where given).
Result<Checkpoint> synthetic_tensors_in_memory(const std::vector<WeightSpec>& specs, const SyntheticFillRule& rule,
                                               const SyntheticOptions& options);

// The bytes `specs` take in a checkpoint (the index's total_size).
int64_t synthetic_total_bytes(const std::vector<WeightSpec>& specs);

// Writes `text` to `path`, replacing it.
Status write_text_file(const std::string& path, const std::string& text);

}  // namespace mx
