// Gemma-4's MTP drafter (ref-gemma4-mtp-spec.md 2.2) as a DraftModel (model/draft_model.h). One draft step for S
// sequences, each with a token t, a backbone-dim state s and the position p of t:
//   z = pre_projection([TargetEmbed[t] * sqrt(Hb) | s])       the target's table, scaled once as the target does
//   per layer: Q-only attention (q_proj, per-head q_norm, RoPE at p) over the KV of the target's last layer of
//     the same type (keys 0 .. p - 1; sliding layers the last `sliding_window` of them), scale 1, o_proj,
//     normed and added; a dense GeGLU MLP, normed and added; the residual times layer_scalar
//   y = norm(z); logits = y . AssistantEmbed^T (no soft-cap: argmax only); next t = argmax; next s = post_projection(y)
// Every step keeps the same p (transformers' SinglePositionMultiTokenCandidateGenerator: the drafter never walks
// forward) and writes no KV. The first step's s is the target's final-norm output at p - 1 (the row that produced
// t), later steps feed back post_projection. The window follows transformers' mask over the shared KV (a
// bidirectional window, |q - k| <= sliding_window, flipped to look back): the last sliding_window + 1 cached
// keys, two more than the target's own query at p sees (window_slack() is 2).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/draft_model.h"
#include "model/gemma4/gemma4_assistant_config.h"
#include "model/gemma4/gemma4_assistant_weights.h"
#include "model/gemma4/gemma4_model.h"

namespace mx {

struct Gemma4AssistantWorkspace : DraftWorkspace {
  std::vector<Buffer> buffers;
  TensorView embedded;   // [S, Hb] the target's embedding of the step's tokens, scaled
  TensorView state;      // [S, Hb] s: the target's hidden rows, then post_projection's output
  TensorView residual;   // [S, h] residual dtype
  TensorView normed;     // [S, h]
  TensorView state_proj; // [S, h] pre_projection's state half
  TensorView q, q_normed, q_roped, attn;  // [S, n_q widest hd]
  TensorView proj, branch;                // [S, h]
  TensorView gate, up;                    // [S, I]
  TensorView logits;                      // f32 [S, V]
  TensorView sample_params;               // u8 [S, sizeof(SampleRowParams)]: greedy rows
};

// Keys a sliding assistant layer sees beyond `sliding_window` (transformers' inclusive bidirectional window).
inline constexpr int64_t kSlidingKeysBeyondWindow = 1;

class Gemma4AssistantModel : public DraftModel {
 public:
  // `target` must outlive the assistant; the weights go to the target's backend.
  static Result<std::unique_ptr<Gemma4AssistantModel>> from_checkpoint(Gemma4AssistantConfig config, Checkpoint checkpoint,
                                                                       const Gemma4Model& target, const std::string& source);

  const Gemma4AssistantConfig& config() const { return config_; }
  std::string name() const override { return "gemma4_assistant"; }
  // The target's query at p keeps keys p - W + 1 .. p; this one reads p - W - 1 .. p - 1.
  int64_t window_slack() const override { return 1 + kSlidingKeysBeyondWindow; }
  Result<std::unique_ptr<DraftWorkspace>> make_workspace(int64_t max_seqs, int64_t max_target_tokens) const override;
  Status draft(const DraftBatch& batch, const KvCache& kv, DraftWorkspace& ws, int64_t num_drafts,
               TensorView drafts) const override;
  // One draft step on `tokens` (i32 [S]) from ws.state: fills ws.logits (f32 [S, V]) and ws.state with the next
  // step's state. draft() runs it num_drafts times; tests compare its logits with transformers'.
  Status step(const DraftBatch& batch, const KvCache& kv, Gemma4AssistantWorkspace& ws, const TensorView& tokens) const;
  // ws.state <- the target's hidden rows of the batch (the first step's state).
  Status load_target_state(const DraftBatch& batch, Gemma4AssistantWorkspace& ws) const;

 private:
  Gemma4AssistantModel(Gemma4AssistantConfig config, const Gemma4Model& target);
  Status upload();

  Gemma4AssistantConfig config_;
  const Gemma4Model& target_;
  Backend& backend_;
  std::unique_ptr<Checkpoint> checkpoint_;
  Gemma4AssistantWeights weights_;
  std::vector<std::vector<uint16_t>> host_copies_;
  std::vector<Buffer> device_weights_;
  TensorView pre_embedded_, pre_state_;  // bf16 [h, Hb] each: pre_projection's two column blocks
  TensorView sliding_inv_freq_, full_inv_freq_;
  std::vector<int64_t> source_layer_;    // per assistant layer: the target layer whose KV it reads
};

}  // namespace mx
