#include "route_trace_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/dtype.h"
#include "routing_probe_util.h"
#include "runtime/request.h"

namespace mx::test {
namespace {

// A device tensor's values as f32 on the host.
Result<std::vector<float>> host_floats(Backend& b, const TensorView& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::kF32) {
    MX_RETURN_IF_ERROR(b.copy_to_host(out.data(), t));
    return out;
  }
  if (t.dtype() != DType::kBF16) return invalid_argument("RouteTrace: router tensors must be f32 or bf16");
  std::vector<uint16_t> bits(out.size());
  MX_RETURN_IF_ERROR(b.copy_to_host(bits.data(), t));
  for (size_t i = 0; i < bits.size(); ++i) out[i] = bf16_to_f32(bits[i]);
  return out;
}

bool contains(const std::vector<int32_t>& ids, int32_t e) { return std::find(ids.begin(), ids.end(), e) != ids.end(); }

// The logit distance, in `row`'s logits, from the weakest expert only `kept` has to the strongest only `other` has.
double one_side_gap(const RouteRow& row, const std::vector<int32_t>& kept, const std::vector<int32_t>& other, double* scale) {
  double weakest = INFINITY, strongest = -INFINITY;
  for (int32_t e : kept)
    if (!contains(other, e)) {
      weakest = std::min<double>(weakest, row.logits[static_cast<size_t>(e)]);
      *scale = std::max(*scale, row.scale[static_cast<size_t>(e)]);
    }
  for (int32_t e : other)
    if (!contains(kept, e)) {
      strongest = std::max<double>(strongest, row.logits[static_cast<size_t>(e)]);
      *scale = std::max(*scale, row.scale[static_cast<size_t>(e)]);
    }
  return weakest - strongest;
}

}  // namespace

void RouteTrace::begin_step(const ScheduledBatch& batch) {
  step_.clear();
  for (const ScheduledEntry& e : batch.entries) step_.push_back({e.request->id, e.start, e.num_tokens});
  layer_ = 0;
}

RouteLog RouteTrace::take() {
  RouteLog out = std::move(log_);
  log_.clear();
  step_.clear();
  return out;
}

Result<std::unique_ptr<ReplayGraph>> RouteTrace::capture(const std::function<Status()>& body) {
  capturing_ = true;
  auto graph = inner().capture(body);
  capturing_ = false;
  return graph;
}

Status RouteTrace::routed(const RouterParams& p) {
  if (capturing_ || step_.empty()) return Status::ok();
  const int64_t layer = layer_++, k = p.top_k, experts = p.weight.dim(0), hidden = p.weight.dim(1);
  std::vector<int32_t> ids(static_cast<size_t>(p.topk_ids.numel()));
  MX_RETURN_IF_ERROR(inner().copy_to_host(ids.data(), p.topk_ids));
  MX_ASSIGN_OR_RETURN(std::vector<float> logits, host_floats(inner(), p.logits));
  MX_ASSIGN_OR_RETURN(std::vector<float> x, host_floats(inner(), p.x));
  MX_ASSIGN_OR_RETURN(std::vector<float> w, host_floats(inner(), p.weight));
  std::vector<float> bias;
  if (!p.bias.empty()) {
    MX_ASSIGN_OR_RETURN(bias, host_floats(inner(), p.bias));
  }
  int64_t row = 0;
  for (const Span& s : step_) {
    for (int64_t j = 0; j < s.rows; ++j, ++row) {
      RouteRow r;
      r.ids.assign(ids.begin() + row * k, ids.begin() + (row + 1) * k);
      r.logits.assign(logits.begin() + row * experts, logits.begin() + (row + 1) * experts);
      const float* xr = x.data() + row * hidden;
      double norm = 1.0;  // the router's own weightless RMS norm, where it has one (Gemma-4)
      if (p.x_norm_eps > 0.0f) {
        double ss = 0;
        for (int64_t i = 0; i < hidden; ++i) ss += static_cast<double>(xr[i]) * xr[i];
        norm = 1.0 / std::sqrt(ss / static_cast<double>(hidden) + p.x_norm_eps);
      }
      r.scale.resize(static_cast<size_t>(experts));
      for (int64_t e = 0; e < experts; ++e) {
        double sum = bias.empty() ? 0.0 : std::fabs(bias[static_cast<size_t>(e)]);
        for (int64_t i = 0; i < hidden; ++i) sum += std::fabs(static_cast<double>(w[static_cast<size_t>(e * hidden + i)]) * xr[i] * norm);
        r.scale[static_cast<size_t>(e)] = sum;
      }
      std::vector<RouteRow>& layers = log_[{s.id, s.start + j}];
      if (static_cast<int64_t>(layers.size()) <= layer) layers.resize(static_cast<size_t>(layer + 1));
      layers[static_cast<size_t>(layer)] = std::move(r);
    }
  }
  return Status::ok();
}

