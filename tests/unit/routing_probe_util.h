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
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "route_observer_util.h"

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

class RoutingProbe final : public RouteObserver {
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

  // Every route (RouteObserver's ops) is recorded, or forced; every other call forwards to the inner backend.
  // Recording copies each router call's choices to the host, which a graph capture cannot hold.
  bool can_capture() const override { return false; }
  Result<std::unique_ptr<ReplayGraph>> capture(const std::function<Status()>& body) override {
    return Backend::capture(body);
  }

 private:
  RoutingProbe(Backend& inner, std::vector<std::vector<int32_t>> forced)
      : RouteObserver(inner), forcing_(!forced.empty()), forced_(std::move(forced)) {}
  // After the inner backend routed p: its choices recorded, or replaced by the forced ones.
  Status routed(const RouterParams& p) override;
  Status force(const RouterParams& p, int64_t call);

  bool forcing_ = false;
  std::vector<std::vector<int32_t>> forced_;    // per call: [T * k] ids
  std::vector<std::vector<int32_t>> recorded_;  // per call: what the router finally used
  std::vector<RoutingFlip> flips_;
};

}  // namespace mx::test
