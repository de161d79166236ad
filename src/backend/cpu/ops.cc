#include "backend/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

namespace mx::cpu {
namespace {

// Dot product with several partial sums: lets the compiler vectorize and keeps fp32 rounding small.
float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float tail = 0;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

void widen_row(const TensorView& t, int64_t offset, int64_t n, float* out) {
  if (t.dtype() == DType::kF32) {
    std::copy_n(t.ptr<const float>() + offset, n, out);
  } else {
    MX_CHECK(t.dtype() == DType::kBF16) << dtype_name(t.dtype());
    const uint16_t* src = t.ptr<const uint16_t>() + offset;
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(src[i]);
  }
}

void normalize_row(const float* x, const TensorView& weight, float eps, int64_t h, float* out) {
  double sum_sq = 0;
  for (int64_t i = 0; i < h; ++i) sum_sq += static_cast<double>(x[i]) * x[i];
  const float inv = 1.0f / std::sqrt(static_cast<float>(sum_sq / static_cast<double>(h)) + eps);
  if (weight.empty()) {  // weightless (Gemma-4's v_norm and router norm)
    for (int64_t i = 0; i < h; ++i) out[i] = x[i] * inv;
    return;
  }
  for (int64_t i = 0; i < h; ++i) out[i] = load_f32(weight, i) * (x[i] * inv);
}

int64_t cache_offset(const KvLayerView& kv, const BatchView& batch, int64_t seq, int64_t pos, int64_t n_kv,
                     int64_t head_dim) {
  const TensorView& table = batch.page_table(kv.group);
  const int64_t max_pages = table.dim(1);
  const int64_t logical_page = pos / kv.page_size;
  MX_CHECK_LT(logical_page, max_pages);
  const int64_t page = table.ptr<const int32_t>()[seq * max_pages + logical_page];
  MX_CHECK(page >= 0 && page < kv.k.dim(0)) << "page " << page;
  return ((page * kv.page_size) + pos % kv.page_size) * n_kv * head_dim;
}

float silu_alpha(float gate, float alpha) { return gate / (1.0f + std::exp(-alpha * gate)); }

// RoPE at one position (NeoX halves), for qkv_rope and the attention's Q rotation alike: the fp32 angle
// pos * inv_freq[i] as in the reference, cos and sin rounded once from double, times `scale` (the YaRN concentration).
class RopeRotation {
 public:
  explicit RopeRotation(int64_t head_dim) : half_(head_dim / 2), cos_(static_cast<size_t>(half_)), sin_(cos_.size()) {}
  void set(int32_t pos, const float* inv_freq, float scale) {
    for (int64_t i = 0; i < half_; ++i) {
      const float angle = static_cast<float>(pos) * inv_freq[i];
      cos_[static_cast<size_t>(i)] = static_cast<float>(std::cos(static_cast<double>(angle))) * scale;
      sin_[static_cast<size_t>(i)] = static_cast<float>(std::sin(static_cast<double>(angle))) * scale;
    }
  }
  // y = x rotated (one head).
  void rotate(const float* x, float* y) const {
    for (int64_t i = 0; i < half_; ++i) {
      const float c = cos_[static_cast<size_t>(i)], s = sin_[static_cast<size_t>(i)];
      const float a = x[i], b = x[i + half_];
      y[i] = a * c - b * s;
      y[i + half_] = b * c + a * s;
    }
  }

