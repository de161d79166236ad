#include "model/gemma4/gemma4_model.h"

#include <algorithm>
#include <cmath>

namespace mx {

std::vector<float> gemma4_inv_freq(const Gemma4Rope& rope, int64_t head_dim) {
  const int64_t half = head_dim / 2;
  const auto rotated = static_cast<int64_t>(rope.partial_rotary_factor * static_cast<double>(head_dim) / 2.0);
  std::vector<float> inv(static_cast<size_t>(half), 0.0f);
  for (int64_t i = 0; i < std::min(rotated, half); ++i)
    inv[static_cast<size_t>(i)] =
        static_cast<float>(1.0 / std::pow(rope.theta, static_cast<double>(2 * i) / static_cast<double>(head_dim)));
  return inv;
}

Gemma4Model::Gemma4Model(Gemma4Config config, Backend& backend, const ModelShard& shard, Gemma4ShardPlan plan)
    : config_(std::move(config)), cost_(config_), backend_(backend), shard_(shard), plan_(std::move(plan)) {
  const Gemma4Config& c = config_;
  dims_ = ModelDims{c.vocab_size, c.hidden_size, c.num_layers, c.max_position_embeddings};
  std::vector<KvLayerSpec> layers;
  // K and V differ even on K=V layers (K: k_norm + RoPE, V: weightless norm), so both are stored.
  for (size_t l = 0; l < c.layer_is_sliding.size(); ++l)
    layers.push_back({plan_.kv_heads[l], c.layer_head_dim[l], c.layer_is_sliding[l] ? c.sliding_window : 0, false});
  kv_layout_ = KvLayout::from_layers(std::move(layers));
}

Result<std::unique_ptr<Gemma4Model>> Gemma4Model::from_checkpoint(Gemma4Config config, GenerationConfig generation_config,
                                                                  Checkpoint checkpoint, Backend& backend,
                                                                  const ModelShard& shard) {
  if (shard.size > 1 && !shard.comm) return invalid_argument("a tensor-parallel rank needs a communicator");
  MX_ASSIGN_OR_RETURN(Gemma4ShardPlan plan, plan_gemma4_shard(config, shard));
  std::unique_ptr<Gemma4Model> model(new Gemma4Model(std::move(config), backend, shard, std::move(plan)));
  model->generation_config_ = std::move(generation_config);
  model->checkpoint_ = std::make_unique<Checkpoint>(std::move(checkpoint));
  MX_RETURN_IF_ERROR(bind_weights(*model->checkpoint_, gemma4_weight_specs(model->config_, model->weights_),
                                  gemma4_skipped_prefixes(model->config_)));
  MX_RETURN_IF_ERROR(model->slice_for_rank());
  MX_RETURN_IF_ERROR(model->upload());
  return model;
}

Status Gemma4Model::all_reduce(TensorView x) const {
  return shard_.size > 1 ? shard_.comm->all_reduce_sum(x) : Status::ok();
}

Status Gemma4Model::slice_for_rank() {
  const Gemma4Config& c = config_;
  const int64_t H = c.hidden_size;
  // Blocks [r0, r1) x [c0, c1) of each of `count` stacked [rows, cols] matrices, as a host view of a copy.
  auto block = [&](const TensorView& t, int64_t count, int64_t rows, int64_t cols,
                   std::initializer_list<std::pair<int64_t, int64_t>> row_ranges, int64_t c0, int64_t c1) {
    std::vector<uint16_t> out;
    int64_t kept_rows = 0;
    for (int64_t e = 0; e < count; ++e)
      for (const auto& [r0, r1] : row_ranges) {
        append_bf16_block(t.ptr<const uint16_t>() + e * rows * cols, cols, r0, r1, c0, c1, &out);
        if (e == 0) kept_rows += r1 - r0;
      }
    host_copies_.push_back(std::move(out));
    Shape shape = count == 1 ? Shape{kept_rows, c1 - c0} : Shape{count, kept_rows, c1 - c0};
    return TensorView(host_copies_.back().data(), DType::kBF16, shape);
  };
  // Each layer's fused q|k|v: the rank's query heads, then its KV heads' k and v rows (K=V layers: k's twice).
  for (size_t l = 0; l < weights_.layers.size(); ++l) {
    Gemma4LayerWeights& L = weights_.layers[l];
    const int64_t hd = c.layer_head_dim[l], kv0 = plan_.first_kv_head[l], kv1 = kv0 + plan_.kv_heads[l];
    const TensorView& v_rows = L.v_weight.empty() ? L.k_weight : L.v_weight;
    std::vector<uint16_t> fused;
    append_bf16_block(L.q_weight.ptr<const uint16_t>(), H, plan_.first_head * hd, (plan_.first_head + plan_.heads) * hd, 0, H, &fused);
    append_bf16_block(L.k_weight.ptr<const uint16_t>(), H, kv0 * hd, kv1 * hd, 0, H, &fused);
    append_bf16_block(v_rows.ptr<const uint16_t>(), H, kv0 * hd, kv1 * hd, 0, H, &fused);
    host_copies_.push_back(std::move(fused));
    qkv_weight_.emplace_back(host_copies_.back().data(), DType::kBF16, Shape{(plan_.heads + 2 * (kv1 - kv0)) * hd, H});
    if (shard_.size == 1) continue;
    // o_proj's columns of the rank's heads; the dense MLP's and each expert's intermediate slice (gate and up
    // rows, down columns).
    const int64_t q0 = plan_.first_head * hd, q1 = q0 + plan_.heads * hd, I = c.intermediate_size;
    const int64_t i0 = plan_.first_intermediate, i1 = i0 + plan_.intermediate;
    L.o_weight = block(L.o_weight, 1, H, c.num_heads * hd, {{0, H}}, q0, q1);
    L.mlp_gate = L.mlp_gate.rows(i0, i1);
    L.mlp_up = L.mlp_up.rows(i0, i1);
    L.mlp_down = block(L.mlp_down, 1, H, I, {{0, H}}, i0, i1);
    if (c.moe) {
      const int64_t E = c.num_experts, Im = c.moe_intermediate_size;
      const int64_t m0 = plan_.first_expert_intermediate, m1 = m0 + plan_.expert_intermediate;
      L.experts_gate_up = block(L.experts_gate_up, E, 2 * Im, H, {{m0, m1}, {Im + m0, Im + m1}}, 0, H);
      L.experts_down = block(L.experts_down, E, H, Im, {{0, H}}, m0, m1);
    }
  }
  if (shard_.size > 1) lm_head_ = weights_.embed.rows(plan_.first_vocab, plan_.first_vocab + plan_.vocab);
  return Status::ok();
}

Result<TensorView> Gemma4Model::upload_host_f32(const std::vector<float>& values) {
  const auto n = static_cast<int64_t>(values.size());
  MX_ASSIGN_OR_RETURN(Buffer buffer, backend_.allocate(n * static_cast<int64_t>(sizeof(float))));
  TensorView view = buffer.view(DType::kF32, {n});
  MX_RETURN_IF_ERROR(backend_.copy_from_host(view, values.data()));
  device_weights_.push_back(std::move(buffer));
  return view;
}

Status Gemma4Model::upload() {
  const Gemma4Config& c = config_;
  const int64_t H = c.hidden_size;
  auto put = [&](const TensorView& host) { return backend_.upload_weight(host, &device_weights_); };
  MX_ASSIGN_OR_RETURN(sliding_inv_freq_, upload_host_f32(gemma4_inv_freq(c.sliding_rope, c.layer_head_dim[0])));
  if (c.global_head_dim() > 0) {
    MX_ASSIGN_OR_RETURN(full_inv_freq_, upload_host_f32(gemma4_inv_freq(c.full_rope, c.global_head_dim())));
  }
  // transformers multiplies by sqrt(H) in the weights' dtype; the fp32 reference keeps it in f32.
  MX_ASSIGN_OR_RETURN(embed_scale_, upload_host_f32({static_cast<float>(std::sqrt(static_cast<double>(H)))}));
  MX_ASSIGN_OR_RETURN(weights_.embed, put(weights_.embed));
  if (!lm_head_.empty()) {
    MX_ASSIGN_OR_RETURN(lm_head_, put(lm_head_));
  }
  MX_ASSIGN_OR_RETURN(weights_.final_norm, put(weights_.final_norm));
  const double root = 1.0 / std::sqrt(static_cast<double>(H));
  for (size_t l = 0; l < weights_.layers.size(); ++l) {
    Gemma4LayerWeights& L = weights_.layers[l];
    MX_ASSIGN_OR_RETURN(qkv_weight_[l], put(qkv_weight_[l]));
    // The dense MLP's gate and up projections (the rank's slices) as one weight: one GEMM at decode.
    std::vector<uint16_t> gate_up;
    const int64_t inter = L.mlp_gate.dim(0);
    append_bf16_block(L.mlp_gate.ptr<const uint16_t>(), H, 0, inter, 0, H, &gate_up);
    append_bf16_block(L.mlp_up.ptr<const uint16_t>(), H, 0, inter, 0, H, &gate_up);
    host_copies_.push_back(std::move(gate_up));
    MX_ASSIGN_OR_RETURN(TensorView fused, put(TensorView(host_copies_.back().data(), DType::kBF16, {2 * inter, H})));
    mlp_gate_up_.push_back(fused);
    if (c.moe) {
      // The router keeps the checkpoint's bf16 weight (a decode step's router is bound by its weight stream:
      // half the bytes of the weight with the scale folded in, f32); its learned per-dim scale and H^-1/2
      // multiply the normed x instead, as one f32 vector.
      std::vector<float> x_scale(static_cast<size_t>(H));
      const auto* s = L.router_scale.ptr<const uint16_t>();
      for (int64_t h = 0; h < H; ++h) x_scale[static_cast<size_t>(h)] = static_cast<float>(bf16_to_f32(s[h]) * root);
      MX_ASSIGN_OR_RETURN(TensorView xs, upload_host_f32(x_scale));
      router_x_scale_.push_back(xs);
      MX_ASSIGN_OR_RETURN(TensorView rw, put(L.router_weight));
      router_weight_.push_back(rw);
    } else {
      router_weight_.emplace_back();
      router_x_scale_.emplace_back();
    }
    for (TensorView* t : {&L.input_norm, &L.post_attention_norm, &L.q_norm, &L.k_norm, &L.o_weight, &L.pre_mlp_norm,
                          &L.post_mlp_norm, &L.mlp_down, &L.pre_moe_norm, &L.post_moe_norm,
                          &L.post_ffn_norm, &L.per_expert_scale, &L.experts_gate_up, &L.experts_down, &L.layer_scalar}) {
      if (!t->empty()) {
        MX_ASSIGN_OR_RETURN(*t, put(*t));
      }
    }
  }
  return Status::ok();
}

int64_t Gemma4Model::device_weight_bytes() const {
  int64_t total = 0;
  for (const Buffer& b : device_weights_) total += b.bytes();
  return total;
}

Result<std::unique_ptr<ModelWorkspace>> Gemma4Model::make_workspace(int64_t max_tokens, int64_t max_logit_rows) const {
  const Gemma4Config& c = config_;
  auto owned = std::make_unique<Gemma4Workspace>();
  Gemma4Workspace& ws = *owned;
  ws.max_tokens = max_tokens;
  ws.max_logit_rows = max_logit_rows;
  const DType act = backend_.activation_dtype();
  auto make = [&](DType dtype, Shape shape) -> Result<TensorView> {
    MX_ASSIGN_OR_RETURN(Buffer b, backend_.allocate(dtype_bytes(dtype, shape.numel())));
    TensorView v = b.view(dtype, shape);
    ws.buffers.push_back(std::move(b));
    return v;
  };
  const int64_t T = max_tokens, H = c.hidden_size;
  int64_t qkv_width = 0, q_width = 0, max_hd = 0, max_kv = 0;
  for (size_t l = 0; l < c.layer_head_dim.size(); ++l) {
    qkv_width = std::max(qkv_width, (plan_.heads + 2 * plan_.kv_heads[l]) * c.layer_head_dim[l]);
    q_width = std::max(q_width, plan_.heads * c.layer_head_dim[l]);
    max_hd = std::max(max_hd, c.layer_head_dim[l]);
    max_kv = std::max(max_kv, plan_.kv_heads[l]);
  }
  const int64_t E = std::max<int64_t>(c.num_experts, 1), K = std::max<int64_t>(c.experts_per_token, 1);
  MX_RETURN_IF_ERROR(backend_.prepare(WorkspaceSpec{T, H, std::max<int64_t>(plan_.expert_intermediate, 1), c.num_experts,
                                                    c.experts_per_token, plan_.heads, max_kv, max_hd, max_logit_rows,
                                                    c.vocab_size}));
  MX_ASSIGN_OR_RETURN(ws.residual, make(backend_.residual_dtype(), {T, H}));
  for (TensorView* t : {&ws.normed, &ws.normed_moe, &ws.proj, &ws.moe_out}) {
    MX_ASSIGN_OR_RETURN(*t, make(act, {T, H}));
  }
  MX_ASSIGN_OR_RETURN(ws.qkv, make(act, {T * qkv_width}));
  MX_ASSIGN_OR_RETURN(ws.q, make(act, {T * q_width}));
  MX_ASSIGN_OR_RETURN(ws.attn, make(act, {T * q_width}));
  MX_ASSIGN_OR_RETURN(ws.gate_up, make(act, {T, 2 * plan_.intermediate}));
  MX_ASSIGN_OR_RETURN(ws.mlp_act, make(act, {T, plan_.intermediate}));
  MX_ASSIGN_OR_RETURN(ws.router_logits, make(DType::kF32, {T, E}));
  MX_ASSIGN_OR_RETURN(ws.topk_ids, make(DType::kI32, {T, K}));
  MX_ASSIGN_OR_RETURN(ws.topk_weights, make(DType::kF32, {T, K}));
  MX_ASSIGN_OR_RETURN(ws.gathered, make(act, {max_logit_rows, H}));
  if (shard_.size > 1) {
    MX_ASSIGN_OR_RETURN(ws.logits_local, make(DType::kF32, {max_logit_rows, plan_.vocab}));
    MX_RETURN_IF_ERROR(shard_.comm->prepare_all_gather(max_logit_rows, c.vocab_size));
  }
  return std::unique_ptr<ModelWorkspace>(std::move(owned));
}

Result<ForwardOutput> Gemma4Model::forward(const BatchView& batch, const KvCache& kv, ModelWorkspace& workspace,
                                           TensorView logits, const HiddenObserver* observer) const {
  const Gemma4Config& c = config_;
  auto* own = dynamic_cast<Gemma4Workspace*>(&workspace);
  if (!own) return invalid_argument("gemma4 forward pass given another model's workspace");
  Gemma4Workspace& ws = *own;
  // A tensor-parallel rank's layers sit at its offset in the KV cache the ranks share.
  const auto& kv_layers = kv.shape().layout.layers;
  const auto offset = static_cast<size_t>(shard_.kv_layer_offset);
  if (kv_layers.size() < offset + kv_layout_.layers.size() ||
      !std::equal(kv_layout_.layers.begin(), kv_layout_.layers.end(), kv_layers.begin() + static_cast<std::ptrdiff_t>(offset)))
    return invalid_argument("gemma4 forward pass given a KV cache of another layout");
  const int64_t T = batch.num_tokens, R = batch.num_logit_rows;
  if (T <= 0 || T > ws.max_tokens || R > ws.max_logit_rows)
    return invalid_argument("batch of " + std::to_string(T) + " tokens / " + std::to_string(R) +
                            " logit rows exceeds the workspace");
  Backend& b = backend_;
  const float eps = static_cast<float>(c.rms_norm_eps);
  TensorView residual = ws.residual.rows(0, T), normed = ws.normed.rows(0, T), proj = ws.proj.rows(0, T);
  TensorView normed_moe = ws.normed_moe.rows(0, T), moe_out = ws.moe_out.rows(0, T);
  auto observe = [&](int64_t index, const TensorView& t) {
    if (observer) (*observer)(index, t);
  };

  MX_RETURN_IF_ERROR(b.embedding(weights_.embed, batch.token_ids, residual));
  MX_RETURN_IF_ERROR(b.scale_by(residual, embed_scale_));
  observe(0, residual);
  // The first layer's input norm; each later one (and the final norm) comes out of the layer before's end.
  MX_RETURN_IF_ERROR(b.rms_norm(residual, weights_.layers[0].input_norm, eps, normed));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const auto li = static_cast<size_t>(l);
    const Gemma4LayerWeights& L = weights_.layers[li];
    const KvLayerView cache = kv.layer(shard_.kv_layer_offset + l);
    const int64_t hd = c.layer_head_dim[li], n_kv = plan_.kv_heads[li], nq = plan_.heads;
    const bool sliding = c.layer_is_sliding[li];

    // Attention (normed holds the input norm of the residual).
    TensorView qkv = ws.qkv.rows(0, T * (nq + 2 * n_kv) * hd).reshaped({T, (nq + 2 * n_kv) * hd});
    TensorView q = ws.q.rows(0, T * nq * hd).reshaped({T, nq * hd});
    TensorView attn = ws.attn.rows(0, T * nq * hd).reshaped({T, nq * hd});
    MX_RETURN_IF_ERROR(b.linear(normed, qkv_weight_[li], TensorView(), qkv));
    // Per-head q/k/v norms, then RoPE and the KV write, in one op; then the attention (one backend op: CUDA can run
    // the first inside the decode attention, CudaAttentionOptions::norm_rope_in_attention). o_proj's weight goes into
    // the L2 while the attention runs (where the backend does so).
    QkvRopeParams rope{qkv, q, cache, sliding ? sliding_inv_freq_ : full_inv_freq_, 1.0f, nq, n_kv, hd, L.q_norm,
                       L.k_norm, eps, L.o_weight};
    AttentionParams ap{q, cache, TensorView(), attn, nq, n_kv, hd, kv_layout_.layers[li].window, 1.0f};
    MX_RETURN_IF_ERROR(b.qkv_rope_attention(rope, ap, batch));
    MX_RETURN_IF_ERROR(b.linear(attn, L.o_weight, TensorView(), proj));
    MX_RETURN_IF_ERROR(all_reduce(proj));  // each rank's heads' share of o_proj
    // residual += normed attention; the dense MLP's and the experts' input norms of the new residual; then the
    // router of that residual, in the same op (CUDA: one launch at decode), before the dense MLP, so the
    // experts find their routing complete (and may read it before their PDL wait). Routed from the residual
    // (not from the pre-feedforward norm); the router's weightless norm of the residual is fused into the
    // router (x_norm_eps).
    RouterParams router{residual, router_weight_[li], TensorView(), ws.router_logits.rows(0, T),
                        ws.topk_ids.rows(0, T), ws.topk_weights.rows(0, T), c.experts_per_token,
                        L.per_expert_scale, eps, router_x_scale_[li]};
    GemmaAttentionEndParams end{proj, residual, L.post_attention_norm, L.pre_mlp_norm,
                                c.moe ? L.pre_moe_norm : TensorView(), normed, normed_moe, eps};
    end.route = c.moe ? &router : nullptr;
    MX_RETURN_IF_ERROR(b.gemma_attention_end(end));
    // Dense MLP, beside the experts where the backend runs the two so (CUDA: at a few tokens, on two streams;
    // one rank only: the all-reduces stay in order). The MLP reads normed and writes gate_up, mlp_act and proj;
    // the experts read normed_moe and the routing and write moe_out.
    bool beside = false;
    if (c.moe && shard_.size == 1) {
      MX_ASSIGN_OR_RETURN(beside, b.begin_side(T));
    }
    TensorView gate_up = ws.gate_up.rows(0, T), mlp_act = ws.mlp_act.rows(0, T);
    MX_RETURN_IF_ERROR(b.linear(normed, mlp_gate_up_[li], TensorView(), gate_up));
    MX_RETURN_IF_ERROR(b.geglu(gate_up, mlp_act));
    MX_RETURN_IF_ERROR(b.linear(mlp_act, L.mlp_down, TensorView(), proj));
    if (beside) MX_RETURN_IF_ERROR(b.end_side());
    MX_RETURN_IF_ERROR(all_reduce(proj));  // each rank's intermediate slice
    if (c.moe) {
      GegluMoeParams experts{normed_moe, router.topk_ids, router.topk_weights, L.experts_gate_up, L.experts_down,
                             moe_out, c.experts_per_token};
      // In order, the dense MLP's kernels ran in between; beside it, the experts follow the router's launch.
      experts.routing_ready = !beside;
      MX_RETURN_IF_ERROR(b.moe_geglu_experts(experts));
      MX_RETURN_IF_ERROR(all_reduce(moe_out));  // each rank's slice of every expert
    }
    if (beside) MX_RETURN_IF_ERROR(b.join_side());
    // residual = (residual + normed FFN) * layer_scalar, then the next layer's input norm (or the final
    // norm) into normed. With experts the FFN is the norm of (normed dense + normed experts).
    const bool last = l + 1 == c.num_layers;
    MX_RETURN_IF_ERROR(b.gemma_layer_end(GemmaLayerEndParams{
        proj, c.moe ? moe_out : TensorView(), c.moe ? L.post_mlp_norm : L.post_ffn_norm, L.post_moe_norm,
        L.post_ffn_norm, L.layer_scalar, residual, last ? weights_.final_norm : weights_.layers[li + 1].input_norm,
        normed, eps}));
    if (!last) observe(l + 1, residual);
  }
  observe(c.num_layers, normed);
  const ForwardOutput out{normed};
  if (R == 0) return out;
  TensorView gathered = ws.gathered.rows(0, R);
  MX_RETURN_IF_ERROR(b.gather_rows(normed, batch.logit_rows, gathered));
  // Tensor parallel: each rank computes (and soft-caps) its vocabulary's columns; every rank gets whole rows.
  const TensorView own_logits = shard_.size > 1 ? ws.logits_local.rows(0, R) : logits.rows(0, R);
  MX_RETURN_IF_ERROR(b.linear(gathered, shard_.size > 1 ? lm_head_ : weights_.embed, TensorView(), own_logits));
  if (c.final_logit_softcap > 0) {
    MX_RETURN_IF_ERROR(b.soft_cap(own_logits, static_cast<float>(c.final_logit_softcap)));
  }
  if (shard_.size > 1) MX_RETURN_IF_ERROR(shard_.comm->all_gather_columns(own_logits, logits.rows(0, R)));
  return out;
}

}  // namespace mx
