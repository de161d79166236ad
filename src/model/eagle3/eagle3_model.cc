#include "model/eagle3/eagle3_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/rope.h"
#include "model/weight_loader.h"

namespace mx {

Result<std::unique_ptr<Eagle3Model>> Eagle3Model::load(const std::string& model_dir, Backend& backend,
                                                       const Eagle3Target& target) {
  MX_ASSIGN_OR_RETURN(Eagle3Config config, load_eagle3_config(model_dir));
  MX_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::open_dir(model_dir));
  auto model = from_checkpoint(std::move(config), std::move(checkpoint), backend, target);
  if (!model.is_ok()) return model.status().with_context(model_dir);
  return model;
}

Result<std::unique_ptr<Eagle3Model>> Eagle3Model::from_checkpoint(Eagle3Config config, Checkpoint checkpoint,
                                                                  Backend& backend, const Eagle3Target& target) {
  std::unique_ptr<Eagle3Model> model(new Eagle3Model(std::move(config), backend));
  model->checkpoint_ = std::make_unique<Checkpoint>(std::move(checkpoint));
  MX_RETURN_IF_ERROR(model->bind_and_check(target));
  MX_RETURN_IF_ERROR(model->upload(target));
  return model;
}

// Binds the tensors and checks the draft against its target: the vocabulary, the captured width, the
// borrowed embedding / lm_head widths, and the draft-to-target map (in range; t2d, when present, marks
// exactly d2t's image).
Status Eagle3Model::bind_and_check(const Eagle3Target& target) {
  const Eagle3Config& c = config_;
  MX_ASSIGN_OR_RETURN(aux_indices_, eagle3_aux_hidden_indices(c, target.num_layers));
  if (c.vocab_size != target.vocab_size)
    return invalid_argument("EAGLE-3 draft vocab_size " + std::to_string(c.vocab_size) + " differs from the target's " +
                            std::to_string(target.vocab_size));
  if (c.target_hidden_size != target.hidden_size)
    return invalid_argument("EAGLE-3 draft target_hidden_size " + std::to_string(c.target_hidden_size) +
                            " differs from the target's hidden size " + std::to_string(target.hidden_size));
  const Eagle3OptionalTensors present = Eagle3OptionalTensors::in(*checkpoint_);
  MX_RETURN_IF_ERROR(bind_weights(*checkpoint_, eagle3_weight_specs(c, present, weights_)));
  if ((!present.embed || c.lm_head_from_target) && c.hidden_size != target.hidden_size)
    return invalid_argument("EAGLE-3 draft hidden_size " + std::to_string(c.hidden_size) +
                            " must equal the target's " + std::to_string(target.hidden_size) +
                            " to use the target's embedding or lm_head");
  if (!c.lm_head_from_target && !present.lm_head)
    return invalid_argument("EAGLE-3 draft: missing tensor 'lm_head.weight' (config.json names a draft_vocab_size)");
  if (!present.d2t && c.draft_vocab_size != c.vocab_size)
    return invalid_argument("EAGLE-3 draft: missing tensor 'd2t' (the draft vocabulary is smaller than the target's)");

  draft_to_target_.resize(static_cast<size_t>(c.draft_vocab_size));
  for (int64_t d = 0; d < c.draft_vocab_size; ++d) {
    const int64_t t = d + (present.d2t ? weights_.d2t.ptr<const int64_t>()[d] : 0);
    if (t < 0 || t >= c.vocab_size)
      return invalid_argument("EAGLE-3 draft: d2t maps draft id " + std::to_string(d) + " to target id " +
                              std::to_string(t) + ", outside the vocabulary of " + std::to_string(c.vocab_size));
    draft_to_target_[static_cast<size_t>(d)] = static_cast<int32_t>(t);
  }
  if (present.t2d) {
    std::vector<uint8_t> image(static_cast<size_t>(c.vocab_size), 0);
    for (int32_t t : draft_to_target_) image[static_cast<size_t>(t)] = 1;
    const auto* mask = weights_.t2d.ptr<const uint8_t>();
    for (int64_t t = 0; t < c.vocab_size; ++t)
      if ((mask[t] != 0) != (image[static_cast<size_t>(t)] != 0))
        return invalid_argument("EAGLE-3 draft: t2d and d2t disagree at target id " + std::to_string(t));
  }
  return Status::ok();
}

