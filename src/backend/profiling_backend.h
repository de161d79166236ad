// ProfilingBackend: a Backend that forwards every call to another one, and on request measures a forward
// pass op by op (device timer marks around each op) or records the experts each router call chose.
// Marks work eagerly (after a device hold, so that the ops run back to back: GPU time, not launch
// latency) and inside graph capture (they become event nodes: the op times of a replayed graph).
// `mxserve bench latency --breakdown` loads the model through it; unarmed it only forwards.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace mx {

struct OpTiming {
  std::string op;            // backend op name: "linear", "attention", "moe_experts", ...
  int64_t out_features = 0;  // linear: output width (tells the lm_head apart); else 0
  double ms = 0;             // GPU time from the op's first launch to its last kernel's end
  double gap_before_ms = 0;  // device time between the previous op's end and this op's start
  bool captured = false;     // marked inside a graph capture (then its times are the replay's)
};

class ProfilingBackend final : public Backend {
 public:
  explicit ProfilingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}

  // Times the ops issued (or captured) until finish_timing(). Eagerly, the first op is preceded by a device
  // hold of `hold_seconds`, which must outlast the host's issuing of the measured ops.
  Status start_timing(double hold_seconds, int64_t max_ops = 4096);
  Result<std::vector<OpTiming>> finish_timing();
  // Records every router call's top-k ids (host copies; slows the step) until finish_routing().
  void start_routing_record() { record_routing_ = true, routing_.clear(); }
  std::vector<std::vector<int32_t>> finish_routing();

  std::string name() const override { return inner_->name(); }
  Device device() const override { return inner_->device(); }
  DType activation_dtype() const override { return inner_->activation_dtype(); }
  DType residual_dtype() const override { return inner_->residual_dtype(); }
  DType kv_dtype() const override { return inner_->kv_dtype(); }
  Result<Buffer> allocate(int64_t bytes) override { return inner_->allocate(bytes); }
  Status copy_from_host(TensorView dst, const void* src) override { return inner_->copy_from_host(dst, src); }
  // Timed (as "copy_to_host") only once the step's ops have started: the staging copies before them
  // synchronize and would spend the hold.
  Status copy_to_host(void* dst, const TensorView& src) override;
  Status synchronize() override { return inner_->synchronize(); }
  Result<TensorView> upload_weight(const TensorView& host, std::vector<Buffer>* owner) override {
    return inner_->upload_weight(host, owner);
  }
  Result<ExpertWeights> upload_experts(const ExpertWeights& host, std::vector<Buffer>* owner) override {
    return inner_->upload_experts(host, owner);
  }

  Status embedding(const TensorView& table, const TensorView& token_ids, TensorView out) override;
  Status rms_norm(const TensorView& x, const TensorView& weight, float eps, TensorView out) override;
  Status add_rms_norm(TensorView residual, const TensorView& delta, const TensorView& weight, float eps,
                      TensorView out) override;
  Status linear(const TensorView& x, const TensorView& weight, const TensorView& bias, TensorView out) override;
  Status qkv_rope(const QkvRopeParams& p, const BatchView& batch) override;
  Status attention(const AttentionParams& p, const BatchView& batch) override;
  Status router_topk(const RouterParams& p) override;
  Status moe_experts(const MoeParams& p) override;
  Status gather_rows(const TensorView& x, const TensorView& rows, TensorView out) override;
  Status sample(const SampleParams& p) override;
  Status copy(TensorView dst, const TensorView& src) override { return inner_->copy(dst, src); }

  std::string device_name() const override { return inner_->device_name(); }
  Result<DeviceMemory> memory_info() override { return inner_->memory_info(); }
  Result<std::unique_ptr<DeviceTimer>> make_timer(int64_t slots) override { return inner_->make_timer(slots); }
  Status prepare(const WorkspaceSpec& spec) override { return inner_->prepare(spec); }
  bool can_capture() const override { return inner_->can_capture(); }
  Result<std::unique_ptr<ReplayGraph>> capture(const std::function<Status()>& body) override;

 private:
  // Runs one op between two marks when timing.
  template <typename F>
  Status timed(const char* op, int64_t out_features, F&& run);

  std::unique_ptr<Backend> inner_;
  std::unique_ptr<DeviceTimer> timer_;
  double hold_seconds_ = 0;
  bool timing_ = false, capturing_ = false, record_routing_ = false;
  int64_t next_slot_ = 0;
  std::vector<OpTiming> ops_;
  std::vector<std::pair<int64_t, int64_t>> op_slots_;  // start and end mark of each op
  std::vector<std::vector<int32_t>> routing_;
};

}  // namespace mx
