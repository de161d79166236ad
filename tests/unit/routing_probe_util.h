// RoutingProbe: a Backend decorator for tests that records the experts a backend's router picks, or forces a
// recorded choice onto another backend's run, and judges every place where the two choices differ.
//
// Why: MoE routing is a discrete decision. Where two experts' router logits are nearly tied, bf16 rounding
// upstream may legitimately pick the other expert, and the logits after that point differ by far more than
// rounding (the tiny fixture's prompt_0 does this at layer 0). Comparing CUDA with the fp32 twin is then only
// meaningful along the same route: record CUDA's routing, replay it on the CPU, and accept a difference in
// choice only where the CPU's own fp32 logits call it a near tie (gap <= kNearTieFraction of the logits'
// condition scale sum_i |w_i x_i| + |b|, the size of the error a relative perturbation of x can cause).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/gpt_oss.h"

namespace mx::test {

// A flipped choice is tolerated when gap / scale is at most this: a 1% relative error in the router's
// input (bf16 activations after a few layers) can move a logit by 1% of sum_i |w_i x_i|.
inline constexpr double kNearTieFraction = 1e-2;

struct RoutingFlip {
  int64_t call = 0;   // router call index (the layer, for one forward pass)
  int64_t token = 0;  // row in that call
  double gap = 0;     // fp32 logit of the weakest expert the reference chose minus the strongest it did not
  double scale = 0;   // condition scale of those logits
  bool near_tie() const { return gap <= kNearTieFraction * scale; }
};

class RoutingProbe final : public Backend {
 public:
  // Records the inner backend's router choices (top-k ids per call, copied to the host).
  static RoutingProbe recorder(Backend& inner) { return RoutingProbe(inner, {}); }
  // Makes the inner backend (the CPU twin: it needs host-visible router inputs) use `route` instead of its
  // own choices; weights are recomputed as the softmax of the inner backend's logits over the forced set.
  static RoutingProbe forcer(Backend& inner, std::vector<std::vector<int32_t>> route) {
    return RoutingProbe(inner, std::move(route));
  }

  const std::vector<std::vector<int32_t>>& route() const { return recorded_; }
  const std::vector<RoutingFlip>& flips() const { return flips_; }
  bool all_flips_near_ties() const;
  std::string describe_flips() const;

  // Backend: everything forwards to the inner backend except router_topk.
  std::string name() const override { return inner_.name(); }
  Device device() const override { return inner_.device(); }
  DType activation_dtype() const override { return inner_.activation_dtype(); }
  DType residual_dtype() const override { return inner_.residual_dtype(); }
  DType kv_dtype() const override { return inner_.kv_dtype(); }
  Result<Buffer> allocate(int64_t bytes) override { return inner_.allocate(bytes); }
  Status copy_from_host(TensorView dst, const void* src) override { return inner_.copy_from_host(dst, src); }
  Status copy_to_host(void* dst, const TensorView& src) override { return inner_.copy_to_host(dst, src); }
  Status synchronize() override { return inner_.synchronize(); }
  Result<TensorView> upload_weight(const TensorView& host, std::vector<Buffer>* owner) override {
    return inner_.upload_weight(host, owner);
  }
  Result<ExpertWeights> upload_experts(const ExpertWeights& host, std::vector<Buffer>* owner) override {
    return inner_.upload_experts(host, owner);
  }
  Status embedding(const TensorView& table, const TensorView& ids, TensorView out) override {
    return inner_.embedding(table, ids, out);
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
  Status qkv_rope(const QkvRopeParams& p, const BatchView& batch) override { return inner_.qkv_rope(p, batch); }
  Status attention(const AttentionParams& p, const BatchView& batch) override { return inner_.attention(p, batch); }
  Status router_topk(const RouterParams& p) override;
  Status moe_experts(const MoeParams& p) override { return inner_.moe_experts(p); }
  Status gather_rows(const TensorView& x, const TensorView& rows, TensorView out) override {
    return inner_.gather_rows(x, rows, out);
  }
  Status sample(const SampleParams& p) override { return inner_.sample(p); }
  Status prepare(const WorkspaceSpec& spec) override { return inner_.prepare(spec); }

 private:
  RoutingProbe(Backend& inner, std::vector<std::vector<int32_t>> forced)
      : inner_(inner), forcing_(!forced.empty()), forced_(std::move(forced)) {}
  Status force(const RouterParams& p, int64_t call);

  Backend& inner_;
  bool forcing_ = false;
  std::vector<std::vector<int32_t>> forced_;    // per call: [T * k] ids
  std::vector<std::vector<int32_t>> recorded_;  // per call: what the router finally used
  std::vector<RoutingFlip> flips_;
};

// One batched prefill of `prompts` on the model's backend: f32 logits of every prompt position, prompts in order.
// `observer` (optional) sees the hidden states as GptOssModel::forward reports them.
Result<std::vector<float>> prefill_logits(const GptOssModel& model, const std::vector<std::vector<int32_t>>& prompts,
                                          const HiddenObserver* observer = nullptr);

}  // namespace mx::test