Status Eagle3Model::upload(const Eagle3Target& target) {
  const Eagle3Config& c = config_;
  Eagle3Weights& w = weights_;
  auto put = [&](TensorView* t) -> Status {
    MX_ASSIGN_OR_RETURN(*t, backend_.upload_weight(*t, &device_weights_));
    return Status::ok();
  };
  // q, k and v run as one projection (one weight read, one launch).
  for (const TensorView* part : {&w.q_weight, &w.k_weight, &w.v_weight}) {
    const auto* src = part->ptr<const uint16_t>();
    host_qkv_.insert(host_qkv_.end(), src, src + part->numel());
  }
  w.qkv_weight = TensorView(host_qkv_.data(), DType::kBF16, {c.q_dim() + 2 * c.kv_dim(), 2 * c.hidden_size});
  for (TensorView* t : {&w.input_norm, &w.hidden_norm, &w.qkv_weight, &w.o_weight, &w.post_attention_norm,
                        &w.gate_weight, &w.up_weight, &w.down_weight, &w.fc, &w.final_norm})
    MX_RETURN_IF_ERROR(put(t));
  if (w.embed.empty()) w.embed = target.embed;
  else MX_RETURN_IF_ERROR(put(&w.embed));
  if (c.lm_head_from_target) {
    w.lm_head = target.lm_head;
    lm_head_scale_ = target.lm_head_scale;
  } else {
    MX_RETURN_IF_ERROR(put(&w.lm_head));
  }

  // The draft vocabulary's embeddings: the embedding op gathers the rows of d2t's target ids.
  const auto Vd = static_cast<int64_t>(draft_to_target_.size());
  MX_ASSIGN_OR_RETURN(Buffer ids, backend_.allocate(Vd * 4));
  const TensorView id_view = ids.view(DType::kI32, {Vd});
  MX_RETURN_IF_ERROR(backend_.copy_from_host(id_view, draft_to_target_.data()));
  const DType act = backend_.activation_dtype();
  MX_ASSIGN_OR_RETURN(Buffer table, backend_.allocate(dtype_bytes(act, Vd * c.hidden_size)));
  draft_embed_ = table.view(act, {Vd, c.hidden_size});
  MX_RETURN_IF_ERROR(backend_.embedding(w.embed, id_view, draft_embed_));
  MX_RETURN_IF_ERROR(backend_.synchronize());  // `ids` goes when this returns
  device_weights_.push_back(std::move(table));

  const RopeTables rope = compute_yarn_rope(c.rope, c.head_dim);
  rope_scale_ = rope.attention_scale;
  MX_ASSIGN_OR_RETURN(Buffer freq, backend_.allocate(static_cast<int64_t>(rope.inv_freq.size() * sizeof(float))));
  inv_freq_ = freq.view(DType::kF32, {static_cast<int64_t>(rope.inv_freq.size())});
  MX_RETURN_IF_ERROR(backend_.copy_from_host(inv_freq_, rope.inv_freq.data()));
  device_weights_.push_back(std::move(freq));
  return Status::ok();
}

int64_t Eagle3Model::device_weight_bytes() const {
  int64_t total = 0;
  for (const Buffer& b : device_weights_) total += b.bytes();
  return total;
}

int32_t Eagle3Model::target_id(int32_t draft_id) const {
  if (draft_id < 0 || draft_id >= static_cast<int32_t>(draft_to_target_.size())) return -1;
  return draft_to_target_[static_cast<size_t>(draft_id)];
}

