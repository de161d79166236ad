// ProfilingBackend: a ForwardingBackend (it owns the inner backend) that on request measures a forward
// pass op by op (device timer marks around each op) or records the experts each router call chose.
// Marks work eagerly (after a device hold, so that the ops run back to back: GPU time, not launch
// latency) and inside graph capture (they become event nodes: the op times of a replayed graph).
// `mxserve bench latency --breakdown` loads the model through it; unarmed it only forwards.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/forwarding_backend.h"

namespace mx {

struct OpTiming {
  std::string op;            // backend op name: "linear", "attention", "moe_experts", ...
  int64_t out_features = 0;  // linear: output width (tells the lm_head apart); else 0
  double ms = 0;             // GPU time from the op's first launch to its last kernel's end
  double gap_before_ms = 0;  // device time between the previous op's end and this op's start
  bool captured = false;     // marked inside a graph capture (then its times are the replay's)
};

class ProfilingBackend final : public ForwardingBackend {
 public:
  explicit ProfilingBackend(std::unique_ptr<Backend> inner) : ForwardingBackend(std::move(inner)) {}

  // Times the ops issued (or captured) until finish_timing(). Eagerly, the first op is preceded by a device
  // hold of `hold_seconds`, which must outlast the host's issuing of the measured ops.
  Status start_timing(double hold_seconds, int64_t max_ops = 4096);
  Result<std::vector<OpTiming>> finish_timing();
  // Records every router call's top-k ids (host copies; slows the step) until finish_routing().
  void start_routing_record() { record_routing_ = true, routing_.clear(); }
  std::vector<std::vector<int32_t>> finish_routing();

  // Overridden: the ops below are timed (router_topk and add_rms_norm_route also recorded); every other call forwards unchanged.
  // copy_to_host is timed only once the step's ops have started: the staging copies before them synchronize
  // and would spend the hold.
  Status copy_to_host(void* dst, const TensorView& src) override;
  Status embedding(const TensorView& table, const TensorView& token_ids, TensorView out) override;
  Status rms_norm(const TensorView& x, const TensorView& weight, float eps, TensorView out) override;
  Status add_rms_norm(TensorView residual, const TensorView& delta, const TensorView& weight, float eps,
                      TensorView out) override;
  Status linear(const TensorView& x, const TensorView& weight, const TensorView& bias, TensorView out) override;
  Status linear_fp8(const TensorView& x, const TensorView& weight, const TensorView& scale, const TensorView& bias,
                    TensorView out) override;
  Status qkv_rope(const QkvRopeParams& p, const BatchView& batch) override;
  Status linear_qkv_rope(const TensorView& x, const TensorView& weight, const TensorView& scale, const TensorView& bias,
                         const QkvRopeParams& rope, const BatchView& batch) override;
  Status attention(const AttentionParams& p, const BatchView& batch) override;
  Status qkv_rope_attention(const QkvRopeParams& rope, const AttentionParams& attn, const BatchView& batch) override;
  Status router_topk(const RouterParams& p) override;
  Status add_rms_norm_route(TensorView residual, const TensorView& delta, const TensorView& weight, float eps,
                            TensorView out, const RouterParams& route) override;
  Status moe_experts(const MoeParams& p) override;
  Status moe_experts_add_rms_norm(const MoeParams& p, TensorView residual, const TensorView& weight, float eps,
                                  TensorView out) override;
  Status gather_rows(const TensorView& x, const TensorView& rows, TensorView out) override;
  Status sample(const SampleParams& p) override;
  Status unit_rms_norm(const TensorView& x, float eps, TensorView out) override;
  Status soft_cap(TensorView x, float cap) override;
  Status gelu_tanh_mul(const TensorView& gate, const TensorView& up, TensorView out) override;
  Status geglu(const TensorView& gate_up, TensorView out) override;
  Status qkv_norms(const QkvNormParams& p) override;
  Status moe_geglu_experts(const GegluMoeParams& p) override;
  Status scale_by(TensorView x, const TensorView& factor) override;
  Status gemma_attention_end(const GemmaAttentionEndParams& p) override;
  Status gemma_layer_end(const GemmaLayerEndParams& p) override;
  Status silu_mul(const TensorView& gate, const TensorView& up, TensorView out) override;
  Status convert(const TensorView& x, TensorView out) override;
  // While timing, the side group runs in order on the timed stream (begin_side answers false): each op between
  // its own two marks; otherwise forwarded.
  Result<bool> begin_side(int64_t tokens) override;
  Status end_side() override;
  Status join_side() override;
  // Marks the capture so that ops inside it are timed by event nodes and routing is not recorded.
  Result<std::unique_ptr<ReplayGraph>> capture(const std::function<Status()>& body) override;

 private:
  // Runs one op between two marks when timing.
  template <typename F>
  Status timed(const char* op, int64_t out_features, F&& run);
  // After a router call (router_topk, or gemma_attention_end's route): its choices, when recording.
  Status record_route(const RouterParams& p);

  std::unique_ptr<DeviceTimer> timer_;
  double hold_seconds_ = 0;
  bool timing_ = false, capturing_ = false, record_routing_ = false;
  bool side_forwarded_ = false;  // the open side group was forwarded (begin_side while not timing)
  int64_t next_slot_ = 0;
  std::vector<OpTiming> ops_;
  std::vector<std::pair<int64_t, int64_t>> op_slots_;  // start and end mark of each op
  std::vector<std::vector<int32_t>> routing_;
};

}  // namespace mx
