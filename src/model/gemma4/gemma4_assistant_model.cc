#include "model/gemma4/gemma4_assistant_model.h"

#include <algorithm>
#include <cmath>

#include "model/gemma4/gemma4_shard.h"

namespace mx {

Gemma4AssistantModel::Gemma4AssistantModel(Gemma4AssistantConfig config, const Gemma4Model& target)
    : config_(std::move(config)), target_(target), backend_(target.backend()) {
  // Each layer reads the KV of the target's last layer of its type (SGLang's and vLLM's mapping; transformers
  // passes those layers' K/V as shared_kv_states).
  const std::vector<bool>& target_sliding = target.config().layer_is_sliding;
  for (bool sliding : config_.layer_is_sliding) {
    int64_t last = -1;
    for (size_t m = 0; m < target_sliding.size(); ++m)
      if (target_sliding[m] == sliding) last = static_cast<int64_t>(m);
    source_layer_.push_back(last);
  }
}

Result<std::unique_ptr<Gemma4AssistantModel>> Gemma4AssistantModel::from_checkpoint(Gemma4AssistantConfig config,
                                                                                     Checkpoint checkpoint,
                                                                                     const Gemma4Model& target,
                                                                                     const std::string& source) {
  if (target.is_tensor_parallel_rank())
    return unimplemented(source + ": MTP drafting under tensor parallelism is not supported");
  MX_RETURN_IF_ERROR(check_assistant_fits_target(config, target.config(), source));
  std::unique_ptr<Gemma4AssistantModel> m(new Gemma4AssistantModel(std::move(config), target));
  m->checkpoint_ = std::make_unique<Checkpoint>(std::move(checkpoint));
  MX_RETURN_IF_ERROR(bind_weights(*m->checkpoint_, gemma4_assistant_weight_specs(m->config_, m->weights_))
                         .with_context(source + " (its checkpoint)"));
  MX_RETURN_IF_ERROR(m->upload());
  return m;
}

Status Gemma4AssistantModel::upload() {
  const Gemma4AssistantConfig& c = config_;
  const int64_t h = c.hidden_size, Hb = c.backbone_hidden_size;
  // pre_projection's input is [embedding | state]: its two column blocks become two products summed into the
  // residual, so the concatenation is never built.
  for (int64_t half = 0; half < 2; ++half) {
    std::vector<uint16_t> block;
    append_bf16_block(weights_.pre_projection.ptr<const uint16_t>(), 2 * Hb, 0, h, half * Hb, (half + 1) * Hb, &block);
    host_copies_.push_back(std::move(block));
    (half == 0 ? pre_embedded_ : pre_state_) = TensorView(host_copies_.back().data(), DType::kBF16, {h, Hb});
  }
  auto put = [&](TensorView* t) -> Status {
    MX_ASSIGN_OR_RETURN(*t, backend_.upload_weight(*t, &device_weights_));
    return Status::ok();
  };
  for (TensorView* t : {&pre_embedded_, &pre_state_, &weights_.embed, &weights_.final_norm, &weights_.post_projection})
    MX_RETURN_IF_ERROR(put(t));
  for (Gemma4AssistantLayerWeights& L : weights_.layers)
    for (TensorView* t : {&L.input_norm, &L.post_attention_norm, &L.pre_ffn_norm, &L.post_ffn_norm, &L.q_weight, &L.q_norm,
                          &L.o_weight, &L.mlp_gate, &L.mlp_up, &L.mlp_down, &L.layer_scalar})
      MX_RETURN_IF_ERROR(put(t));
  auto upload_f32 = [&](const std::vector<float>& values, TensorView* out) -> Status {
    const auto n = static_cast<int64_t>(values.size());
    MX_ASSIGN_OR_RETURN(Buffer buffer, backend_.allocate(n * static_cast<int64_t>(sizeof(float))));
    *out = buffer.view(DType::kF32, {n});
    MX_RETURN_IF_ERROR(backend_.copy_from_host(*out, values.data()));
    device_weights_.push_back(std::move(buffer));
    return Status::ok();
  };
  for (size_t l = 0; l < c.layer_is_sliding.size(); ++l) {
    TensorView& inv = c.layer_is_sliding[l] ? sliding_inv_freq_ : full_inv_freq_;
    if (inv.empty())
      MX_RETURN_IF_ERROR(upload_f32(gemma4_inv_freq(c.layer_is_sliding[l] ? c.sliding_rope : c.full_rope, c.layer_head_dim[l]), &inv));
  }
  return Status::ok();
}

Result<std::unique_ptr<DraftWorkspace>> Gemma4AssistantModel::make_workspace(int64_t max_seqs, int64_t /*max_target_tokens*/) const {
  const Gemma4AssistantConfig& c = config_;
  if (max_seqs < 1) return invalid_argument("a draft workspace needs room for at least one sequence");
  auto owned = std::make_unique<Gemma4AssistantWorkspace>();
  Gemma4AssistantWorkspace& ws = *owned;
  ws.max_seqs = max_seqs;
  auto make = [&](DType dtype, Shape shape) -> Result<TensorView> {
    MX_ASSIGN_OR_RETURN(Buffer b, backend_.allocate(dtype_bytes(dtype, shape.numel())));
    TensorView v = b.view(dtype, shape);
    ws.buffers.push_back(std::move(b));
    return v;
  };
  const int64_t S = max_seqs, h = c.hidden_size, Hb = c.backbone_hidden_size;
  const int64_t q_width = c.num_heads * *std::max_element(c.layer_head_dim.begin(), c.layer_head_dim.end());
  const DType act = backend_.activation_dtype();
  MX_ASSIGN_OR_RETURN(ws.embedded, make(act, {S, Hb}));
  MX_ASSIGN_OR_RETURN(ws.state, make(act, {S, Hb}));
  MX_ASSIGN_OR_RETURN(ws.residual, make(backend_.residual_dtype(), {S, h}));
  for (TensorView* t : {&ws.normed, &ws.state_proj, &ws.proj, &ws.branch}) {
    MX_ASSIGN_OR_RETURN(*t, make(act, {S, h}));
  }
  for (TensorView* t : {&ws.q, &ws.q_normed, &ws.q_roped, &ws.attn}) {
    MX_ASSIGN_OR_RETURN(*t, make(act, {S * q_width}));
  }
  MX_ASSIGN_OR_RETURN(ws.gate, make(act, {S, c.intermediate_size}));
  MX_ASSIGN_OR_RETURN(ws.up, make(act, {S, c.intermediate_size}));
  MX_ASSIGN_OR_RETURN(ws.logits, make(DType::kF32, {S, c.vocab_size}));
  const auto row_bytes = static_cast<int64_t>(sizeof(SampleRowParams));
  MX_ASSIGN_OR_RETURN(ws.sample_params, make(DType::kU8, {S, row_bytes}));
  // Drafts are greedy (transformers and vLLM take the argmax whatever the request samples with): every row's
  // params are the default, temperature 0.
  const std::vector<SampleRowParams> greedy(static_cast<size_t>(S));
  MX_RETURN_IF_ERROR(backend_.copy_from_host(ws.sample_params, greedy.data()));
  return std::unique_ptr<DraftWorkspace>(std::move(owned));
}

Status Gemma4AssistantModel::load_target_state(const DraftBatch& batch, Gemma4AssistantWorkspace& ws) const {
  return backend_.gather_rows(batch.target_hidden, batch.hidden_rows, ws.state.rows(0, batch.num_seqs));
}

Status Gemma4AssistantModel::step(const DraftBatch& batch, const KvCache& kv, Gemma4AssistantWorkspace& ws,
                                  const TensorView& tokens) const {
  const Gemma4AssistantConfig& c = config_;
  const int64_t S = batch.num_seqs;
  if (S < 1 || S > ws.max_seqs)
    return invalid_argument("draft batch of " + std::to_string(S) + " sequences exceeds the workspace's " + std::to_string(ws.max_seqs));
  Backend& b = backend_;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const TensorView embedded = ws.embedded.rows(0, S), state = ws.state.rows(0, S), residual = ws.residual.rows(0, S);
  const TensorView normed = ws.normed.rows(0, S), proj = ws.proj.rows(0, S), branch = ws.branch.rows(0, S);
  // z = pre_projection([embedding | state]) as two products; the sum lands in the residual, normed for layer 0.
  MX_RETURN_IF_ERROR(b.embedding(target_.embedding_table(), tokens, embedded));
  MX_RETURN_IF_ERROR(b.scale_by(embedded, target_.embedding_scale()));
  MX_RETURN_IF_ERROR(b.linear(embedded, pre_embedded_, TensorView(), residual));
  MX_RETURN_IF_ERROR(b.linear(state, pre_state_, TensorView(), ws.state_proj.rows(0, S)));
  MX_RETURN_IF_ERROR(b.add_rms_norm(residual, ws.state_proj.rows(0, S), weights_.layers[0].input_norm, eps, normed));
  const KvLayout& target_layout = target_.kv_layout();
  for (size_t l = 0; l < weights_.layers.size(); ++l) {
    const Gemma4AssistantLayerWeights& L = weights_.layers[l];
    const bool sliding = c.layer_is_sliding[l];
    const int64_t hd = c.layer_head_dim[l], nq = c.num_heads, width = nq * hd;
    const int64_t source = source_layer_[l];
    const KvLayerView cache = kv.layer(source);
    const int64_t n_kv = target_layout.layers[static_cast<size_t>(source)].n_kv;
    if (l > 0) MX_RETURN_IF_ERROR(b.rms_norm(residual, L.input_norm, eps, normed));
    const TensorView q = ws.q.rows(0, S * width).reshaped({S, width});
    const TensorView q_normed = ws.q_normed.rows(0, S * width).reshaped({S, width});
    const TensorView q_roped = ws.q_roped.rows(0, S * width).reshaped({S, width});
    const TensorView attn = ws.attn.rows(0, S * width).reshaped({S, width});
    MX_RETURN_IF_ERROR(b.linear(normed, L.q_weight, TensorView(), q));
    MX_RETURN_IF_ERROR(b.rms_norm(q.reshaped({S * nq, hd}), L.q_norm, eps, q_normed.reshaped({S * nq, hd})));
    // RoPE on the queries alone (no KV heads: nothing is written to the cache) at position p.
    const QkvRopeParams rope{q_normed, q_roped, cache, sliding ? sliding_inv_freq_ : full_inv_freq_, 1.0f, nq, 0, hd,
                             TensorView(), TensorView(), 0.0f, TensorView()};
    MX_RETURN_IF_ERROR(b.qkv_rope(rope, batch.queries));
    // Over the target's keys 0 .. p - 1: the context rows sit at p - 1. Sliding layers see the last
    // sliding_window + 1 of them (kSlidingKeysBeyondWindow).
    const int64_t window = sliding ? c.sliding_window + kSlidingKeysBeyondWindow : 0;
    const AttentionParams ap{q_roped, cache, TensorView(), attn, nq, n_kv, hd, window, 1.0f};
    MX_RETURN_IF_ERROR(b.attention(ap, batch.context));
    MX_RETURN_IF_ERROR(b.linear(attn, L.o_weight, TensorView(), proj));
    MX_RETURN_IF_ERROR(b.rms_norm(proj, L.post_attention_norm, eps, branch));
    MX_RETURN_IF_ERROR(b.add_rms_norm(residual, branch, L.pre_ffn_norm, eps, normed));
    const TensorView gate = ws.gate.rows(0, S), up = ws.up.rows(0, S);
    MX_RETURN_IF_ERROR(b.linear(normed, L.mlp_gate, TensorView(), gate));
    MX_RETURN_IF_ERROR(b.linear(normed, L.mlp_up, TensorView(), up));
    MX_RETURN_IF_ERROR(b.gelu_tanh_mul(gate, up, gate));
    MX_RETURN_IF_ERROR(b.linear(gate, L.mlp_down, TensorView(), proj));
    MX_RETURN_IF_ERROR(b.rms_norm(proj, L.post_ffn_norm, eps, branch));
    // residual = (residual + normed MLP) * layer_scalar; the norm output is scratch here.
    MX_RETURN_IF_ERROR(b.add_rms_norm(residual, branch, L.input_norm, eps, normed));
    MX_RETURN_IF_ERROR(b.scale_by(residual, L.layer_scalar));
  }
  MX_RETURN_IF_ERROR(b.rms_norm(residual, weights_.final_norm, eps, normed));
  MX_RETURN_IF_ERROR(b.linear(normed, weights_.embed, TensorView(), ws.logits.rows(0, S)));
  return b.linear(normed, weights_.post_projection, TensorView(), state);
}

Status Gemma4AssistantModel::draft(const DraftBatch& batch, const KvCache& kv, DraftWorkspace& workspace,
                                   int64_t num_drafts, TensorView drafts) const {
  auto* ws = dynamic_cast<Gemma4AssistantWorkspace*>(&workspace);
  if (!ws) return invalid_argument("gemma4 assistant given another draft model's workspace");
  const int64_t S = batch.num_seqs;
  if (num_drafts < 1 || drafts.rank() != 2 || drafts.dim(0) < num_drafts || drafts.dim(1) != S || drafts.dtype() != DType::kI32)
    return invalid_argument("draft output must be i32 [num_drafts, sequences]");
  MX_RETURN_IF_ERROR(load_target_state(batch, *ws));
  for (int64_t j = 0; j < num_drafts; ++j) {
    const TensorView tokens = j == 0 ? batch.queries.token_ids : drafts.rows(j - 1, j).reshaped({S});
    MX_RETURN_IF_ERROR(step(batch, kv, *ws, tokens));
    const SampleParams greedy{ws->logits.rows(0, S), ws->sample_params.rows(0, S), drafts.rows(j, j + 1).reshaped({S}),
                              TensorView(), TensorView(), TensorView()};
    MX_RETURN_IF_ERROR(backend_.sample(greedy));
  }
  return Status::ok();
}

}  // namespace mx