Result<std::unique_ptr<Eagle3Workspace>> Eagle3Model::make_workspace(int64_t max_tokens, int64_t max_seqs) const {
  const Eagle3Config& c = config_;
  if (max_tokens < 1 || max_seqs < 1) return invalid_argument("EAGLE-3 workspace needs at least one row");
  auto ws = std::make_unique<Eagle3Workspace>();
  ws->max_tokens = max_tokens;
  ws->max_seqs = max_seqs;
  const DType act = backend_.activation_dtype(), res = backend_.residual_dtype();
  auto make = [&](DType dtype, Shape shape) -> Result<TensorView> {
    MX_ASSIGN_OR_RETURN(Buffer b, backend_.allocate(dtype_bytes(dtype, shape.numel())));
    TensorView v = b.view(dtype, shape);
    ws->buffers.push_back(std::move(b));
    return v;
  };
  const int64_t T = max_tokens, S = max_seqs, H = c.hidden_size, Ht = c.target_hidden_size;
  MX_RETURN_IF_ERROR(backend_.prepare(WorkspaceSpec{T, H, 0, 0, 0, c.num_heads, c.num_kv_heads, c.head_dim, S,
                                                    c.draft_vocab_size}));
  MX_ASSIGN_OR_RETURN(ws->captured, make(res, {3, T, Ht}));
  MX_ASSIGN_OR_RETURN(ws->fused_in, make(res, {T, 3 * Ht}));
  if (act != res) {
    MX_ASSIGN_OR_RETURN(ws->fused_in_act, make(act, {T, 3 * Ht}));
  } else {
    ws->fused_in_act = ws->fused_in;
  }
  MX_ASSIGN_OR_RETURN(ws->residual, make(res, {T, H}));
  MX_ASSIGN_OR_RETURN(ws->embedded, make(res, {T, H}));
  MX_ASSIGN_OR_RETURN(ws->halves, make(act, {2 * T, H}));
  MX_ASSIGN_OR_RETURN(ws->concat_rows, make(DType::kI32, {2 * T}));
  MX_ASSIGN_OR_RETURN(ws->x, make(act, {T, 2 * H}));
  MX_ASSIGN_OR_RETURN(ws->qkv, make(act, {T, c.q_dim() + 2 * c.kv_dim()}));
  MX_ASSIGN_OR_RETURN(ws->q, make(act, {T, c.q_dim()}));
  MX_ASSIGN_OR_RETURN(ws->attn, make(act, {T, c.q_dim()}));
  MX_ASSIGN_OR_RETURN(ws->proj, make(act, {T, H}));
  MX_ASSIGN_OR_RETURN(ws->normed, make(act, {T, H}));
  MX_ASSIGN_OR_RETURN(ws->gate, make(act, {T, c.intermediate_size}));
  MX_ASSIGN_OR_RETURN(ws->up, make(act, {T, c.intermediate_size}));
  MX_ASSIGN_OR_RETURN(ws->gathered, make(act, {S, H}));
  MX_ASSIGN_OR_RETURN(ws->next_hidden, make(res, {S, H}));
  MX_ASSIGN_OR_RETURN(ws->logits, make(DType::kF32, {S, c.draft_vocab_size}));
  MX_ASSIGN_OR_RETURN(ws->sample_params, make(DType::kU8, {S, static_cast<int64_t>(sizeof(SampleRowParams))}));
  MX_ASSIGN_OR_RETURN(ws->draft_ids, make(DType::kI32, {S}));

  std::vector<int32_t> concat(static_cast<size_t>(2 * T));
  for (int64_t t = 0; t < T; ++t) {
    concat[static_cast<size_t>(2 * t)] = static_cast<int32_t>(t);
    concat[static_cast<size_t>(2 * t + 1)] = static_cast<int32_t>(T + t);
  }
  MX_RETURN_IF_ERROR(backend_.copy_from_host(ws->concat_rows, concat.data()));
  const std::vector<SampleRowParams> greedy(static_cast<size_t>(S));  // temperature 0
  MX_RETURN_IF_ERROR(backend_.copy_from_host(ws->sample_params, greedy.data()));
  return ws;
}

Status Eagle3Model::fuse_captured(const TensorView& captured_rows, Eagle3Workspace& ws) const {
  const int64_t rows = captured_rows.numel() / 3;
  if (rows < 1 || rows > ws.max_tokens || captured_rows.numel() != 3 * rows)
    return invalid_argument("EAGLE-3 fuse: row count outside the workspace");
  const int64_t Ht = config_.target_hidden_size;
  // The captures as [3 max_tokens, Ht] rows; 3 gathered rows per draft row are its [3 Ht] input.
  const TensorView slots = ws.captured.reshaped({3 * ws.max_tokens, Ht});
  MX_RETURN_IF_ERROR(backend_.gather_rows(slots, captured_rows,
                                          ws.fused_in.rows(0, rows).reshaped({3 * rows, Ht})));
  if (ws.fused_in_act.data() != ws.fused_in.data())
    MX_RETURN_IF_ERROR(backend_.convert(ws.fused_in.rows(0, rows), ws.fused_in_act.rows(0, rows)));
  return backend_.linear(ws.fused_in_act.rows(0, rows), weights_.fc, TensorView(), ws.residual.rows(0, rows));
}

Status Eagle3Model::continue_chain(int64_t rows, Eagle3Workspace& ws) const {
  if (rows < 1 || rows > ws.max_seqs) return invalid_argument("EAGLE-3 chain: row count outside the workspace");
  return backend_.copy(ws.residual.rows(0, rows), ws.next_hidden.rows(0, rows));
}

