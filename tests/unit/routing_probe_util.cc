#include "routing_probe_util.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/dtype.h"

namespace mx::test {
namespace {

float load(const TensorView& t, int64_t i) {
  return t.dtype() == DType::kBF16 ? bf16_to_f32(t.ptr<const uint16_t>()[i]) : t.ptr<const float>()[i];
}

// sum_i |w[e, i] x[t, i]| + |b[e]|: how far a small relative error in x can move expert e's logit.
double condition_scale(const RouterParams& p, int64_t t, int32_t e) {
  const int64_t h = p.weight.dim(1);
  const float* x = p.x.ptr<const float>() + t * h;
  // Gemma-4's router normalizes x first (x_norm_eps > 0): the logit sees x / rms(x).
  double inv_rms = 1.0;
  if (p.x_norm_eps > 0) {
    double sq = 0;
    for (int64_t i = 0; i < h; ++i) sq += static_cast<double>(x[i]) * x[i];
    inv_rms = 1.0 / std::sqrt(sq / static_cast<double>(h) + p.x_norm_eps);
  }
  double s = 0;
  for (int64_t i = 0; i < h; ++i) s += std::fabs(static_cast<double>(load(p.weight, e * h + i)) * x[i]);
  return s * inv_rms + (p.bias.empty() ? 0.0 : std::fabs(load(p.bias, e)));  // Gemma-4 routers have no bias
}

bool contains(const int32_t* ids, int64_t k, int32_t e) { return std::find(ids, ids + k, e) != ids + k; }

}  // namespace

bool RoutingProbe::all_flips_near_ties() const {
  return std::all_of(flips_.begin(), flips_.end(), [](const RoutingFlip& f) { return f.near_tie(); });
}

std::string RoutingProbe::describe_flips() const {
  std::string s;
  for (const RoutingFlip& f : flips_) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "%scall %lld token %lld gap %.3g scale %.3g (%.2f%%)", s.empty() ? "" : "; ",
                  static_cast<long long>(f.call), static_cast<long long>(f.token), f.gap, f.scale,
                  100.0 * f.gap / std::max(f.scale, 1e-30));
    s += buf;
  }
  return s.empty() ? "none" : s;
}

Status RoutingProbe::routed(const RouterParams& p) {
  const int64_t call = static_cast<int64_t>(recorded_.size());
  if (forcing_) MX_RETURN_IF_ERROR(force(p, call));
  std::vector<int32_t> ids(static_cast<size_t>(p.topk_ids.numel()));
  MX_RETURN_IF_ERROR(inner().copy_to_host(ids.data(), p.topk_ids));
  recorded_.push_back(std::move(ids));
  return Status::ok();
}

Status RoutingProbe::force(const RouterParams& p, int64_t call) {
  if (inner().device() != Device::kCpu || p.x.dtype() != DType::kF32)
    return invalid_argument("RoutingProbe can only force routing on the CPU backend");
  const int64_t k = p.top_k, e_count = p.weight.dim(0), t_count = p.topk_ids.numel() / k;
  if (call >= static_cast<int64_t>(forced_.size()) ||
      static_cast<int64_t>(forced_[static_cast<size_t>(call)].size()) != t_count * k)
    return invalid_argument("forced route does not match router call " + std::to_string(call));
  const float* logits = p.logits.ptr<const float>();
  int32_t* ids = p.topk_ids.ptr<int32_t>();
  float* weights = p.topk_weights.ptr<float>();
  for (int64_t t = 0; t < t_count; ++t) {
    const float* row = logits + t * e_count;
    int32_t* own = ids + t * k;
    std::vector<int32_t> want(forced_[static_cast<size_t>(call)].begin() + t * k,
                              forced_[static_cast<size_t>(call)].begin() + (t + 1) * k);
    bool same = true;
    for (int32_t e : want) same = same && contains(own, k, e);
    if (same) continue;
    // gap: the weakest expert the fp32 router kept but the forced route dropped, minus the strongest one the
    // forced route took instead (>= 0, since the fp32 router keeps the largest logits).
    double weakest_kept = INFINITY, strongest_taken = -INFINITY, scale = 0;
    for (int64_t i = 0; i < k; ++i) {
      if (!contains(want.data(), k, own[i])) {
        weakest_kept = std::min<double>(weakest_kept, row[own[i]]);
        scale = std::max(scale, condition_scale(p, t, own[i]));
      }
      if (!contains(own, k, want[static_cast<size_t>(i)])) {
        strongest_taken = std::max<double>(strongest_taken, row[want[static_cast<size_t>(i)]]);
        scale = std::max(scale, condition_scale(p, t, want[static_cast<size_t>(i)]));
      }
    }
    flips_.push_back({call, t, weakest_kept - strongest_taken, scale});
    // Use the forced set, ordered and weighted by this backend's own logits (as router_topk would), times
    // the per-expert scales where the router has them (Gemma-4).
    std::sort(want.begin(), want.end(),
              [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    const float top = row[want[0]];
    float sum = 0;
    for (int32_t e : want) sum += std::exp(row[e] - top);
    for (int64_t i = 0; i < k; ++i) {
      own[i] = want[static_cast<size_t>(i)];
      const float expert_scale = p.expert_scale.empty() ? 1.0f : load(p.expert_scale, own[i]);
      weights[t * k + i] = std::exp(row[own[i]] - top) / sum * expert_scale;
    }
  }
  return Status::ok();
}

}  // namespace mx::test
