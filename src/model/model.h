// The Model interface: everything the runtime, the server and the tools know about a model family. A model
// is built from a checkpoint by the registry (model_registry.h, keyed on config.json's model_type /
// architectures) and says what it needs: its KV layout per layer (grouped into page pools), an activation
// workspace, and one call, `forward`, that runs a flattened batch (prefill, chunked prefill, decode, or
// several query rows per sequence for speculative verification) and returns the final hidden rows and the
// logits of the rows asked for. Families live in model/<family>/; nothing outside model/ names one.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/kv_cache.h"
#include "io/generation_config.h"
#include "model/model_cost.h"

namespace mx {

// Sizes the runtime and the server need from a model.
struct ModelDims {
  int64_t vocab_size = 0;   // rows of the logits (the lm_head's output size)
  int64_t hidden_size = 0;  // H: columns of the hidden rows forward returns
  int64_t num_layers = 0;
  int64_t context_len = 0;  // the model's own limit (max_position_embeddings)
};

// A model's activation buffers, sized once for up to `max_tokens` tokens and `max_logit_rows` logit rows
// (make_workspace), so a forward pass allocates nothing. Each family derives its own.
class ModelWorkspace {
 public:
  virtual ~ModelWorkspace() = default;
  int64_t max_tokens = 0;
  int64_t max_logit_rows = 0;
};

// What a forward pass leaves behind besides the logits: views into the workspace, valid until the next
// forward pass on it.
struct ForwardOutput {
  TensorView hidden;  // [T, H] the final norm's output for every token of the batch (drafters read it)
};

// Called with index 0 for the embeddings, l for the residual stream after layer l-1 (1 <= l < L), and L for
// the final norm's output: the same indexing as transformers' hidden_states. Tests use it.
using HiddenObserver = std::function<void(int64_t index, const TensorView& hidden)>;

class Model {
 public:
  virtual ~Model() = default;

  // The registry's name of the family ("gpt_oss"), for logs.
  virtual std::string family() const = 0;
  virtual const ModelDims& dims() const = 0;
  virtual const GenerationConfig& generation_config() const = 0;
  virtual Backend& backend() const = 0;
  // Bytes of weights copied into backend memory (0 on the CPU, which reads the checkpoint's mmap).
  virtual int64_t device_weight_bytes() const = 0;

  // Per layer: KV heads, head dim, window (0 = full), K/V shared; layers grouped by identical geometry
  // and window, one page pool per group.
  virtual const KvLayout& kv_layout() const = 0;
  virtual Result<std::unique_ptr<ModelWorkspace>> make_workspace(int64_t max_tokens, int64_t max_logit_rows) const = 0;
  // The KV cache for kv_layout() with `shape`'s pages; on backend() unless the model spreads its layers
  // (tensor parallel: each rank's on its own device).
  virtual Result<KvCache> allocate_kv_cache(const KvCacheShape& shape) const { return KvCache::allocate(backend(), shape); }
  // Devices the KV layers are spread over evenly (tensor parallel on CUDA: one per rank); the device memory
  // plan is made for one of them.
  virtual int64_t kv_devices() const { return 1; }
  // What this model holds of a tensor-parallel split (a rank: its share; the split model: every rank's), for
  // the start-up log; empty when not split.
  virtual std::string parallel_summary() const { return {}; }
  // Runs one batch: writes f32 logits [R, vocab] for the batch's logit rows and returns the final hidden rows
  // [T, H]. `kv` must be laid out as kv_layout() says; `ws` must come from this model's make_workspace.
  virtual Result<ForwardOutput> forward(const BatchView& batch, const KvCache& kv, ModelWorkspace& ws, TensorView logits,
                                        const HiddenObserver* observer = nullptr) const = 0;

  // Bytes and FLOPs a step must move and compute at least (benchmark floors).
  virtual const ModelCost& cost() const = 0;
};

}  // namespace mx