 private:
  int64_t half_;
  std::vector<float> cos_, sin_;
};

}  // namespace

float load_f32(const TensorView& t, int64_t i) {
  if (t.dtype() == DType::kF32) return t.ptr<const float>()[i];
  MX_CHECK(t.dtype() == DType::kBF16) << dtype_name(t.dtype());
  return bf16_to_f32(t.ptr<const uint16_t>()[i]);
}

void embedding(const TensorView& table, const TensorView& token_ids, TensorView out) {
  const int64_t vocab = table.dim(0), h = table.dim(1);
  for (int64_t t = 0; t < token_ids.numel(); ++t) {
    const int32_t id = token_ids.ptr<const int32_t>()[t];
    MX_CHECK(id >= 0 && id < vocab) << "token id " << id;
    widen_row(table, id * h, h, out.ptr<float>() + t * h);
  }
}

void rms_norm(const TensorView& x, const TensorView& weight, float eps, TensorView out) {
  const int64_t h = x.dim(-1), rows = x.numel() / h;
  for (int64_t r = 0; r < rows; ++r) normalize_row(x.ptr<const float>() + r * h, weight, eps, h, out.ptr<float>() + r * h);
}

void soft_cap(TensorView x, float cap) {
  MX_CHECK(x.dtype() == DType::kF32) << "CPU activations are f32";
  MX_CHECK(cap > 0.0f) << cap;
  float* v = x.ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) v[i] = cap * std::tanh(v[i] / cap);
}

float gelu_tanh(float x) {
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + std::tanh(k * (x + 0.044715f * x * x * x)));
}

void gelu_tanh_mul(const TensorView& gate, const TensorView& up, TensorView out) {
  MX_CHECK_EQ(gate.numel(), up.numel());
  MX_CHECK_EQ(gate.numel(), out.numel());
  const float* g = gate.ptr<const float>();
  const float* u = up.ptr<const float>();
  float* o = out.ptr<float>();
  for (int64_t i = 0; i < out.numel(); ++i) o[i] = gelu_tanh(g[i]) * u[i];
}

void geglu(const TensorView& gate_up, TensorView out) {
  const int64_t inter = out.dim(-1), rows = out.numel() / inter;
  MX_CHECK_EQ(gate_up.numel(), 2 * rows * inter);
  const float* gu = gate_up.ptr<const float>();
  float* o = out.ptr<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < inter; ++i) o[r * inter + i] = gelu_tanh(gu[2 * r * inter + i]) * gu[(2 * r + 1) * inter + i];
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }

void silu_mul(const TensorView& gate, const TensorView& up, TensorView out) {
  MX_CHECK_EQ(gate.numel(), up.numel());
  MX_CHECK_EQ(gate.numel(), out.numel());
  const float* g = gate.ptr<const float>();
  const float* u = up.ptr<const float>();
  float* o = out.ptr<float>();
  for (int64_t i = 0; i < out.numel(); ++i) o[i] = silu(g[i]) * u[i];
}

void convert(const TensorView& x, TensorView out) {
  MX_CHECK_EQ(x.numel(), out.numel());
  MX_CHECK(out.dtype() == DType::kF32 || out.dtype() == DType::kBF16) << dtype_name(out.dtype());
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float v = load_f32(x, i);
    if (out.dtype() == DType::kF32) out.ptr<float>()[i] = v;
    else out.ptr<uint16_t>()[i] = f32_to_bf16(v);
  }
}

void scale_by(TensorView x, const TensorView& factor) {
  MX_CHECK_EQ(factor.numel(), 1);
  const float f = load_f32(factor, 0);
  float* v = x.ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) v[i] *= f;
}

void add_rms_norm(TensorView residual, const TensorView& delta, const TensorView& weight, float eps, TensorView out) {
  const int64_t h = residual.dim(-1), rows = residual.numel() / h;
  float* res = residual.ptr<float>();
  const float* d = delta.ptr<const float>();
  for (int64_t i = 0; i < rows * h; ++i) res[i] += d[i];
  for (int64_t r = 0; r < rows; ++r) normalize_row(res + r * h, weight, eps, h, out.ptr<float>() + r * h);
}

