// RouteTrace: a Backend decorator for engine tests that records which experts the router picked at every
// (request, position, layer) of an engine run, with the router's logits and each expert's condition scale;
// compare_routes() then says whether two runs over the same tokens (plain decoding vs speculative
// verification, say) routed differently, where first, and whether that first difference was a near tie.
//
// Why: two correct bf16 paths through different kernels (a decode step vs a verify row) differ by rounding;
// where two experts' router logits are that close, one path may pick the other expert, and from there on its
// hidden states, KV and logits differ by far more than rounding (the tiny fixtures' 8 experts, top 4, do
// this). A greedy token that differs without a near tie in its own logits is then legitimate only if the
// runs' routes differed upstream and every first difference (a root: no other difference in a lower layer at
// or before its position, the only places its router input depends on) was itself a near tie by the same
// measure as RoutingProbe's. Different tokens with identical routes, or a root far from a tie, is a bug.
//
// Use: load the model on the trace, call begin_step() from the runner's step observer, run; take() the log.
// Graph capture passes through unrecorded; with ModelRunner::set_graph_replay(false) graph steps run
// eagerly with their padding, bit for bit as replayed (padding rows are not recorded).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "route_observer_util.h"
#include "runtime/scheduler.h"

namespace mx::test {

// One router decision: the ids picked, the router logits of every expert, and each expert's condition scale
// sum_i |w[e, i] x[i]| + |b[e]| (how far a small relative error in x can move that logit).
struct RouteRow {
  std::vector<int32_t> ids;
  std::vector<float> logits;
  std::vector<double> scale;
};

// (request, position) -> one RouteRow per layer, from the last time the run computed that position (what
// stays in the KV cache: a rejected draft's position is computed again).
using RouteLog = std::map<std::pair<RequestId, int64_t>, std::vector<RouteRow>>;

class RouteTrace final : public RouteObserver {
 public:
  explicit RouteTrace(Backend& inner) : RouteObserver(inner) {}

  // The rows of the next forward pass: the batch's entries in order, then padding (ignored).
  void begin_step(const ScheduledBatch& batch);
  // The log so far; the trace starts a new one.
  RouteLog take();

  // Capture records nothing (a recording copies to the host, which a graph cannot hold).
  Result<std::unique_ptr<ReplayGraph>> capture(const std::function<Status()>& body) override;

 private:
  struct Span {
    RequestId id = 0;
    int64_t start = 0, rows = 0;
  };
  Status routed(const RouterParams& p) override;  // records p's route (RouteObserver's ops)
  std::vector<Span> step_;  // empty until the first begin_step: warm-up passes are not recorded
  int64_t layer_ = 0;       // router calls so far in this step
  bool capturing_ = false;
  RouteLog log_;
};

// A place where two runs routed a position differently. gap: how far apart the two runs' router logits must
// be for both choices to happen, in nats: (the weakest expert only A kept minus the strongest only B kept, in
// A's logits) plus the same from B's side; scale: the largest condition scale among those experts.
struct RouteDifference {
  int64_t layer = 0, position = 0;
  double gap = 0, scale = 0;
  bool root = false;  // no other difference in a lower layer at or before this position
  bool near_tie() const;
};

struct RouteComparison {
  std::vector<RouteDifference> differences;  // in (position, layer) order
  int64_t missing = 0;                       // (position, layer) decisions one of the logs lacks
  // Some difference, both logs complete, every root a near tie.
  bool explains_divergence() const;
  std::string describe() const;
};

// Compares request `id`'s routes in `a` and `b` at positions 0..last_position.
RouteComparison compare_routes(const RouteLog& a, const RouteLog& b, RequestId id, int64_t last_position);

}  // namespace mx::test
