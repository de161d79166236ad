// RouteObserver: the base of the test decorators that look at every router decision (RoutingProbe, RouteTrace).
// It forwards each op that routes (router_topk, add_rms_norm_route's route, gemma_attention_end's route) to the
// inner backend and then hands the route to routed().
//
// Why one base: an op that routes was added twice (gemma_attention_end, add_rms_norm_route) and each time one
// decorator did not see it, so the fixture gate missed its near-tie allowance. A new routing op is now added here
// once and every observer sees it.
#pragma once

#include "backend/forwarding_backend.h"
#include "core/status.h"

namespace mx::test {

class RouteObserver : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;

  Status router_topk(const RouterParams& p) override {
    MX_RETURN_IF_ERROR(inner().router_topk(p));
    return routed(p);
  }
  Status add_rms_norm_route(TensorView residual, const TensorView& delta, const TensorView& weight, float eps,
                            TensorView out, const RouterParams& route) override {
    MX_RETURN_IF_ERROR(inner().add_rms_norm_route(residual, delta, weight, eps, out, route));
    return routed(route);
  }
  Status gemma_attention_end(const GemmaAttentionEndParams& p) override {
    MX_RETURN_IF_ERROR(inner().gemma_attention_end(p));
    return p.route ? routed(*p.route) : Status::ok();
  }

 protected:
  // After the inner backend ran the router of p (its ids, weights and logits are written).
  virtual Status routed(const RouterParams& p) = 0;
};

}  // namespace mx::test