void linear(ThreadPool& pool, const TensorView& x, const TensorView& weight, const TensorView& bias, TensorView out) {
  const int64_t n = weight.dim(0), k = weight.dim(1), t_count = x.numel() / k;
  MX_CHECK_EQ(out.numel(), t_count * n);
  MX_CHECK(out.dtype() == DType::kF32) << "CPU activations are f32";
  const float* xs = x.ptr<const float>();
  float* ys = out.ptr<float>();
  // Each weight row is widened once and applied to every token.
  pool.parallel_for(n, 64, [&](int64_t begin, int64_t end) {
    std::vector<float> w(static_cast<size_t>(k));
    for (int64_t row = begin; row < end; ++row) {
      widen_row(weight, row * k, k, w.data());
      const float b = bias.empty() ? 0.0f : load_f32(bias, row);
      for (int64_t t = 0; t < t_count; ++t) ys[t * n + row] = dot(xs + t * k, w.data(), k) + b;
    }
  });
}

void linear_fp8(ThreadPool& pool, const TensorView& x, const TensorView& weight, const TensorView& scale,
                const TensorView& bias, TensorView out) {
  const int64_t n = weight.dim(0), k = weight.dim(1), t_count = x.numel() / k;
  MX_CHECK(weight.dtype() == DType::kF8E4M3) << dtype_name(weight.dtype());
  MX_CHECK(scale.dtype() == DType::kF32 && scale.numel() == n) << "scale " << dtype_name(scale.dtype());
  MX_CHECK_EQ(out.numel(), t_count * n);
  MX_CHECK(out.dtype() == DType::kF32) << "CPU activations are f32";
  const float* xs = x.ptr<const float>();
  const uint8_t* ws = weight.ptr<const uint8_t>();
  float* ys = out.ptr<float>();
  pool.parallel_for(n, 64, [&](int64_t begin, int64_t end) {
    std::vector<float> w(static_cast<size_t>(k));
    for (int64_t row = begin; row < end; ++row) {
      for (int64_t i = 0; i < k; ++i) w[i] = fp8e4m3_to_f32(ws[row * k + i]);
      const float s = scale.ptr<const float>()[row];
      const float b = bias.empty() ? 0.0f : load_f32(bias, row);
      for (int64_t t = 0; t < t_count; ++t) ys[t * n + row] = s * dot(xs + t * k, w.data(), k) + b;
    }
  });
}

void qkv_rope(const QkvRopeParams& p, const BatchView& batch) {
  const int64_t hd = p.head_dim, width = (p.n_q + 2 * p.n_kv) * hd;
  if (p.norm_eps > 0) qkv_norms(QkvNormParams{p.qkv, p.q_norm, p.k_norm, p.n_q, p.n_kv, hd, p.norm_eps});
  RopeRotation rope(hd);
  for (int64_t t = 0; t < batch.num_tokens; ++t) {
    const int32_t pos = batch.positions.ptr<const int32_t>()[t];
    const int32_t seq = batch.token_seq.ptr<const int32_t>()[t];
    rope.set(pos, p.inv_freq.ptr<const float>(), p.rope_scale);
    const float* row = p.qkv.ptr<const float>() + t * width;
    if (!p.q_out.empty())  // else the attention rotates Q (AttentionParams::q_inv_freq)
      for (int64_t h = 0; h < p.n_q; ++h) rope.rotate(row + h * hd, p.q_out.ptr<float>() + (t * p.n_q + h) * hd);
    const int64_t off = cache_offset(p.kv, batch, seq, pos, p.n_kv, hd);
    for (int64_t h = 0; h < p.n_kv; ++h) {
      rope.rotate(row + (p.n_q + h) * hd, p.kv.k.ptr<float>() + off + h * hd);
      std::copy_n(row + (p.n_q + p.n_kv + h) * hd, hd, p.kv.v.ptr<float>() + off + h * hd);
    }
  }
}

