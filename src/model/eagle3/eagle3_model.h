// The EAGLE-3 draft model (issue 16 item 2(b)): one Llama-style decoder layer over the target's fused
// hidden states, on Backend ops (CPU fp32 reference and CUDA). The math, as SGLang's llama_eagle3.py and
// vLLM's run the published checkpoints:
//   h      = fc([low | mid | high])              the target's residual streams at three layers
//                                                 (eagle3_config.h says which), each [Ht]; or, on a chain
//                                                 step, the previous draft step's pre-norm output g
//   x      = [input_layernorm(embed(t)) | hidden_norm(h)]    [2H]; embed is the TARGET's token embedding
//                                                 unless the draft ships embed_tokens
//   r      = h + o_proj(attention(RoPE(q(x)), RoPE(k(x)), v(x)))   causal, full attention, no sinks, over
//                                                 the draft's own KV
//   g      = r + down(silu(gate(post_attention_layernorm(r))) * up(...))
//   logits = lm_head(norm(g)) over the draft vocabulary; draft token = argmax, target id = d + d2t[d]
// A row at position p pairs the target's hidden state at p (which predicted token p + 1) with the embedding
// of token p + 1, writes the draft's K/V at p and predicts token p + 2. The draft's KV therefore holds one
// entry per target position, and its chain steps (g and the previous draft token, positions n, n + 1, ...)
// write entries past the target's that the next extend over the verified tokens overwrites (how the KV is
// paged and rolled back: eagle3_drafter.h).
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/kv_cache.h"
#include "io/safetensors.h"
#include "model/eagle3/eagle3_config.h"
#include "model/eagle3/eagle3_weights.h"

namespace mx {

// What the draft takes from its target: sizes, and the token embedding and lm_head in backend memory (used
// when the draft checkpoint has none of its own).
struct Eagle3Target {
  int64_t num_layers = 0, hidden_size = 0, vocab_size = 0;
  TensorView embed;          // bf16 [V, Ht]
  TensorView lm_head;        // bf16 (or fp8 e4m3 with lm_head_scale) [V, Ht]
  TensorView lm_head_scale;  // f32 [V] with an fp8 lm_head, else empty
};

// Activation buffers for up to `max_tokens` draft rows and `max_seqs` logit rows, in backend memory.
struct Eagle3Workspace {
  std::vector<Buffer> buffers;
  int64_t max_tokens = 0, max_seqs = 0;
  // The target's residual streams at the three capture layers for one target step: [3, max_tokens, Ht]
  // (residual dtype), slot j = layer aux_indices()[j], row = the target batch's row.
  TensorView captured;
  TensorView fused_in;       // [max_tokens, 3 Ht] residual dtype: the gathered captures, low|mid|high
  TensorView fused_in_act;   // [max_tokens, 3 Ht] activation dtype (fc's operand; the CPU reads fused_in)
  TensorView residual;       // [max_tokens, H] residual dtype: h, then r, then g
  TensorView embedded;       // [max_tokens, H] residual dtype
  // The layer's input halves before concatenation: rows [0, max_tokens) the normed embeddings, rows
  // [max_tokens, 2 max_tokens) the normed hidden states; concat_rows (i32 [2 max_tokens]: t, max_tokens + t
  // interleaved) gathers them into x.
  TensorView halves;
  TensorView concat_rows;
  TensorView x;              // [max_tokens, 2H]
  TensorView qkv;            // [max_tokens, (n_q + 2 n_kv) hd]
  TensorView q, attn;        // [max_tokens, n_q hd]
  TensorView proj;           // [max_tokens, H] o_proj and down outputs
  TensorView normed;         // [max_tokens, H]
  TensorView gate, up;       // [max_tokens, I] (silu(gate) * up lands in gate)
  TensorView gathered;       // [max_seqs, H] normed rows that need logits
  TensorView next_hidden;    // [max_seqs, H] residual dtype: g of the logit rows (the chain's next h)
  TensorView logits;         // f32 [max_seqs, Vd]
  TensorView sample_params;  // u8 [max_seqs, sizeof(SampleRowParams)]: greedy rows
  TensorView draft_ids;      // i32 [max_seqs] draft-vocabulary ids of the logit rows
};

class Eagle3Model {
 public:
  static Result<std::unique_ptr<Eagle3Model>> load(const std::string& model_dir, Backend& backend,
                                                    const Eagle3Target& target);
  // From an open checkpoint (e.g. a synthetic one in memory); the model keeps it.
  static Result<std::unique_ptr<Eagle3Model>> from_checkpoint(Eagle3Config config, Checkpoint checkpoint,
                                                              Backend& backend, const Eagle3Target& target);

