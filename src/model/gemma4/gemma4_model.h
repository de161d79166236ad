// Gemma-4 (26B-A4B and any config of the same architecture; ref-gemma4-mtp-spec.md 1.3-1.5 and 6): scaled
// embeddings; per layer: RMSNorm -> q|k|v projection -> per-head q/k norms (v weightless; on K=V full layers
// v is the raw k projection) -> RoPE (default on sliding layers, proportional partial on full layers) ->
// attention with scale 1.0 and no sinks -> o_proj -> norm, residual add; a dense GeGLU MLP beside the
// routed bf16 GeGLU experts, each branch normed, their sum normed and added; the residual times the layer
// scalar. Final norm, tied lm_head, logit soft-cap. Runs on backends with the Gemma-4 ops (CPU and CUDA).
// The norms between the blocks run as two fused ops per layer: gemma_attention_end (post-attention norm,
// residual add, both pre-feedforward norms) and gemma_layer_end (the branch norms, their sum's norm, the
// residual add, the layer scalar and the next layer's input norm).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/kv_cache.h"
#include "io/generation_config.h"
#include "io/safetensors.h"
#include "model/gemma4/gemma4_config.h"
#include "model/gemma4/gemma4_cost.h"
#include "model/gemma4/gemma4_shard.h"
#include "model/gemma4/gemma4_weights.h"
#include "model/model.h"
#include "model/model_shard.h"

namespace mx {

struct Gemma4Workspace : ModelWorkspace {
  std::vector<Buffer> buffers;
  TensorView residual;      // [T, H]
  TensorView normed;        // [T, H] input of the attention / dense MLP
  TensorView normed_moe;    // [T, H] input of the experts (pre_feedforward_layernorm_2)
  TensorView qkv;           // [T, widest layer's (n_q + 2 n_kv) * hd]
  TensorView q;             // [T, n_q * widest hd]
  TensorView attn;          // [T, n_q * widest hd]
  TensorView proj;          // [T, H] o_proj out; then the dense branch
  TensorView moe_out;       // [T, H]
  TensorView gate_up;       // [T, 2I] dense MLP: gate | up projections
  TensorView mlp_act;       // [T, I] dense MLP: gelu_tanh(gate) * up
  TensorView router_logits; // f32 [T, E]
  TensorView topk_ids;      // i32 [T, k]
  TensorView topk_weights;  // f32 [T, k]
  TensorView gathered;      // [R, H]
  TensorView logits_local;  // f32 [R, this rank's vocabulary] (tensor parallel only)
};

class Gemma4Model : public Model {
 public:
  // With a `shard` of size > 1 the model is one tensor-parallel rank: it uploads and computes only its share
  // (gemma4_shard.h).
  static Result<std::unique_ptr<Gemma4Model>> from_checkpoint(Gemma4Config config, GenerationConfig generation_config,
                                                              Checkpoint checkpoint, Backend& backend,
                                                              const ModelShard& shard = {});

  const Gemma4Config& config() const { return config_; }
  std::string family() const override { return "gemma4"; }
  const ModelDims& dims() const override { return dims_; }
  const GenerationConfig& generation_config() const override { return generation_config_; }
  Backend& backend() const override { return backend_; }
  int64_t device_weight_bytes() const override;
  const KvLayout& kv_layout() const override { return kv_layout_; }
  Result<std::unique_ptr<ModelWorkspace>> make_workspace(int64_t max_tokens, int64_t max_logit_rows) const override;
  Result<ForwardOutput> forward(const BatchView& batch, const KvCache& kv, ModelWorkspace& ws, TensorView logits,
                                const HiddenObserver* observer = nullptr) const override;
  const ModelCost& cost() const override { return cost_; }
  // What a draft model reads of the target (model/draft_model.h; the MTP assistant embeds its input tokens with
  // the target's table, scaled as the target scales it): the embedding table bf16 [V, H] and sqrt(H) f32 [1], in
  // backend memory.
  const TensorView& embedding_table() const { return weights_.embed; }
  const TensorView& embedding_scale() const { return embed_scale_; }
  bool is_tensor_parallel_rank() const { return shard_.size > 1; }

 private:
  Gemma4Model(Gemma4Config config, Backend& backend, const ModelShard& shard, Gemma4ShardPlan plan);
  Status upload();
  // The rank's share of each split weight, as host views of copies kept in host_copies_ (unsplit: as is).
  Status slice_for_rank();
  // x <- the sum over ranks (tensor parallel), else nothing.
  Status all_reduce(TensorView x) const;
  Result<TensorView> upload_host_f32(const std::vector<float>& values);

  Gemma4Config config_;
  ModelDims dims_;
  KvLayout kv_layout_;
  Gemma4Cost cost_;
  GenerationConfig generation_config_;
  Backend& backend_;
  ModelShard shard_;
  Gemma4ShardPlan plan_;  // the whole model unless tensor parallel
  std::unique_ptr<Checkpoint> checkpoint_;
  std::vector<std::vector<uint16_t>> host_copies_;  // fused q|k|v weights and the rank's slices (bf16) on the host
  std::vector<Buffer> device_weights_;
  Gemma4Weights weights_;
  std::vector<TensorView> qkv_weight_;     // per layer [(n_q + 2 n_kv) hd, H]; K=V layers repeat k rows
  std::vector<TensorView> mlp_gate_up_;    // per layer [2 I, H]: the dense MLP's gate rows, then its up rows
  TensorView lm_head_;                     // the rank's rows of the tied embedding (tensor parallel only)
  std::vector<TensorView> router_weight_;   // per layer bf16 [E, H]: the checkpoint's proj.weight
  std::vector<TensorView> router_x_scale_;  // per layer f32 [H]: router.scale * H^-1/2
  TensorView sliding_inv_freq_, full_inv_freq_;  // f32 [hd / 2]
  TensorView embed_scale_;                       // f32 [1]: sqrt(H)
};

// RoPE inverse frequencies for one layer type: theta^(-2i/hd) for the first
// int(partial_rotary_factor * hd / 2) pairs, 0 (no rotation) for the rest.
std::vector<float> gemma4_inv_freq(const Gemma4Rope& rope, int64_t head_dim);

}  // namespace mx
