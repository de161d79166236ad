// gpt-oss (20b, 120b and any config of the same architecture): weight table and forward pass wiring.
// Every layer: RMSNorm -> fused qkv + YaRN RoPE -> attention with sinks (sliding window on even layers)
// -> o_proj -> add + RMSNorm -> router top-k -> MXFP4 experts -> residual add.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/kv_cache.h"
#include "io/generation_config.h"
#include "io/safetensors.h"
#include "model/dense_fp8.h"
#include "model/gpt_oss/gpt_oss_config.h"
#include "model/gpt_oss/gpt_oss_cost.h"
#include "model/gpt_oss/gpt_oss_shard.h"
#include "model/gpt_oss/gpt_oss_weights.h"
#include "model/load_options.h"
#include "model/model.h"
#include "model/model_shard.h"

namespace mx {

// gpt-oss's activation buffers for up to `max_tokens` tokens and `max_logit_rows` logit rows, in backend memory.
struct GptOssWorkspace : ModelWorkspace {
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
  TensorView logits_local;  // f32 [max_logit_rows, this rank's vocabulary] (tensor parallel only)
};

class GptOssModel : public Model {
 public:
  // Reads config.json (model_type "gpt_oss"), generation_config.json and the safetensors in `model_dir`.
  static Result<std::unique_ptr<GptOssModel>> load(const std::string& model_dir, Backend& backend,
                                                    const ModelLoadOptions& options = {});
  // From an open checkpoint (e.g. a synthetic one in memory); the model keeps it. With a `shard` of size > 1
  // the model is one tensor-parallel rank: it uploads and computes only its share (model_shard.h).
  static Result<std::unique_ptr<GptOssModel>> from_checkpoint(GptOssConfig config, GenerationConfig generation_config,
                                                              Checkpoint checkpoint, Backend& backend,
                                                              const ModelShard& shard = {},
                                                              const ModelLoadOptions& options = {});

  const GptOssConfig& config() const { return config_; }

  std::string family() const override { return "gpt_oss"; }
  const ModelDims& dims() const override { return dims_; }
  const GenerationConfig& generation_config() const override { return generation_config_; }
  Backend& backend() const override { return backend_; }
  int64_t device_weight_bytes() const override;
  const KvLayout& kv_layout() const override { return kv_layout_; }
  Result<std::unique_ptr<ModelWorkspace>> make_workspace(int64_t max_tokens, int64_t max_logit_rows) const override;
  Result<ForwardOutput> forward(const BatchView& batch, const KvCache& kv, ModelWorkspace& ws, TensorView logits,
                                const HiddenObserver* observer = nullptr) const override;
  const ModelCost& cost() const override { return cost_; }
  // What a draft model reads of the target (model/eagle3: EAGLE-3 embeds its input tokens with the target's
  // table and may propose over its lm_head), in backend memory: bf16 [V, H]; the lm_head fp8 with its f32 [V]
  // scale under --dense-dtype fp8 (else the scale is empty).
  const TensorView& embedding_table() const { return weights_.embed; }
  const TensorView& lm_head() const { return weights_.lm_head; }
  const TensorView& lm_head_scale() const { return weights_.lm_head_scale; }
  bool is_tensor_parallel_rank() const { return shard_.size > 1; }
  std::string parallel_summary() const override;

 private:
  GptOssModel(GptOssConfig config, Backend& backend, const ModelShard& shard, const GptOssShardPlan& plan);
  Status bind_checkpoint();
  Status upload();
  // The checkpoint's own FP8 weight `name` with its scales, or null where the checkpoint holds it in bf16.
  const Fp8Rows* checkpoint_fp8(const std::string& name) const;
  // Uploads a dense projection as options_.dense_dtype asks: bf16 (the host weight, or `fp8`, the
  // checkpoint's FP8 form, widened), or fp8 + per-row scales (`fp8` as it is, or the bf16 weight quantized).
  Status put_dense(const TensorView& host, const Fp8Rows* fp8, TensorView* weight, TensorView* scale);
  // out = x W^T (+ bias) through linear or linear_fp8, whichever the weight's dtype needs.
  Status dense(const TensorView& x, const TensorView& weight, const TensorView& scale, const TensorView& bias,
               TensorView out) const;
  // Rows [first * per_item, (first + count) * per_item) of t: a rank's items (heads, experts) of a tensor.
  static TensorView item_rows(const TensorView& t, int64_t first, int64_t count, int64_t per_item);
  // residual += the sum of every rank's partial rows x, then out = rms_norm(residual) * weight (a rank's
  // partial o_proj or expert rows; at TP 1 x is the whole).
  Status all_reduce_add_rms_norm(TensorView x, TensorView residual, const TensorView& weight, float eps, TensorView out) const;

  GptOssConfig config_;
  ModelDims dims_;
  KvLayout kv_layout_;
  GptOssCost cost_;
  GenerationConfig generation_config_;
  Backend& backend_;
  std::unique_ptr<Checkpoint> checkpoint_;      // owns the mmap the CPU backend reads weights from
  std::vector<std::vector<uint16_t>> host_fused_;  // fused qkv weights and biases (bf16) on the host
  std::vector<std::vector<uint8_t>> host_fp8_;     // fp8 dense weights and their scales on the host (the CPU
  std::vector<std::vector<float>> host_scales_;    // backend reads them in place)
  std::vector<std::vector<uint8_t>> host_expert_slices_;  // a rank's slices of the experts (the CPU backend
                                                         // reads them in place)
  std::map<std::string, Fp8Rows> checkpoint_fp8_;  // dense weights the checkpoint holds in FP8, by name
  std::vector<Buffer> device_weights_;
  GptOssWeights weights_;  // host views after binding, backend views after upload
  TensorView inv_freq_;    // f32 [head_dim / 2]
  float rope_scale_ = 1.0f;
  ModelShard shard_;
  ModelLoadOptions options_;
  GptOssShardPlan plan_;  // the whole model unless tensor parallel
};

}  // namespace mx