void attention(ThreadPool& pool, const AttentionParams& p, const BatchView& batch) {
  const int64_t hd = p.head_dim, group = p.n_q / p.n_kv;
  // With q_inv_freq, q is the q|k|v projection: each (token, head) row is rotated here as qkv_rope does.
  const bool rope = !p.q_inv_freq.empty();
  const int64_t q_stride = rope ? (p.n_q + 2 * p.n_kv) * hd : p.n_q * hd;
  pool.parallel_for(batch.num_tokens * p.n_q, 4, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    std::vector<float> acc(static_cast<size_t>(hd)), q_rot(rope ? static_cast<size_t>(hd) : 0);
    RopeRotation rotation(rope ? hd : 0);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / p.n_q, h = item % p.n_q, g = h / group;
      const int32_t pos = batch.positions.ptr<const int32_t>()[t];
      const int32_t seq = batch.token_seq.ptr<const int32_t>()[t];
      const int64_t first = p.window > 0 ? std::max<int64_t>(0, pos - p.window + 1) : 0;
      const float* q = p.q.ptr<const float>() + t * q_stride + h * hd;
      if (rope) {
        rotation.set(pos, p.q_inv_freq.ptr<const float>(), p.q_rope_scale);
        rotation.rotate(q, q_rot.data());
        q = q_rot.data();
      }
      const bool has_sink = !p.sinks.empty();
      const float sink = has_sink ? load_f32(p.sinks, h) : 0.0f;
      scores.resize(static_cast<size_t>(pos - first + 1));
      float max_logit = has_sink ? sink : -std::numeric_limits<float>::infinity();
      for (int64_t j = first; j <= pos; ++j) {
        const float* k = p.kv.k.ptr<const float>() + cache_offset(p.kv, batch, seq, j, p.n_kv, hd) + g * hd;
        const float s = dot(q, k, hd) * p.softmax_scale;
        scores[j - first] = s;
        max_logit = std::max(max_logit, s);
      }
      float denom = has_sink ? std::exp(sink - max_logit) : 0.0f;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = first; j <= pos; ++j) {
        const float w = std::exp(scores[j - first] - max_logit);
        denom += w;
        const float* v = p.kv.v.ptr<const float>() + cache_offset(p.kv, batch, seq, j, p.n_kv, hd) + g * hd;
        for (int64_t d = 0; d < hd; ++d) acc[d] += w * v[d];
      }
      float* o = p.out.ptr<float>() + (t * p.n_q + h) * hd;
      for (int64_t d = 0; d < hd; ++d) o[d] = acc[d] / denom;
    }
  });
}