bool RouteDifference::near_tie() const { return gap <= kNearTieFraction * scale; }

bool RouteComparison::explains_divergence() const {
  if (differences.empty() || missing > 0) return false;
  return std::all_of(differences.begin(), differences.end(), [](const RouteDifference& d) { return !d.root || d.near_tie(); });
}

std::string RouteComparison::describe() const {
  if (differences.empty()) return "routes identical" + std::string(missing ? " (" + std::to_string(missing) + " missing)" : "");
  int64_t roots = 0;
  std::string s;
  for (const RouteDifference& d : differences) {
    if (!d.root) continue;
    char buf[120];
    std::snprintf(buf, sizeof buf, "%s layer %lld pos %lld gap %.4f = %.2f%% of scale (%s)", roots ? ";" : "",
                  static_cast<long long>(d.layer), static_cast<long long>(d.position), d.gap,
                  100.0 * d.gap / std::max(d.scale, 1e-30), d.near_tie() ? "near tie" : "NOT a near tie");
    s += buf;
    ++roots;
  }
  return std::to_string(differences.size()) + " routing difference(s), " + std::to_string(roots) + " root(s):" + s +
         (missing ? "; " + std::to_string(missing) + " missing" : "");
}

RouteComparison compare_routes(const RouteLog& a, const RouteLog& b, RequestId id, int64_t last_position) {
  RouteComparison c;
  for (int64_t pos = 0; pos <= last_position; ++pos) {
    const auto ia = a.find({id, pos}), ib = b.find({id, pos});
    if (ia == a.end() && ib == b.end()) continue;  // neither computed it (a prefix-cache hit in both)
    const size_t layers = std::max(ia == a.end() ? 0 : ia->second.size(), ib == b.end() ? 0 : ib->second.size());
    if (ia == a.end() || ib == b.end() || ia->second.size() != ib->second.size()) {
      c.missing += static_cast<int64_t>(layers);
      continue;
    }
    for (size_t l = 0; l < layers; ++l) {
      const RouteRow& ra = ia->second[l];
      const RouteRow& rb = ib->second[l];
      if (ra.ids.empty() || rb.ids.empty()) {
        ++c.missing;
        continue;
      }
      bool same = ra.ids.size() == rb.ids.size();
      for (int32_t e : ra.ids) same = same && contains(rb.ids, e);
      if (same) continue;
      RouteDifference d;
      d.layer = static_cast<int64_t>(l);
      d.position = pos;
      d.gap = one_side_gap(ra, ra.ids, rb.ids, &d.scale) + one_side_gap(rb, rb.ids, ra.ids, &d.scale);
      c.differences.push_back(d);
    }
  }
  // A router input at (layer, position) depends on the routes of lower layers at positions up to its own.
  for (RouteDifference& d : c.differences)
    d.root = std::none_of(c.differences.begin(), c.differences.end(), [&](const RouteDifference& o) {
      return o.layer < d.layer && o.position <= d.position;
    });
  return c;
}

}  // namespace mx::test