Status Eagle3Model::forward(const BatchView& batch, const KvLayerView& kv, Eagle3Workspace& ws,
                            bool draft_vocabulary) const {
  const Eagle3Config& c = config_;
  const int64_t T = batch.num_tokens, R = batch.num_logit_rows, H = c.hidden_size;
  if (T < 1 || T > ws.max_tokens || R > ws.max_seqs)
    return invalid_argument("EAGLE-3 batch of " + std::to_string(T) + " rows / " + std::to_string(R) +
                            " logit rows exceeds the workspace");
  Backend& b = backend_;
  const float eps = static_cast<float>(c.rms_norm_eps);
  TensorView residual = ws.residual.rows(0, T), normed = ws.normed.rows(0, T), proj = ws.proj.rows(0, T);

  // x = [input_layernorm(embed(t)) | hidden_norm(h)]: the two norms land in row blocks of `halves`, one
  // gather interleaves them into rows of 2H.
  MX_RETURN_IF_ERROR(b.embedding(draft_vocabulary ? draft_embed_ : weights_.embed, batch.token_ids, ws.embedded.rows(0, T)));
  MX_RETURN_IF_ERROR(b.rms_norm(ws.embedded.rows(0, T), weights_.input_norm, eps, ws.halves.rows(0, T)));
  MX_RETURN_IF_ERROR(b.rms_norm(residual, weights_.hidden_norm, eps, ws.halves.rows(ws.max_tokens, ws.max_tokens + T)));
  TensorView x = ws.x.rows(0, T);
  MX_RETURN_IF_ERROR(b.gather_rows(ws.halves, ws.concat_rows.rows(0, 2 * T), x.reshaped({2 * T, H})));

  MX_RETURN_IF_ERROR(b.linear(x, weights_.qkv_weight, TensorView(), ws.qkv.rows(0, T)));
  QkvRopeParams rope{ws.qkv.rows(0, T), ws.q.rows(0, T), kv, inv_freq_, rope_scale_, c.num_heads, c.num_kv_heads,
                     c.head_dim, TensorView(), TensorView(), 0.0f, TensorView()};  // no per-head norms, no prefetch
  MX_RETURN_IF_ERROR(b.qkv_rope(rope, batch));
  AttentionParams attn{ws.q.rows(0, T), kv, TensorView(), ws.attn.rows(0, T), c.num_heads, c.num_kv_heads,
                       c.head_dim, 0, static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)))};
  MX_RETURN_IF_ERROR(b.attention(attn, batch));
  MX_RETURN_IF_ERROR(b.linear(ws.attn.rows(0, T), weights_.o_weight, TensorView(), proj));
  MX_RETURN_IF_ERROR(b.add_rms_norm(residual, proj, weights_.post_attention_norm, eps, normed));

  TensorView gate = ws.gate.rows(0, T), up = ws.up.rows(0, T);
  MX_RETURN_IF_ERROR(b.linear(normed, weights_.gate_weight, TensorView(), gate));
  MX_RETURN_IF_ERROR(b.linear(normed, weights_.up_weight, TensorView(), up));
  MX_RETURN_IF_ERROR(b.silu_mul(gate, up, gate));
  MX_RETURN_IF_ERROR(b.linear(gate, weights_.down_weight, TensorView(), proj));
  MX_RETURN_IF_ERROR(b.add_rms_norm(residual, proj, weights_.final_norm, eps, normed));
  if (R == 0) return Status::ok();

  MX_RETURN_IF_ERROR(b.gather_rows(residual, batch.logit_rows, ws.next_hidden.rows(0, R)));
  TensorView gathered = ws.gathered.rows(0, R), logits = ws.logits.rows(0, R);
  MX_RETURN_IF_ERROR(b.gather_rows(normed, batch.logit_rows, gathered));
  if (lm_head_scale_.empty()) MX_RETURN_IF_ERROR(b.linear(gathered, weights_.lm_head, TensorView(), logits));
  else MX_RETURN_IF_ERROR(b.linear_fp8(gathered, weights_.lm_head, lm_head_scale_, TensorView(), logits));
  SampleParams sample;
  sample.logits = logits;
  sample.params = ws.sample_params.rows(0, R);
  sample.tokens = ws.draft_ids.rows(0, R);
  return b.sample(sample);
}

}  // namespace mx