void router_topk(const RouterParams& p) {
  const int64_t e_count = p.weight.dim(0), h = p.weight.dim(1), t_count = p.x.numel() / h;
  std::vector<float> w(static_cast<size_t>(h)), normed;
  const float* x = p.x.ptr<const float>();
  if (p.x_norm_eps > 0.0f || !p.x_scale.empty()) {  // the weightless norm first, as unit_rms_norm computes it
    normed.assign(x, x + t_count * h);
    if (p.x_norm_eps > 0.0f)
      for (int64_t t = 0; t < t_count; ++t) normalize_row(x + t * h, TensorView(), p.x_norm_eps, h, normed.data() + t * h);
    if (!p.x_scale.empty()) {  // then the per-dimension scale
      MX_CHECK(p.x_scale.numel() == h) << "router x_scale is not [hidden]";
      std::vector<float> scale(static_cast<size_t>(h));
      widen_row(p.x_scale, 0, h, scale.data());
      for (int64_t i = 0; i < t_count * h; ++i) normed[static_cast<size_t>(i)] *= scale[static_cast<size_t>(i % h)];
    }
    x = normed.data();
  }
  float* logits = p.logits.ptr<float>();
  for (int64_t e = 0; e < e_count; ++e) {
    widen_row(p.weight, e * h, h, w.data());
    const float b = p.bias.empty() ? 0.0f : load_f32(p.bias, e);
    for (int64_t t = 0; t < t_count; ++t) logits[t * e_count + e] = dot(x + t * h, w.data(), h) + b;
  }
  std::vector<int32_t> order(static_cast<size_t>(e_count));
  for (int64_t t = 0; t < t_count; ++t) {
    const float* row = logits + t * e_count;
    std::iota(order.begin(), order.end(), 0);
    // Highest logit first; equal logits keep the lower expert index first.
    std::partial_sort(order.begin(), order.begin() + p.top_k, order.end(),
                      [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    const float top = row[order[0]];
    float sum = 0;
    for (int64_t i = 0; i < p.top_k; ++i) sum += std::exp(row[order[i]] - top);
    for (int64_t i = 0; i < p.top_k; ++i) {
      p.topk_ids.ptr<int32_t>()[t * p.top_k + i] = order[i];
      const float scale = p.expert_scale.empty() ? 1.0f : load_f32(p.expert_scale, order[i]);
      p.topk_weights.ptr<float>()[t * p.top_k + i] = std::exp(row[order[i]] - top) / sum * scale;
    }
  }
}

void dequantize_mxfp4_row(const uint8_t* blocks, const uint8_t* scales, int64_t k, float* out) {
  for (int64_t g = 0; g < k / 32; ++g) {
    const float scale = e8m0_to_f32(scales[g]);
    const uint8_t* b = blocks + g * 16;
    for (int j = 0; j < 16; ++j) {
      out[g * 32 + 2 * j] = fp4e2m1_to_f32(b[j] & 0xf) * scale;
      out[g * 32 + 2 * j + 1] = fp4e2m1_to_f32(b[j] >> 4) * scale;
    }
  }
}

void moe_experts(ThreadPool& pool, const MoeParams& p) {
  const ExpertWeights& w = *p.experts;
  MX_CHECK(w.layout == ExpertLayout::kMxfp4Checkpoint);
  const int64_t h = w.hidden, inter = w.intermediate, k = p.top_k, t_count = p.x.numel() / h;
  const int32_t* ids = p.topk_ids.ptr<const int32_t>();
  // Slots (token, k) routed to each expert, so each expert's weight rows are dequantized once.
  std::vector<std::vector<int64_t>> slots(static_cast<size_t>(w.num_experts));
  const int64_t routed = p.routed_experts > 0 ? p.routed_experts : w.num_experts;
  std::vector<bool> here(static_cast<size_t>(t_count * k));  // slot's expert is one of this rank's
  for (int64_t s = 0; s < t_count * k; ++s) {
    MX_CHECK(ids[s] >= 0 && ids[s] < routed) << "expert " << ids[s];
    const int64_t local = ids[s] - p.first_expert;
    if (local < 0 || local >= w.num_experts) continue;
    here[static_cast<size_t>(s)] = true;
    slots[static_cast<size_t>(local)].push_back(s);
  }
  std::vector<float> act(static_cast<size_t>(t_count * k * inter));
  std::vector<float> y(static_cast<size_t>(t_count * k * h));
  const float* x = p.x.ptr<const float>();
  const int64_t w1_row_bytes = h / 2, w2_row_bytes = inter / 2;
  for (int64_t e = 0; e < w.num_experts; ++e) {
    const auto& mine = slots[static_cast<size_t>(e)];
    if (mine.empty()) continue;
    // First GEMM: 2I interleaved rows, then the clamped SwiGLU with +1 on the linear half.
    pool.parallel_for(inter, 16, [&](int64_t begin, int64_t end) {
      std::vector<float> gate_w(static_cast<size_t>(h)), up_w(static_cast<size_t>(h));
      for (int64_t j = begin; j < end; ++j) {
        const int64_t gate_row = e * 2 * inter + 2 * j, up_row = gate_row + 1;
        dequantize_mxfp4_row(w.w1_blocks.ptr<const uint8_t>() + gate_row * w1_row_bytes,
                             w.w1_scales.ptr<const uint8_t>() + gate_row * (h / 32), h, gate_w.data());
        dequantize_mxfp4_row(w.w1_blocks.ptr<const uint8_t>() + up_row * w1_row_bytes,
                             w.w1_scales.ptr<const uint8_t>() + up_row * (h / 32), h, up_w.data());
        const float gate_b = load_f32(w.w1_bias, gate_row), up_b = load_f32(w.w1_bias, up_row);
        for (int64_t s : mine) {
          const float* xt = x + (s / k) * h;
          const float gate = std::min(dot(xt, gate_w.data(), h) + gate_b, p.swiglu_limit);
          const float up = std::clamp(dot(xt, up_w.data(), h) + up_b, -p.swiglu_limit, p.swiglu_limit);
          act[s * inter + j] = silu_alpha(gate, p.swiglu_alpha) * (up + 1.0f);
        }
      }
    });
    // Second GEMM with its bias; the routing weight is applied in the combine below.
    pool.parallel_for(h, 16, [&](int64_t begin, int64_t end) {
      std::vector<float> row(static_cast<size_t>(inter));
      for (int64_t r = begin; r < end; ++r) {
        const int64_t w_row = e * h + r;
        dequantize_mxfp4_row(w.w2_blocks.ptr<const uint8_t>() + w_row * w2_row_bytes,
                             w.w2_scales.ptr<const uint8_t>() + w_row * (inter / 32), inter, row.data());
        const float b = load_f32(w.w2_bias, w_row);
        for (int64_t s : mine) y[s * h + r] = dot(act.data() + s * inter, row.data(), inter) + b;
      }
    });
  }
  // Deterministic combine: the k slots of a token in router order, whatever the threading.
  float* out = p.out.ptr<float>();
  const float* weights = p.topk_weights.ptr<const float>();
  for (int64_t t = 0; t < t_count; ++t) {
    for (int64_t i = 0; i < h; ++i) {
      float sum = 0;
      for (int64_t j = 0; j < k; ++j)
        if (here[static_cast<size_t>(t * k + j)]) sum += weights[t * k + j] * y[(t * k + j) * h + i];
      out[t * h + i] = sum;
    }
  }
}

void qkv_norms(const QkvNormParams& p) {
  const int64_t hd = p.head_dim, heads = p.n_q + 2 * p.n_kv, t_count = p.qkv.numel() / (heads * hd);
  float* base = p.qkv.ptr<float>();
  for (int64_t t = 0; t < t_count; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      float* x = base + (t * heads + h) * hd;
      const TensorView& weight = h < p.n_q ? p.q_norm : h < p.n_q + p.n_kv ? p.k_norm : TensorView();
      normalize_row(x, weight, p.eps, hd, x);  // reads a row fully before writing it
    }
}

void gemma_attention_end(const GemmaAttentionEndParams& p) {
  const int64_t h = p.residual.dim(-1), rows = p.residual.numel() / h;
  std::vector<float> normed(static_cast<size_t>(h));
  for (int64_t r = 0; r < rows; ++r) {
    float* res = p.residual.ptr<float>() + r * h;
    normalize_row(p.attn_out.ptr<const float>() + r * h, p.post_attention_norm, p.eps, h, normed.data());
    for (int64_t i = 0; i < h; ++i) res[i] += normed[static_cast<size_t>(i)];
    normalize_row(res, p.pre_mlp_norm, p.eps, h, p.mlp_in.ptr<float>() + r * h);
    if (!p.pre_moe_norm.empty()) normalize_row(res, p.pre_moe_norm, p.eps, h, p.moe_in.ptr<float>() + r * h);
  }
}

void gemma_layer_end(const GemmaLayerEndParams& p) {
  const int64_t h = p.residual.dim(-1), rows = p.residual.numel() / h;
  const float scalar = p.layer_scalar.empty() ? 1.0f : load_f32(p.layer_scalar, 0);
  std::vector<float> f(static_cast<size_t>(h)), moe(static_cast<size_t>(h));
  for (int64_t r = 0; r < rows; ++r) {
    normalize_row(p.dense.ptr<const float>() + r * h, p.post_mlp_norm, p.eps, h, f.data());
    if (!p.moe.empty()) {
      normalize_row(p.moe.ptr<const float>() + r * h, p.post_moe_norm, p.eps, h, moe.data());
      for (size_t i = 0; i < f.size(); ++i) f[i] += moe[i];
      normalize_row(f.data(), p.post_ffn_norm, p.eps, h, f.data());  // reads the row fully before writing it
    }
    float* res = p.residual.ptr<float>() + r * h;
    for (int64_t i = 0; i < h; ++i) res[i] = (res[i] + f[static_cast<size_t>(i)]) * scalar;
    normalize_row(res, p.next_norm, p.eps, h, p.next_in.ptr<float>() + r * h);
  }
}

void moe_geglu_experts(ThreadPool& pool, const GegluMoeParams& p) {
  const int64_t e_count = p.gate_up.dim(0), inter = p.gate_up.dim(1) / 2, h = p.gate_up.dim(2);
  const int64_t k = p.top_k, t_count = p.x.numel() / h;
  const int32_t* ids = p.topk_ids.ptr<const int32_t>();
  std::vector<std::vector<int64_t>> slots(static_cast<size_t>(e_count));
  for (int64_t s = 0; s < t_count * k; ++s) {
    MX_CHECK(ids[s] >= 0 && ids[s] < e_count) << "expert " << ids[s];
    slots[static_cast<size_t>(ids[s])].push_back(s);
  }
  std::vector<float> act(static_cast<size_t>(t_count * k * inter));
  std::vector<float> y(static_cast<size_t>(t_count * k * h));
  const float* x = p.x.ptr<const float>();
  for (int64_t e = 0; e < e_count; ++e) {
    const auto& mine = slots[static_cast<size_t>(e)];
    if (mine.empty()) continue;
    pool.parallel_for(inter, 16, [&](int64_t begin, int64_t end) {
      std::vector<float> gate_w(static_cast<size_t>(h)), up_w(static_cast<size_t>(h));
      for (int64_t j = begin; j < end; ++j) {
        widen_row(p.gate_up, (e * 2 * inter + j) * h, h, gate_w.data());
        widen_row(p.gate_up, (e * 2 * inter + inter + j) * h, h, up_w.data());
        for (int64_t s : mine) {
          const float* xt = x + (s / k) * h;
          act[s * inter + j] = gelu_tanh(dot(xt, gate_w.data(), h)) * dot(xt, up_w.data(), h);
        }
      }
    });
    pool.parallel_for(h, 16, [&](int64_t begin, int64_t end) {
      std::vector<float> row(static_cast<size_t>(inter));
      for (int64_t r = begin; r < end; ++r) {
        widen_row(p.down, (e * h + r) * inter, inter, row.data());
        for (int64_t s : mine) y[s * h + r] = dot(act.data() + s * inter, row.data(), inter);
      }
    });
  }
  // Deterministic combine: the k slots of a token in router order.
  float* out = p.out.ptr<float>();
  const float* weights = p.topk_weights.ptr<const float>();
  for (int64_t t = 0; t < t_count; ++t)
    for (int64_t i = 0; i < h; ++i) {
      float sum = 0;
      for (int64_t j = 0; j < k; ++j) sum += weights[t * k + j] * y[(t * k + j) * h + i];
      out[t * h + i] = sum;
    }
}

// Whole rows as bytes, so any dtype (f32 activations, bf16 tables, i32 ids) gathers exactly.
void gather_rows(const TensorView& x, const TensorView& rows, TensorView out) {
  MX_CHECK(out.dtype() == x.dtype()) << "gather_rows: out dtype differs from x";
  const int64_t row_bytes = x.bytes() / x.dim(0);
  MX_CHECK(out.bytes() >= rows.numel() * row_bytes) << "gather_rows: out holds fewer rows than asked";
  const auto* src_bytes = static_cast<const uint8_t*>(x.data());
  auto* dst_bytes = static_cast<uint8_t*>(out.data());
  for (int64_t r = 0; r < rows.numel(); ++r) {
    const int32_t src = rows.ptr<const int32_t>()[r];
    MX_CHECK(src >= 0 && src < x.dim(0)) << "row " << src;
    std::memcpy(dst_bytes + r * row_bytes, src_bytes + src * row_bytes, static_cast<size_t>(row_bytes));
  }
}

}  // namespace mx::cpu
