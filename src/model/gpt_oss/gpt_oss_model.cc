#include "model/gpt_oss/gpt_oss_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/dense_fp8.h"
#include "model/load_progress.h"
#include "model/rope.h"
#include "model/weight_loader.h"

namespace mx {
namespace {

// Concatenates bf16 tensors along dimension 0 into one host vector.
std::vector<uint16_t> concat_rows(std::initializer_list<TensorView> parts) {
  std::vector<uint16_t> out;
  for (const auto& p : parts) {
    const auto* src = p.ptr<const uint16_t>();
    out.insert(out.end(), src, src + p.numel());
  }
  return out;
}

// Columns [first, first + count) of a bf16 [rows, n] matrix, as a [rows, count] host copy.
std::vector<uint16_t> column_block(const TensorView& m, int64_t first, int64_t count) {
  const int64_t rows = m.dim(0), n = m.dim(1);
  const auto* src = m.ptr<const uint16_t>();
  std::vector<uint16_t> out(static_cast<size_t>(rows * count));
  for (int64_t r = 0; r < rows; ++r)
    std::copy(src + r * n + first, src + r * n + first + count, out.begin() + r * count);
  return out;
}

}  // namespace

GptOssModel::GptOssModel(GptOssConfig config, Backend& backend, const ModelShard& shard, const GptOssShardPlan& plan)
    : config_(std::move(config)), cost_(config_), backend_(backend), shard_(shard), plan_(plan) {
  const GptOssConfig& c = config_;
  dims_ = ModelDims{c.vocab_size, c.hidden_size, c.num_layers, c.max_position_embeddings};
  std::vector<KvLayerSpec> layers;
  for (int64_t l = 0; l < c.num_layers; ++l)
    layers.push_back({plan_.kv_heads, c.head_dim, c.layer_is_sliding[static_cast<size_t>(l)] ? c.sliding_window : 0, false});
  kv_layout_ = KvLayout::from_layers(std::move(layers));
}

TensorView GptOssModel::item_rows(const TensorView& t, int64_t first, int64_t count, int64_t per_item) {
  return t.rows(first * per_item, (first + count) * per_item);
}

Status GptOssModel::all_reduce_add_rms_norm(TensorView x, TensorView residual, const TensorView& weight, float eps,
                                            TensorView out) const {
  if (shard_.size == 1) return backend_.add_rms_norm(residual, x, weight, eps, out);
  return shard_.comm->all_reduce_add_rms_norm(x, backend_, residual, weight, eps, out);
}

Result<std::unique_ptr<GptOssModel>> GptOssModel::load(const std::string& model_dir, Backend& backend,
                                                       const ModelLoadOptions& options) {
  MX_ASSIGN_OR_RETURN(GptOssConfig config, load_gpt_oss_config(model_dir));
  MX_ASSIGN_OR_RETURN(GenerationConfig generation_config, load_generation_config(model_dir));
  MX_ASSIGN_OR_RETURN(Checkpoint checkpoint, Checkpoint::open_dir(model_dir));
  auto model = from_checkpoint(std::move(config), std::move(generation_config), std::move(checkpoint), backend,
                               ModelShard{}, options);
  if (!model.is_ok()) return model.status().with_context(model_dir);
  return model;
}

Result<std::unique_ptr<GptOssModel>> GptOssModel::from_checkpoint(GptOssConfig config, GenerationConfig generation_config,
                                                                  Checkpoint checkpoint, Backend& backend,
                                                                  const ModelShard& shard,
                                                                  const ModelLoadOptions& options) {
  if (shard.size > 1 && !shard.comm) return invalid_argument("a tensor-parallel rank needs a communicator");
  if (options.dense_dtype != DType::kBF16 && options.dense_dtype != DType::kF8E4M3)
    return invalid_argument(std::string("gpt-oss dense weights cannot be ") + dtype_name(options.dense_dtype));
  MX_ASSIGN_OR_RETURN(const GptOssShardPlan plan, plan_gpt_oss_shard(config, shard, options.moe_split));
  std::unique_ptr<GptOssModel> model(new GptOssModel(std::move(config), backend, shard, plan));
  model->generation_config_ = std::move(generation_config);
  // <|end|> (200007) closes a Harmony message inside a turn (the analysis before the answer): a
  // generation_config that listed it as eos would end every answer after its reasoning.
  std::erase(model->generation_config_.eos_token_ids, int64_t{200007});
  model->options_ = options;
  if (options.dense_dtype == DType::kF8E4M3) model->cost_.set_dense_weight_bytes(1);
  model->checkpoint_ = std::make_unique<Checkpoint>(std::move(checkpoint));
  MX_RETURN_IF_ERROR(model->bind_checkpoint());
  MX_RETURN_IF_ERROR(model->upload());
  return model;
}

// Dense projections the checkpoint already holds in FP8 (e4m3 + NAME_scale per output channel) are bound as
// such and read with their scales; the rest as bf16.
Status GptOssModel::bind_checkpoint() {
  const Checkpoint& ck = *checkpoint_;
  std::vector<WeightSpec> specs = gpt_oss_weight_specs(config_, weights_);
  std::vector<std::string> scale_names;
  for (WeightSpec& spec : specs) {
    const bool dense = spec.name == "lm_head.weight" || spec.name.ends_with("_proj.weight");
    if (!dense || !ck.has(spec.name)) continue;
    MX_ASSIGN_OR_RETURN(const TensorView view, ck.get(spec.name));
    if (view.dtype() != DType::kF8E4M3) continue;
    spec.dtype = DType::kF8E4M3;
    scale_names.push_back(spec.name + "_scale");
  }
  if (!scale_names.empty() && shard_.size > 1)
    return unimplemented("FP8 dense weights in the checkpoint are not split across tensor-parallel ranks yet");
  MX_RETURN_IF_ERROR(bind_weights(ck, specs, scale_names));
  for (const WeightSpec& spec : specs)
    if (spec.dtype == DType::kF8E4M3) {
      MX_ASSIGN_OR_RETURN(checkpoint_fp8_[spec.name], read_checkpoint_fp8_rows(ck, spec.name, *spec.destination));
    }
  return Status::ok();
}

const Fp8Rows* GptOssModel::checkpoint_fp8(const std::string& name) const {
  auto it = checkpoint_fp8_.find(name);
  return it == checkpoint_fp8_.end() ? nullptr : &it->second;
}

Status GptOssModel::upload() {
  const GptOssConfig& c = config_;
  auto put = [&](const TensorView& host) { return backend_.upload_weight(host, &device_weights_); };
  LoadProgress progress("weights to " + backend_.device_name(), static_cast<int64_t>(weights_.layers.size()),
                        backend_.device() != Device::kCpu);
  MX_ASSIGN_OR_RETURN(weights_.embed, put(weights_.embed));
  MX_ASSIGN_OR_RETURN(weights_.final_norm, put(weights_.final_norm));
  MX_RETURN_IF_ERROR(progress.timed("dense", [&] {
    return put_dense(weights_.lm_head.rows(plan_.first_vocab, plan_.first_vocab + plan_.vocab),
                     checkpoint_fp8("lm_head.weight"), &weights_.lm_head, &weights_.lm_head_scale);
  }));
  const RopeTables rope = compute_yarn_rope(c.rope, c.head_dim);
  rope_scale_ = rope.attention_scale;
  MX_ASSIGN_OR_RETURN(Buffer freq, backend_.allocate(static_cast<int64_t>(rope.inv_freq.size() * sizeof(float))));
  inv_freq_ = freq.view(DType::kF32, {static_cast<int64_t>(rope.inv_freq.size())});
  MX_RETURN_IF_ERROR(backend_.copy_from_host(inv_freq_, rope.inv_freq.data()));
  device_weights_.push_back(std::move(freq));

  const int64_t hd = c.head_dim, qkv_rows = (plan_.heads + 2 * plan_.kv_heads) * hd;
  int64_t layers_done = 0;
  for (GptOssLayerWeights& L : weights_.layers) {
    // q, k and v run as one projection: one weight read and one launch instead of three.
    // A tensor-parallel rank keeps its heads' rows of q, k and v.
    const GptOssShardPlan& p = plan_;
    const std::string attn = "model.layers." + std::to_string(layers_done) + ".self_attn.";
    const Fp8Rows *q8 = checkpoint_fp8(attn + "q_proj.weight"), *k8 = checkpoint_fp8(attn + "k_proj.weight"),
                  *v8 = checkpoint_fp8(attn + "v_proj.weight");
    if ((q8 != nullptr) != (k8 != nullptr) || (q8 != nullptr) != (v8 != nullptr))
      return invalid_argument(attn + "{q,k,v}_proj.weight: some are FP8 and some are not (they run fused)");
    Fp8Rows qkv8;  // whole heads: a checkpoint's FP8 weights load on one rank only (see bind_checkpoint)
    if (q8) {
      for (const Fp8Rows* part : {q8, k8, v8}) {
        qkv8.values.insert(qkv8.values.end(), part->values.begin(), part->values.end());
        qkv8.scales.insert(qkv8.scales.end(), part->scales.begin(), part->scales.end());
      }
      L.qkv_weight = TensorView(qkv8.values.data(), DType::kF8E4M3, {qkv_rows, c.hidden_size});
    } else {
      host_fused_.push_back(concat_rows({item_rows(L.q_weight, p.first_head, p.heads, hd),
                                         item_rows(L.k_weight, p.first_kv_head, p.kv_heads, hd),
                                         item_rows(L.v_weight, p.first_kv_head, p.kv_heads, hd)}));
      L.qkv_weight = TensorView(host_fused_.back().data(), DType::kBF16, {qkv_rows, c.hidden_size});
    }
    host_fused_.push_back(concat_rows({item_rows(L.q_bias, p.first_head, p.heads, hd),
                                       item_rows(L.k_bias, p.first_kv_head, p.kv_heads, hd),
                                       item_rows(L.v_bias, p.first_kv_head, p.kv_heads, hd)}));
    L.qkv_bias = TensorView(host_fused_.back().data(), DType::kBF16, {qkv_rows});
    MX_RETURN_IF_ERROR(
        progress.timed("dense", [&] { return put_dense(L.qkv_weight, q8 ? &qkv8 : nullptr, &L.qkv_weight, &L.qkv_scale); }));
    MX_ASSIGN_OR_RETURN(L.qkv_bias, put(L.qkv_bias));
    if (shard_.size > 1) {
      // o_proj is row-parallel: this rank's heads' columns; its bias is added once, by rank 0.
      host_fused_.push_back(column_block(L.o_weight, plan_.first_head * hd, plan_.heads * hd));
      L.o_weight = TensorView(host_fused_.back().data(), DType::kBF16, {c.hidden_size, plan_.heads * hd});
      if (!plan_.adds_o_bias) L.o_bias = TensorView();
      L.sinks = item_rows(L.sinks, plan_.first_head, plan_.heads, 1);
      ExpertWeights& x = L.experts;
      if (plan_.moe_split == MoeSplit::kByExpert) {
        for (TensorView* t : {&x.w1_blocks, &x.w1_scales, &x.w1_bias, &x.w2_blocks, &x.w2_scales, &x.w2_bias})
          *t = item_rows(*t, plan_.first_expert, plan_.experts, 1);
        x.num_experts = plan_.experts;
      } else {
        MX_ASSIGN_OR_RETURN(x, slice_expert_intermediate(x, plan_.first_intermediate, plan_.intermediate,
                                                         plan_.adds_down_bias, &host_expert_slices_));
      }
    }
    MX_RETURN_IF_ERROR(progress.timed(
        "dense", [&] { return put_dense(L.o_weight, checkpoint_fp8(attn + "o_proj.weight"), &L.o_weight, &L.o_scale); }));
    for (TensorView* w : {&L.input_norm, &L.post_attention_norm, &L.o_bias, &L.sinks, &L.router_weight, &L.router_bias}) {
      if (!w->empty()) {
        MX_ASSIGN_OR_RETURN(*w, put(*w));
      }
    }
    MX_ASSIGN_OR_RETURN(L.experts,
                        progress.timed("experts", [&] { return backend_.upload_experts(L.experts, &device_weights_); }));
    if (backend_.device() != Device::kCpu) host_expert_slices_.clear();  // the device has its copy
    progress.step(++layers_done, device_weight_bytes());
  }
  checkpoint_fp8_.clear();  // put_dense copied what it kept
  return Status::ok();
}

Status GptOssModel::put_dense(const TensorView& host, const Fp8Rows* fp8, TensorView* weight, TensorView* scale) {
  const int64_t n = host.dim(0);
  if (options_.dense_dtype == DType::kBF16) {
    TensorView bf16 = host;
    if (fp8) {  // the checkpoint's FP8 weight, widened
      host_fused_.push_back(widen_rows_fp8(*fp8));
      bf16 = TensorView(host_fused_.back().data(), DType::kBF16, {n, host.dim(1)});
    }
    MX_ASSIGN_OR_RETURN(*weight, backend_.upload_weight(bf16, &device_weights_));
    *scale = TensorView();
    return Status::ok();
  }
  // The CPU backend keeps views of the host copies; other backends copy them. A checkpoint's FP8 weight
  // keeps its own values and scales.
  Fp8Rows q = fp8 ? *fp8 : quantize_rows_fp8(host);
  auto& values = host_fp8_.emplace_back(std::move(q.values));
  auto& scales = host_scales_.emplace_back(std::move(q.scales));
  MX_ASSIGN_OR_RETURN(*weight, backend_.upload_weight(TensorView(values.data(), DType::kF8E4M3, {n, host.dim(1)}),
                                                      &device_weights_));
  MX_ASSIGN_OR_RETURN(*scale, backend_.upload_weight(TensorView(scales.data(), DType::kF32, {n}), &device_weights_));
  if (backend_.device() != Device::kCpu) {  // a device copy was made: the host one can go
    host_fp8_.pop_back();
    host_scales_.pop_back();
  }
  return Status::ok();
}

Status GptOssModel::dense(const TensorView& x, const TensorView& weight, const TensorView& scale, const TensorView& bias,
                          TensorView out) const {
  if (scale.empty()) return backend_.linear(x, weight, bias, out);
  return backend_.linear_fp8(x, weight, scale, bias, out);
}

int64_t GptOssModel::device_weight_bytes() const {
  int64_t total = 0;
  for (const Buffer& b : device_weights_) total += b.bytes();
  return total;
}

std::string GptOssModel::parallel_summary() const {
  if (shard_.size == 1) return {};
  const GptOssShardPlan& p = plan_;
  auto range = [](int64_t first, int64_t count) {
    std::string text(1, '[');
    text += std::to_string(first);
    text += ", ";
    text += std::to_string(first + count);
    return text + ")";
  };
  const std::string moe = p.moe_split == MoeSplit::kByExpert
                              ? "experts " + range(p.first_expert, p.experts) + " of " + std::to_string(config_.num_experts)
                              : "channels " + range(p.first_intermediate, p.intermediate) + " of every expert's " +
                                    std::to_string(config_.intermediate_size);
  return "heads " + range(p.first_head, p.heads) + ", KV heads " + range(p.first_kv_head, p.kv_heads) + ", MoE split " +
         moe_split_name(p.moe_split) + ": " + moe + ", vocabulary " + range(p.first_vocab, p.vocab);
}

Result<std::unique_ptr<ModelWorkspace>> GptOssModel::make_workspace(int64_t max_tokens, int64_t max_logit_rows) const {
  const GptOssConfig& c = config_;
  auto owned = std::make_unique<GptOssWorkspace>();
  GptOssWorkspace& ws = *owned;
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
  // The backend sizes its own scratch (MoE intermediates, attention partials, sampling) for this many
  // tokens and logits rows.
  MX_RETURN_IF_ERROR(backend_.prepare(WorkspaceSpec{T, H, plan_.intermediate, c.num_experts, c.experts_per_token,
                                                    plan_.heads, plan_.kv_heads, c.head_dim, max_logit_rows, c.vocab_size}));
  const int64_t q_dim = plan_.heads * c.head_dim;
  MX_ASSIGN_OR_RETURN(ws.residual, make(backend_.residual_dtype(), {T, H}));
  MX_ASSIGN_OR_RETURN(ws.normed, make(act, {T, H}));
  MX_ASSIGN_OR_RETURN(ws.qkv, make(act, {T, q_dim + 2 * plan_.kv_heads * c.head_dim}));
  MX_ASSIGN_OR_RETURN(ws.q, make(act, {T, q_dim}));
  MX_ASSIGN_OR_RETURN(ws.attn, make(act, {T, q_dim}));
  MX_ASSIGN_OR_RETURN(ws.proj, make(act, {T, H}));
  MX_ASSIGN_OR_RETURN(ws.router_logits, make(DType::kF32, {T, c.num_experts}));
  MX_ASSIGN_OR_RETURN(ws.topk_ids, make(DType::kI32, {T, c.experts_per_token}));
  MX_ASSIGN_OR_RETURN(ws.topk_weights, make(DType::kF32, {T, c.experts_per_token}));
  MX_ASSIGN_OR_RETURN(ws.gathered, make(act, {max_logit_rows, H}));
  if (shard_.size > 1) {
    MX_ASSIGN_OR_RETURN(ws.logits_local, make(DType::kF32, {max_logit_rows, plan_.vocab}));
    MX_RETURN_IF_ERROR(shard_.comm->prepare_all_gather(max_logit_rows, c.vocab_size));
  }
  return std::unique_ptr<ModelWorkspace>(std::move(owned));
}

Result<ForwardOutput> GptOssModel::forward(const BatchView& batch, const KvCache& kv, ModelWorkspace& workspace,
                                           TensorView logits, const HiddenObserver* observer) const {
  const GptOssConfig& c = config_;
  auto* own = dynamic_cast<GptOssWorkspace*>(&workspace);
  if (!own) return invalid_argument("gpt-oss forward pass given another model's workspace");
  GptOssWorkspace& ws = *own;
  // A tensor-parallel rank's layers sit at its offset in the KV cache the ranks share.
  const auto& kv_layers = kv.shape().layout.layers;
  const auto offset = static_cast<size_t>(shard_.kv_layer_offset);
  if (kv_layers.size() < offset + kv_layout_.layers.size() ||
      !std::equal(kv_layout_.layers.begin(), kv_layout_.layers.end(), kv_layers.begin() + static_cast<std::ptrdiff_t>(offset)))
    return invalid_argument("gpt-oss forward pass given a KV cache of another layout");
  const int64_t T = batch.num_tokens, R = batch.num_logit_rows;
  if (T <= 0 || T > ws.max_tokens || R > ws.max_logit_rows)
    return invalid_argument("batch of " + std::to_string(T) + " tokens / " + std::to_string(R) +
                            " logit rows exceeds the workspace");
  Backend& b = backend_;
  const float eps = static_cast<float>(c.rms_norm_eps);
  TensorView residual = ws.residual.rows(0, T), normed = ws.normed.rows(0, T), proj = ws.proj.rows(0, T);
  auto observe = [&](int64_t index, const TensorView& t) {
    if (observer) (*observer)(index, t);
  };

  MX_RETURN_IF_ERROR(b.embedding(weights_.embed, batch.token_ids, residual));
  observe(0, residual);
  MX_RETURN_IF_ERROR(b.rms_norm(residual, weights_.layers[0].input_norm, eps, normed));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const GptOssLayerWeights& L = weights_.layers[static_cast<size_t>(l)];
    const KvLayerView cache = kv.layer(shard_.kv_layer_offset + l);

    // Prefill (a sequence of more than 8 tokens: the prefill attention kernels): RoPE for Q in the attention,
    // which reads the q|k|v projection (CUDA: the window and persistent kernels rotate Q as they load it), and
    // qkv_rope writes K and V alone; Q is not written and read back (8K tokens: 67 MB each way a layer).
    const bool q_in_attention = batch.max_seq_tokens > 8;
    QkvRopeParams rope{ws.qkv.rows(0, T), q_in_attention ? TensorView() : ws.q.rows(0, T), cache, inv_freq_,
                       rope_scale_, plan_.heads, plan_.kv_heads, c.head_dim, TensorView(), TensorView(), 0.0f,
                       TensorView()};  // no q/k norms, no prefetch
    // qkv (bf16 or FP8 weights, as dense()), then RoPE and the KV write: one launch at decode on CUDA.
    MX_RETURN_IF_ERROR(b.linear_qkv_rope(normed, L.qkv_weight, L.qkv_scale, L.qkv_bias, rope, batch));
    AttentionParams attn{q_in_attention ? ws.qkv.rows(0, T) : ws.q.rows(0, T), cache, L.sinks, ws.attn.rows(0, T),
                         plan_.heads, plan_.kv_heads, c.head_dim, kv_layout_.layers[static_cast<size_t>(l)].window,
                         static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)))};
    if (q_in_attention) {
      attn.q_inv_freq = inv_freq_;
      attn.q_rope_scale = rope_scale_;
    }
    MX_RETURN_IF_ERROR(b.attention(attn, batch));
    MX_RETURN_IF_ERROR(dense(ws.attn.rows(0, T), L.o_weight, L.o_scale, L.o_bias, proj));
    RouterParams router{normed, L.router_weight, L.router_bias, ws.router_logits.rows(0, T),
                        ws.topk_ids.rows(0, T), ws.topk_weights.rows(0, T), c.experts_per_token,
                        TensorView(), 0.0f, TensorView()};  // no expert scale, norm or x scale
    if (shard_.size == 1) {
      // The norm and the router of its output: one launch at decode on CUDA.
      MX_RETURN_IF_ERROR(b.add_rms_norm_route(residual, proj, L.post_attention_norm, eps, normed, router));
    } else {
      // Each rank's heads' share of o_proj, summed over the ranks.
      MX_RETURN_IF_ERROR(all_reduce_add_rms_norm(proj, residual, L.post_attention_norm, eps, normed));
      MX_RETURN_IF_ERROR(b.router_topk(router));
    }
    MoeParams moe{normed, router.topk_ids, router.topk_weights, &L.experts, proj, c.experts_per_token,
                  static_cast<float>(c.swiglu_limit), static_cast<float>(c.swiglu_alpha)};
    if (shard_.size > 1 && plan_.moe_split == MoeSplit::kByExpert) {
      moe.routed_experts = c.num_experts;
      moe.first_expert = plan_.first_expert;
    }
    // The residual add is fused with the next norm: the next layer's input norm, or the final norm.
    const bool last = l + 1 == c.num_layers;
    const TensorView& next_norm = last ? weights_.final_norm : weights_.layers[static_cast<size_t>(l + 1)].input_norm;
    if (shard_.size == 1) {
      // The experts and that norm (one op: a backend may join them at the experts' combine).
      MX_RETURN_IF_ERROR(b.moe_experts_add_rms_norm(moe, residual, next_norm, eps, normed));
    } else {
      // Each rank's share of the experts (its experts, or its slice of every expert's channels), summed.
      MX_RETURN_IF_ERROR(b.moe_experts(moe));
      MX_RETURN_IF_ERROR(all_reduce_add_rms_norm(proj, residual, next_norm, eps, normed));
    }
    observe(last ? c.num_layers : l + 1, last ? normed : residual);
  }
  const ForwardOutput out{normed};
  if (R == 0) return out;
  TensorView gathered = ws.gathered.rows(0, R);
  MX_RETURN_IF_ERROR(b.gather_rows(normed, batch.logit_rows, gathered));
  if (shard_.size == 1) {
    MX_RETURN_IF_ERROR(dense(gathered, weights_.lm_head, weights_.lm_head_scale, TensorView(), logits));
    return out;
  }
  // Each rank computes its vocabulary's columns; every rank gets the whole rows.
  TensorView local = ws.logits_local.rows(0, R);
  MX_RETURN_IF_ERROR(dense(gathered, weights_.lm_head, weights_.lm_head_scale, TensorView(), local));
  MX_RETURN_IF_ERROR(shard_.comm->all_gather_columns(local, logits.rows(0, R)));
  return out;
}

}  // namespace mx
