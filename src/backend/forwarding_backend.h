// ForwardingBackend: a Backend that passes every call on to an inner backend, unchanged. It is the base of
// the decorators that change a few calls and forward the rest (ProfilingBackend times ops; the tests'
// RoutingProbe records or forces router choices).
// Why a base: each decorator then names only what it changes, and a call added to Backend reaches the inner
// backend through every decorator instead of silently taking Backend's default in one of them.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/log.h"

namespace mx {

class ForwardingBackend : public Backend {
 public:
  // Borrows `inner`: the caller keeps it alive as long as this backend.
  explicit ForwardingBackend(Backend& inner) : inner_(inner) {}
  // Owns `inner`: it goes away with this backend.
  explicit ForwardingBackend(std::unique_ptr<Backend> inner) : owned_(std::move(inner)), inner_(deref(owned_)) {}

  Backend& inner() const { return inner_; }

  std::string name() const override { return inner_.name(); }
  Device device() const override { return inner_.device(); }
  DType activation_dtype() const override { return inner_.activation_dtype(); }
  DType residual_dtype() const override { return inner_.residual_dtype(); }
  DType kv_dtype() const override { return inner_.kv_dtype(); }

  Result<Buffer> allocate(int64_t bytes) override { return inner_.allocate(bytes); }
  Status copy_from_host(TensorView dst, const void* src) override { return inner_.copy_from_host(dst, src); }
  Status copy_row_prefixes_from_host(TensorView dst, const void* src, int64_t prefix_bytes) override {
    return inner_.copy_row_prefixes_from_host(dst, src, prefix_bytes);
  }
  Status copy_to_host(void* dst, const TensorView& src) override { return inner_.copy_to_host(dst, src); }
  Status synchronize() override { return inner_.synchronize(); }

  Result<TensorView> upload_weight(const TensorView& host, std::vector<Buffer>* owner) override {
    return inner_.upload_weight(host, owner);
  }
  Result<ExpertWeights> upload_experts(const ExpertWeights& host, std::vector<Buffer>* owner) override {
    return inner_.upload_experts(host, owner);
  }

  Status embedding(const TensorView& table, const TensorView& token_ids, TensorView out) override {
    return inner_.embedding(table, token_ids, out);
  }
  Status rms_norm(const TensorView& x, const TensorView& weight, float eps, TensorView out) override {
    return inner_.rms_norm(x, weight, eps, out);
  }
  Status add_rms_norm(TensorView residual, const TensorView& delta, const TensorView& weight, float eps,
                      TensorView out) override {
    return inner_.add_rms_norm(residual, delta, weight, eps, out);
  }
  Status linear(const TensorView& x, const TensorView& weight, const TensorView& bias, TensorView out) override {
    return inner_.linear(x, weight, bias, out);
  }
  Status linear_fp8(const TensorView& x, const TensorView& weight, const TensorView& scale, const TensorView& bias,
                    TensorView out) override {
    return inner_.linear_fp8(x, weight, scale, bias, out);
  }
  Status qkv_rope(const QkvRopeParams& p, const BatchView& batch) override { return inner_.qkv_rope(p, batch); }
  Status linear_qkv_rope(const TensorView& x, const TensorView& weight, const TensorView& scale, const TensorView& bias,
                         const QkvRopeParams& rope, const BatchView& batch) override {
    return inner_.linear_qkv_rope(x, weight, scale, bias, rope, batch);
  }
  Status attention(const AttentionParams& p, const BatchView& batch) override { return inner_.attention(p, batch); }
  Status qkv_rope_attention(const QkvRopeParams& rope, const AttentionParams& attn, const BatchView& batch) override {
    return inner_.qkv_rope_attention(rope, attn, batch);
  }
  Status router_topk(const RouterParams& p) override { return inner_.router_topk(p); }
  Status add_rms_norm_route(TensorView residual, const TensorView& delta, const TensorView& weight, float eps,
                            TensorView out, const RouterParams& route) override {
    return inner_.add_rms_norm_route(residual, delta, weight, eps, out, route);
  }
  Status moe_experts(const MoeParams& p) override { return inner_.moe_experts(p); }
  Status moe_experts_add_rms_norm(const MoeParams& p, TensorView residual, const TensorView& weight, float eps,
                                  TensorView out) override {
    return inner_.moe_experts_add_rms_norm(p, residual, weight, eps, out);
  }
  Status gather_rows(const TensorView& x, const TensorView& rows, TensorView out) override {
    return inner_.gather_rows(x, rows, out);
  }
  Status sample(const SampleParams& p) override { return inner_.sample(p); }
  Status unit_rms_norm(const TensorView& x, float eps, TensorView out) override {
    return inner_.unit_rms_norm(x, eps, out);
  }
  Status soft_cap(TensorView x, float cap) override { return inner_.soft_cap(x, cap); }
  Status gelu_tanh_mul(const TensorView& gate, const TensorView& up, TensorView out) override {
    return inner_.gelu_tanh_mul(gate, up, out);
  }
  Status geglu(const TensorView& gate_up, TensorView out) override { return inner_.geglu(gate_up, out); }
  Status qkv_norms(const QkvNormParams& p) override { return inner_.qkv_norms(p); }
  Status moe_geglu_experts(const GegluMoeParams& p) override { return inner_.moe_geglu_experts(p); }
  Status scale_by(TensorView x, const TensorView& factor) override { return inner_.scale_by(x, factor); }
  Status gemma_attention_end(const GemmaAttentionEndParams& p) override { return inner_.gemma_attention_end(p); }
  Status gemma_layer_end(const GemmaLayerEndParams& p) override { return inner_.gemma_layer_end(p); }
  Status silu_mul(const TensorView& gate, const TensorView& up, TensorView out) override {
    return inner_.silu_mul(gate, up, out);
  }
  Status convert(const TensorView& x, TensorView out) override { return inner_.convert(x, out); }
  Status copy(TensorView dst, const TensorView& src) override { return inner_.copy(dst, src); }

  Result<bool> begin_side(int64_t tokens) override { return inner_.begin_side(tokens); }
  Status end_side() override { return inner_.end_side(); }
  Status join_side() override { return inner_.join_side(); }

  std::string device_name() const override { return inner_.device_name(); }
  Result<DeviceMemory> memory_info() override { return inner_.memory_info(); }
  int64_t allocated_bytes() const override { return inner_.allocated_bytes(); }
  Result<std::unique_ptr<DeviceTimer>> make_timer(int64_t slots) override { return inner_.make_timer(slots); }

  Status prepare(const WorkspaceSpec& spec) override { return inner_.prepare(spec); }
  bool can_capture() const override { return inner_.can_capture(); }
  Status make_current() override { return inner_.make_current(); }
  Result<std::unique_ptr<ReplayGraph>> capture(const std::function<Status()>& body) override {
    return inner_.capture(body);
  }

 private:
  static Backend& deref(const std::unique_ptr<Backend>& inner) {
    MX_CHECK(inner != nullptr) << "ForwardingBackend needs an inner backend";
    return *inner;
  }

  std::unique_ptr<Backend> owned_;  // empty when borrowed; declared first: inner_ may refer to it
  Backend& inner_;
};

}  // namespace mx