  const Eagle3Config& config() const { return config_; }
  Backend& backend() const { return backend_; }
  // HiddenObserver indices of the target's residual streams fc fuses (low, mid, high).
  const std::array<int64_t, 3>& aux_indices() const { return aux_indices_; }
  // The draft layer's KV geometry (full attention).
  KvLayerSpec kv_spec() const { return {config_.num_kv_heads, config_.head_dim, 0, false}; }
  int64_t device_weight_bytes() const;

  Result<std::unique_ptr<Eagle3Workspace>> make_workspace(int64_t max_tokens, int64_t max_seqs) const;
  // ws.residual rows [0, rows) = fc(low | mid | high) of each row: captured_rows i32 [3 rows] holds, at
  // 3 t + j, the row of ws.captured (as [3 max_tokens, Ht]: slot j's rows from j * max_tokens) of draft row
  // t's capture j.
  Status fuse_captured(const TensorView& captured_rows, Eagle3Workspace& ws) const;
  // ws.residual rows [0, rows) = ws.next_hidden rows [0, rows) (a chain step's input).
  Status continue_chain(int64_t rows, Eagle3Workspace& ws) const;
  // Runs the layer over `batch` (its token ids are each row's next token, embedded; its hidden input is in
  // ws.residual), writing the draft KV at every row's position through the batch's page table 0; for the
  // batch's logit rows leaves the greedy draft ids in ws.draft_ids and g in ws.next_hidden. With
  // `draft_vocabulary` the token ids are draft-vocabulary ids (a chain pass fed the previous pass's drafts
  // as they are, with no round trip through the host to map them), else target ids.
  Status forward(const BatchView& batch, const KvLayerView& kv, Eagle3Workspace& ws, bool draft_vocabulary = false) const;
  // The target vocabulary's id of a draft-vocabulary id (d2t), or -1 outside the draft vocabulary.
  int32_t target_id(int32_t draft_id) const;

 private:
  Eagle3Model(Eagle3Config config, Backend& backend) : config_(std::move(config)), backend_(backend) {}
  Status bind_and_check(const Eagle3Target& target);
  Status upload(const Eagle3Target& target);

  Eagle3Config config_;
  Backend& backend_;
  std::array<int64_t, 3> aux_indices_{};
  std::unique_ptr<Checkpoint> checkpoint_;  // owns the mmap the CPU backend reads weights from
  std::vector<uint16_t> host_qkv_;          // q|k|v fused (bf16) on the host
  std::vector<Buffer> device_weights_;
  Eagle3Weights weights_;                   // host views after binding, backend views after upload
  TensorView lm_head_scale_;                // f32 [Vd] when the target's fp8 lm_head is used
  std::vector<int32_t> draft_to_target_;    // [Vd]
  // [Vd, H] activation dtype: row d = the embedding of target_id(d) (built with the embedding op at load;
  // 184 MB for the published gpt-oss drafts), so a chain pass embeds draft ids directly.
  TensorView draft_embed_;
  TensorView inv_freq_;                     // f32 [head_dim / 2]
  float rope_scale_ = 1.0f;
};

}  // namespace mx
