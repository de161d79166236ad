// gpt-oss (20b, 120b and any config of the same architecture): weight table and forward pass wiring.
// Every layer: RMSNorm -> fused qkv + YaRN RoPE -> attention with sinks (sliding window on even layers)
// -> o_proj -> add + RMSNorm -> router top-k -> MXFP4 experts -> residual add.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/kv_cache.h"
#include "io/gpt_oss_config.h"
#include "io/safetensors.h"
#include "model/gpt_oss_weights.h"

namespace mx {

// Activation buffers for up to `max_tokens` tokens and `max_logit_rows` logit rows, in backend memory.
struct ForwardWorkspace {
  int64_t max_tokens = 0;
  int64_t max_logit_rows = 0;
  std::vector<Buffer> buffers;
  TensorView residual;      // [max_tokens, H] the residual stream (backend residual_dtype)
  TensorView normed;        // [max_tokens, H] norm output feeding the next projection
  TensorView qkv;           // [max_tokens, (n_q + 2 n_kv) * head_dim]
  TensorView q;             // [max_tokens, n_q * head_dim]
  TensorView attn;          // [max_tokens, n_q * head_dim]
  TensorView proj;          // [max_tokens, H] o_proj and expert outputs
  TensorView router_logits; // f32 [max_tokens, E]
  TensorView topk_ids;      // i32 [max_tokens, k]
  TensorView topk_weights;  // f32 [max_tokens, k]
  TensorView gathered;      // [max_logit_rows, H] final-normed rows that need logits
};

// Called with index 0 for the embeddings, l for the residual stream after layer l-1 (1 <= l < L), and L for
// the final norm's output: the same indexing as transformers' hidden_states. Tests use it.
using HiddenObserver = std::function<void(int64_t index, const TensorView& hidden)>;

class GptOssModel {
 public:
  static Result<std::unique_ptr<GptOssModel>> load(const std::string& model_dir, Backend& backend);
  // From an open checkpoint (e.g. synthetic_checkpoint_in_memory); the model keeps it.
  static Result<std::unique_ptr<GptOssModel>> from_checkpoint(GptOssConfig config, GenerationConfig generation_config,
                                                              Checkpoint checkpoint, Backend& backend);

  const GptOssConfig& config() const { return config_; }
  const GenerationConfig& generation_config() const { return generation_config_; }
  Backend& backend() const { return backend_; }
  // Bytes of weights copied into backend memory (0 on the CPU, which reads the checkpoint's mmap).
  int64_t device_weight_bytes() const;
  KvCacheShape kv_cache_shape(int64_t num_pages, int64_t page_size) const;
  Result<ForwardWorkspace> make_workspace(int64_t max_tokens, int64_t max_logit_rows) const;

  // Runs one batch; writes f32 logits [R, vocab] for the batch's logit rows.
  Status forward(const BatchView& batch, const KvCache& kv, ForwardWorkspace& ws, TensorView logits,
                 const HiddenObserver* observer = nullptr) const;

 private:
  GptOssModel(GptOssConfig config, Backend& backend) : config_(std::move(config)), backend_(backend) {}
  Status upload();

  GptOssConfig config_;
  GenerationConfig generation_config_;
  Backend& backend_;
  std::unique_ptr<Checkpoint> checkpoint_;      // owns the mmap the CPU backend reads weights from
  std::vector<std::vector<uint16_t>> host_fused_;  // fused qkv weights and biases (bf16) on the host
  std::vector<Buffer> device_weights_;
  GptOssWeights weights_;  // host views after binding, backend views after upload
  TensorView inv_freq_;    // f32 [head_dim / 2]
  float rope_scale_ = 1.0f;
};

}  // namespace mx
