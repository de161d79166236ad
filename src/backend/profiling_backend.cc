#include "backend/profiling_backend.h"

namespace mx {

Status ProfilingBackend::start_timing(double hold_seconds, int64_t max_ops) {
  if (!timer_ || timer_->capacity() < 2 * max_ops) {
    MX_ASSIGN_OR_RETURN(timer_, inner().make_timer(2 * max_ops));
  }
  hold_seconds_ = hold_seconds;
  timing_ = true;
  next_slot_ = 0;
  ops_.clear();
  op_slots_.clear();
  return Status::ok();
}

template <typename F>
Status ProfilingBackend::timed(const char* op, int64_t out_features, F&& run) {
  if (!timing_) return run();
  if (next_slot_ + 2 > timer_->capacity()) return resource_exhausted("profiled step has more ops than timer slots");
  if (next_slot_ == 0 && !capturing_) MX_RETURN_IF_ERROR(timer_->hold(hold_seconds_));
  const int64_t start = next_slot_++;
  MX_RETURN_IF_ERROR(timer_->mark(start));
  MX_RETURN_IF_ERROR(run());
  const int64_t end = next_slot_++;
  MX_RETURN_IF_ERROR(timer_->mark(end));
  ops_.push_back({op, out_features, 0, 0, capturing_});
  op_slots_.emplace_back(start, end);
  return Status::ok();
}

Result<std::vector<OpTiming>> ProfilingBackend::finish_timing() {
  timing_ = false;
  if (next_slot_ == 0) return std::vector<OpTiming>{};
  MX_ASSIGN_OR_RETURN(std::vector<double> ms, timer_->read(next_slot_));
  double prev_end = 0;
  for (size_t i = 0; i < ops_.size(); ++i) {
    const auto [start, end] = op_slots_[i];
    ops_[i].ms = ms[static_cast<size_t>(end)] - ms[static_cast<size_t>(start)];
    ops_[i].gap_before_ms = i == 0 ? 0 : ms[static_cast<size_t>(start)] - prev_end;
    prev_end = ms[static_cast<size_t>(end)];
  }
  return std::move(ops_);
}

std::vector<std::vector<int32_t>> ProfilingBackend::finish_routing() {
  record_routing_ = false;
  return std::move(routing_);
}

Status ProfilingBackend::copy_to_host(void* dst, const TensorView& src) {
  if (!timing_ || next_slot_ == 0) return inner().copy_to_host(dst, src);
  return timed("copy_to_host", 0, [&] { return inner().copy_to_host(dst, src); });
}

Status ProfilingBackend::embedding(const TensorView& table, const TensorView& token_ids, TensorView out) {
  return timed("embedding", 0, [&] { return inner().embedding(table, token_ids, out); });
}
Status ProfilingBackend::rms_norm(const TensorView& x, const TensorView& weight, float eps, TensorView out) {
  return timed("rms_norm", 0, [&] { return inner().rms_norm(x, weight, eps, out); });
}
Status ProfilingBackend::add_rms_norm(TensorView residual, const TensorView& delta, const TensorView& weight, float eps,
                                      TensorView out) {
  return timed("add_rms_norm", 0, [&] { return inner().add_rms_norm(residual, delta, weight, eps, out); });
}
Status ProfilingBackend::linear(const TensorView& x, const TensorView& weight, const TensorView& bias, TensorView out) {
  return timed("linear", weight.dim(0), [&] { return inner().linear(x, weight, bias, out); });
}
// Counted as "linear" so the breakdown files FP8 dense GEMMs with the bf16 ones.
Status ProfilingBackend::linear_fp8(const TensorView& x, const TensorView& weight, const TensorView& scale,
                                    const TensorView& bias, TensorView out) {
  return timed("linear", weight.dim(0), [&] { return inner().linear_fp8(x, weight, scale, bias, out); });
}
Status ProfilingBackend::qkv_rope(const QkvRopeParams& p, const BatchView& batch) {
  return timed("qkv_rope", 0, [&] { return inner().qkv_rope(p, batch); });
}
// Filed with the dense GEMMs in the breakdown: the RoPE is a small part of it.
Status ProfilingBackend::linear_qkv_rope(const TensorView& x, const TensorView& weight, const TensorView& scale,
                                         const TensorView& bias, const QkvRopeParams& rope, const BatchView& batch) {
  return timed("linear_qkv_rope", 0, [&] { return inner().linear_qkv_rope(x, weight, scale, bias, rope, batch); });
}
Status ProfilingBackend::attention(const AttentionParams& p, const BatchView& batch) {
  return timed("attention", 0, [&] { return inner().attention(p, batch); });
}

Status ProfilingBackend::qkv_rope_attention(const QkvRopeParams& rope, const AttentionParams& attn,
                                            const BatchView& batch) {
  return timed("qkv_rope_attention", 0, [&] { return inner().qkv_rope_attention(rope, attn, batch); });
}
Status ProfilingBackend::router_topk(const RouterParams& p) {
  MX_RETURN_IF_ERROR(timed("router_topk", 0, [&] { return inner().router_topk(p); }));
  return record_route(p);
}
// Filed with the norms in the breakdown (as gemma_attention_end with its route): the router's own time is inside.
Status ProfilingBackend::add_rms_norm_route(TensorView residual, const TensorView& delta, const TensorView& weight,
                                            float eps, TensorView out, const RouterParams& route) {
  MX_RETURN_IF_ERROR(timed("add_rms_norm_route", 0,
                           [&] { return inner().add_rms_norm_route(residual, delta, weight, eps, out, route); }));
  return record_route(route);
}
Status ProfilingBackend::record_route(const RouterParams& p) {
  if (!record_routing_ || capturing_) return Status::ok();
  std::vector<int32_t> ids(static_cast<size_t>(p.topk_ids.numel()));
  MX_RETURN_IF_ERROR(inner().copy_to_host(ids.data(), p.topk_ids));
  routing_.push_back(std::move(ids));
  return Status::ok();
}
Status ProfilingBackend::moe_experts(const MoeParams& p) {
  return timed("moe_experts", 0, [&] { return inner().moe_experts(p); });
}
// Filed with the experts in the breakdown: the norm is a small part of it.
Status ProfilingBackend::moe_experts_add_rms_norm(const MoeParams& p, TensorView residual, const TensorView& weight,
                                                  float eps, TensorView out) {
  return timed("moe_experts_add_rms_norm", 0,
               [&] { return inner().moe_experts_add_rms_norm(p, residual, weight, eps, out); });
}
Status ProfilingBackend::gather_rows(const TensorView& x, const TensorView& rows, TensorView out) {
  return timed("gather_rows", 0, [&] { return inner().gather_rows(x, rows, out); });
}

Status ProfilingBackend::sample(const SampleParams& p) {
  return timed("sample", 0, [&] { return inner().sample(p); });
}
Status ProfilingBackend::unit_rms_norm(const TensorView& x, float eps, TensorView out) {
  return timed("unit_rms_norm", 0, [&] { return inner().unit_rms_norm(x, eps, out); });
}
Status ProfilingBackend::soft_cap(TensorView x, float cap) {
  return timed("soft_cap", 0, [&] { return inner().soft_cap(x, cap); });
}
Status ProfilingBackend::gelu_tanh_mul(const TensorView& gate, const TensorView& up, TensorView out) {
  return timed("gelu_tanh_mul", 0, [&] { return inner().gelu_tanh_mul(gate, up, out); });
}
Status ProfilingBackend::geglu(const TensorView& gate_up, TensorView out) {
  return timed("geglu", 0, [&] { return inner().geglu(gate_up, out); });
}
Status ProfilingBackend::qkv_norms(const QkvNormParams& p) {
  return timed("qkv_norms", 0, [&] { return inner().qkv_norms(p); });
}
Status ProfilingBackend::moe_geglu_experts(const GegluMoeParams& p) {
  return timed("moe_geglu_experts", 0, [&] { return inner().moe_geglu_experts(p); });
}
Status ProfilingBackend::scale_by(TensorView x, const TensorView& factor) {
  return timed("scale_by", 0, [&] { return inner().scale_by(x, factor); });
}
Status ProfilingBackend::gemma_attention_end(const GemmaAttentionEndParams& p) {
  MX_RETURN_IF_ERROR(timed("gemma_attention_end", 0, [&] { return inner().gemma_attention_end(p); }));
  return p.route ? record_route(*p.route) : Status::ok();
}
Result<bool> ProfilingBackend::begin_side(int64_t tokens) {
  side_forwarded_ = !timing_;
  return timing_ ? Result<bool>(false) : inner().begin_side(tokens);
}
Status ProfilingBackend::end_side() { return side_forwarded_ ? inner().end_side() : Status::ok(); }
Status ProfilingBackend::join_side() {
  if (!side_forwarded_) return Status::ok();
  side_forwarded_ = false;
  return inner().join_side();
}
Status ProfilingBackend::gemma_layer_end(const GemmaLayerEndParams& p) {
  return timed("gemma_layer_end", 0, [&] { return inner().gemma_layer_end(p); });
}
Status ProfilingBackend::silu_mul(const TensorView& gate, const TensorView& up, TensorView out) {
  return timed("silu_mul", 0, [&] { return inner().silu_mul(gate, up, out); });
}
Status ProfilingBackend::convert(const TensorView& x, TensorView out) {
  return timed("convert", 0, [&] { return inner().convert(x, out); });
}

Result<std::unique_ptr<ReplayGraph>> ProfilingBackend::capture(const std::function<Status()>& body) {
  capturing_ = true;
  auto graph = inner().capture(body);
  capturing_ = false;
  return graph;
}

}  // namespace mx
