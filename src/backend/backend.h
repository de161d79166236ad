// Backend: the ops a model needs, implemented by the CPU reference (fp32) and CUDA (bf16 + fp32 accumulation).
// Ops take plain parameter structs of TensorViews in the backend's memory and write into preallocated
// outputs, so a forward pass allocates nothing (CUDA captures it in a graph). Sizes are validated by the
// model at load time; ops CHECK their invariants, they never see raw user input.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/buffer.h"
#include "backend/sampling_math.h"
#include "core/log.h"
#include "core/status.h"
#include "core/tensor_view.h"

namespace mx {

// Layer groups (KvLayout in kv_cache.h) a batch can carry page tables for.
inline constexpr int64_t kMaxKvGroups = 4;
// A page-table slot whose page a sliding-window group has released: below every query's window, never read.
inline constexpr int32_t kNoPage = -1;

// One forward pass's tokens, flattened over its sequences, in backend memory.
// Prefill, chunked prefill, decode and verification (several query rows per sequence) all use it: a token
// at `position` p attends to keys 0..p of its sequence (windowed layers: the last `window` of them); those
// before this batch are already in the KV cache. Every layer group has its own page pool and so its own page
// table: a layer reads page_table(kv.group). A batch with one table uses it for every group (pools with the
// same page numbering: the static generator, tests).
struct BatchView {
  int64_t num_tokens = 0;   // T
  int64_t num_seqs = 0;     // S
  TensorView token_ids;     // i32 [T]
  TensorView positions;     // i32 [T] absolute position of each token within its sequence
  TensorView token_seq;     // i32 [T] index of each token's sequence in [0, S)
  // Per layer group g < num_kv_groups: i32 [S, max_pages_per_seq] physical page of each logical page in g's
  // pool (kNoPage where a window group released it; kernels treat it as absent and never need it).
  TensorView page_tables[kMaxKvGroups];
  int64_t num_kv_groups = 1;
  TensorView logit_rows;    // i32 [R] token rows whose logits are wanted, in output order
  int64_t num_logit_rows = 0;  // R
  int64_t max_position = 0;    // largest value in `positions` (host copy, sizes grids)
  int64_t max_seq_tokens = 0;  // most tokens of one sequence in this batch (host copy; 0 = unknown)

  const TensorView& page_table(int64_t group) const {
    if (num_kv_groups == 1) return page_tables[0];
    MX_CHECK(group >= 0 && group < num_kv_groups) << "layer group " << group << " of " << num_kv_groups;
    return page_tables[group];
  }
};

// One layer's paged KV cache: page p holds positions [p*P, (p+1)*P) of the sequence that owns it.
struct KvLayerView {
  TensorView k;  // [num_pages, page_size, n_kv, head_dim], RoPE already applied
  TensorView v;  // [num_pages, page_size, n_kv, head_dim]
  int64_t page_size = 0;
  int64_t group = 0;  // the layer group (KvLayout) whose pool holds these pages
};

struct QkvRopeParams {
  TensorView qkv;        // [T, (n_q + 2 n_kv) * head_dim] output of the fused q|k|v projection
  TensorView q_out;      // [T, n_q * head_dim] queries after RoPE; empty: RoPE for Q is left to the attention
                         // (AttentionParams::q_inv_freq), only K and V are written
  KvLayerView kv;        // keys (after RoPE) and values are written at each token's position
  TensorView inv_freq;   // f32 [head_dim / 2] YaRN-adjusted inverse frequencies
  float rope_scale = 1;  // YaRN concentration: multiplies cos and sin (so q.k carries its square)
  int64_t n_q = 0, n_kv = 0, head_dim = 0;
  // Gemma-4: norm_eps > 0 runs the per-head RMSNorms of qkv_norms (q heads times q_norm, k heads times
  // k_norm, v heads weightless) first, in the same op (one launch at decode); qkv is scratch afterwards.
  TensorView q_norm, k_norm;  // bf16 [head_dim], with norm_eps > 0
  float norm_eps = 0;
  // A weight the step reads after the attention (Gemma-4: o_proj), pulled into the L2 while this op and the
  // attention run, where the backend does so (CUDA: the Gemma-4 form at decode, CudaL2PrefetchOptions): at one
  // token both leave HBM idle. A hint: never read as data; empty = none.
  TensorView prefetch;
};

struct AttentionParams {
  TensorView q;          // [T, n_q * head_dim] after RoPE (or, with q_inv_freq, the q|k|v projection)
  KvLayerView kv;
  TensorView sinks;      // bf16 [n_q]: one extra logit per head in the softmax denominator, no value; empty =
                         // no sinks (Gemma-4)
  TensorView out;        // [T, n_q * head_dim]
  int64_t n_q = 0, n_kv = 0, head_dim = 0;
  int64_t window = 0;    // keys visible to a query, itself included; 0 = all earlier keys
  float softmax_scale = 1;
  // RoPE for Q in the attention (after a qkv_rope with q_out empty): q is the q|k|v projection
  // [T, (n_q + 2 n_kv) head_dim] and its first n_q heads are rotated as qkv_rope would (q_inv_freq f32
  // [head_dim / 2], q_rope_scale). CUDA's window kernel rotates Q as it loads it (no Q written and read back);
  // other kernels get it rotated into scratch first. Empty: q holds the rotated queries.
  TensorView q_inv_freq{};
  float q_rope_scale = 1;
};

struct RouterParams {
  TensorView x;             // [T, H]
  TensorView weight;        // bf16 [E, H] (the CPU also takes f32)
  TensorView bias;          // bf16 [E]; empty = none (Gemma-4)
  TensorView logits;        // f32 [T, E] (written; fp32 so top-k is not decided by bf16 rounding)
  TensorView topk_ids;      // i32 [T, k], descending by logit
  TensorView topk_weights;  // f32 [T, k] softmax over the k selected logits
  int64_t top_k = 0;
  // bf16/f32 [E] or empty: multiplies each selected expert's weight after the softmax (Gemma-4's
  // per_expert_scale). CUDA runs it, the fused norm and x_scale on Gemma-4's router kernel (no bias; it
  // needs the x_scale).
  TensorView expert_scale;
  // > 0: x is first RMS-normalized without a weight, with this epsilon (Gemma-4's router norm, fused into
  // the router so that decode routes in one launch); x may then be the f32 residual stream.
  float x_norm_eps = 0.0f;
  // f32 [H] or empty: x (after the norm) times this per dimension before the logits (Gemma-4: learned scale
  // * H^-1/2 beside the checkpoint's bf16 weight, half the bytes of a weight with them folded in, f32).
  TensorView x_scale;
};

// Per-head RMSNorms of a fused q|k|v projection, in place: q heads times q_norm, k heads times k_norm,
// v heads without a weight (Gemma-4). Runs before qkv_rope.
struct QkvNormParams {
  TensorView qkv;     // [T, (n_q + 2 n_kv) * head_dim]
  TensorView q_norm;  // bf16 [head_dim]
  TensorView k_norm;  // bf16 [head_dim]
  int64_t n_q = 0, n_kv = 0, head_dim = 0;
  float eps = 1e-6f;
};

// Gemma-4's norms between attention and the feed-forward blocks in one op, per token row (fp32 throughout):
//   residual += rms_norm(attn_out) * post_attention_norm
//   mlp_in = rms_norm(residual) * pre_mlp_norm, moe_in = rms_norm(residual) * pre_moe_norm
struct GemmaAttentionEndParams {
  TensorView attn_out;             // [T, H] o_proj output, activation dtype
  TensorView residual;             // [T, H] residual_dtype(), updated in place
  TensorView post_attention_norm;  // bf16 [H]
  TensorView pre_mlp_norm;         // bf16 [H]
  TensorView pre_moe_norm;         // bf16 [H]; empty (a model without experts) = no moe_in
  TensorView mlp_in, moe_in;       // [T, H] activation dtype
  float eps = 1e-6f;
  // Non-null: then router_topk(*route) of the updated residual (route->x is `residual`), which CUDA runs in the
  // same launch at decode (gemma_attention_end_route.cu: the router no longer waits for this op's grid and
  // reads the residual back).
  const RouterParams* route = nullptr;
};

// Gemma-4's end of a layer and the next layer's input norm in one op, per token row (fp32 throughout):
//   with experts: f = rms_norm(rms_norm(dense) * post_mlp_norm + rms_norm(moe) * post_moe_norm) * post_ffn_norm
//   without:      f = rms_norm(dense) * post_mlp_norm (the caller passes the layer's post-feedforward norm)
//   residual = (residual + f) * layer_scalar[0]
//   next_in = rms_norm(residual) * next_norm (the next layer's input norm, or the final norm)
struct GemmaLayerEndParams {
  TensorView dense;          // [T, H] the dense MLP's output, activation dtype
  TensorView moe;            // [T, H] the experts' output, or empty
  TensorView post_mlp_norm;  // bf16 [H]
  TensorView post_moe_norm;  // bf16 [H], with moe
  TensorView post_ffn_norm;  // bf16 [H], with moe
  TensorView layer_scalar;   // bf16/f32 [1] in backend memory; empty = 1
  TensorView residual;       // [T, H] residual_dtype(), updated in place
  TensorView next_norm;      // bf16 [H]
  TensorView next_in;        // [T, H] activation dtype
  float eps = 1e-6f;
};

// bf16 experts with GeGLU (Gemma-4): per slot, y = down_e(gelu_tanh(gate_e x) * up_e x), no biases;
// out[t] = sum over the k slots of weight * y.
struct GegluMoeParams {
  TensorView x;             // [T, H] normed input
  TensorView topk_ids;      // i32 [T, k]
  TensorView topk_weights;  // f32 [T, k]
  TensorView gate_up;       // bf16 [E, 2I, H]: rows [0, I) gate, [I, 2I) up
  TensorView down;          // bf16 [E, H, I]
  TensorView out;           // [T, H]
  int64_t top_k = 0;
  // The routing was written before the op that precedes this one (Gemma-4 routes before its dense MLP), so
  // CUDA's decode kernels may read it before their programmatic-dependent-launch wait: every kernel of the
  // chain waits for its predecessor before it lets a dependent launch, so the kernels before the previous
  // one are complete when this op's kernels start, and the first expert GEMM's weights go out early.
  bool routing_ready = false;
};

enum class ExpertLayout : uint8_t {
  kMxfp4Checkpoint,  // as stored: blocks [E, R, K/32, 16] (low nibble = even element), e8m0 scales [E, R, K/32]
  // CUDA: weights as the 16-row mma.sync A operand, one 16-byte fragment per lane per 16-row strip and
  // 64-wide k tile (backend/cuda/expert_repack.h documents the permutation). blocks [E, R/16, K/64, 32, 16],
  // scales [E, R/16, K/64, 2, 16] pre-biased by +126; W1's strips pair gate row r with up row r + 8.
  kMxfp4SwapAb,
};

// MXFP4 experts of one layer. W1 rows interleave gate (even) and up/linear (odd).
struct ExpertWeights {
  ExpertLayout layout = ExpertLayout::kMxfp4Checkpoint;
  TensorView w1_blocks;  // u8 [E, 2I, H/32, 16]
  TensorView w1_scales;  // u8 [E, 2I, H/32]
  TensorView w1_bias;    // bf16 [E, 2I]
  TensorView w2_blocks;  // u8 [E, H, I/32, 16]
  TensorView w2_scales;  // u8 [E, H, I/32]
  TensorView w2_bias;    // bf16 [E, H]
  int64_t num_experts = 0, hidden = 0, intermediate = 0;
};

struct MoeParams {
  TensorView x;             // [T, H] normed input
  TensorView topk_ids;      // i32 [T, k]
  TensorView topk_weights;  // f32 [T, k]
  const ExpertWeights* experts = nullptr;
  TensorView out;           // [T, H] = sum over k of weight * (W2 act + b2)
  int64_t top_k = 0;
  float swiglu_limit = 7.0f;
  float swiglu_alpha = 1.702f;
  // Expert parallel (a tensor-parallel rank holds some of the experts): the router picks among
  // `routed_experts` (0 = experts->num_experts); this rank holds experts [first_expert, first_expert +
  // experts->num_experts) and slots routed to the others add nothing here.
  int64_t routed_experts = 0;
  int64_t first_expert = 0;
};

// One token per row of logits, by the algorithm in backend/sampling_math.h (greedy, temperature, top-k,
// top-p, min-p, per-row seed and step); both backends pick the same tokens.
struct SampleParams {
  TensorView logits;    // f32 [R, V]
  TensorView params;    // u8 [R, sizeof(SampleRowParams)]: one SampleRowParams per row
  TensorView tokens;    // i32 [R] out
  TensorView logprobs;  // f32 [R] out: the chosen token's log-softmax of the raw logits; may be empty
  // Grammar masks (sampling_math.h token_allowed), both empty or both set. The op sets the disallowed logits
  // of every masked row to -inf in `logits` before sampling (so a masked row's logprob is over its allowed
  // tokens). Device buffers read by the kernels, so a captured graph replays whatever masks they hold.
  TensorView token_mask;  // i32 [R, ceil(V / 32)]: the bits of each row's mask
  TensorView mask_rows;   // i32 [R]: 1 = apply the row's mask, 0 = the row is unconstrained
};

// Sizes a backend's private scratch (MoE routing and intermediates, attention split partials) once, before
// the first forward, so that forward passes allocate nothing and can be captured in a graph.
struct WorkspaceSpec {
  int64_t max_tokens = 0;        // tokens in one forward pass
  int64_t hidden = 0;            // H
  int64_t intermediate = 0;      // I (per expert)
  int64_t num_experts = 0;       // E
  int64_t top_k = 0;
  int64_t n_q = 0, n_kv = 0, head_dim = 0;
  int64_t max_sample_rows = 0, vocab = 0;  // rows of one sample() call and their length
};

// A recorded sequence of ops that can be replayed without re-issuing them (a CUDA graph). Replays read
// whatever the captured ops' input buffers hold at replay time.
class ReplayGraph {
 public:
  virtual ~ReplayGraph() = default;
  virtual Status replay() = 0;
};

// Device memory as the driver reports it (CUDA: cudaMemGetInfo).
struct DeviceMemory {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};

// GPU timestamps on the ops' stream, for profiling eager steps (CUDA events). `hold` first queues a wait of
// about `seconds` on the device, so that the ops queued after it (within that time) run back to back and
// their marks measure GPU time rather than launch latency.
class DeviceTimer {
 public:
  virtual ~DeviceTimer() = default;
  virtual int64_t capacity() const = 0;
  virtual Status hold(double seconds) = 0;
  virtual Status mark(int64_t slot) = 0;
  // Waits for the marks and returns the milliseconds from slot 0 to each of slots [0, count).
  virtual Result<std::vector<double>> read(int64_t count) = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;
  virtual Device device() const = 0;
  virtual DType activation_dtype() const = 0;  // f32 on the CPU reference, bf16 on CUDA
  // The residual stream's dtype (embedding output, rms_norm input, add_rms_norm's residual). CUDA keeps it
  // in f32: a bf16 residual perturbs router logits enough to flip near-tied experts (tiny fixture, layer 0).
  virtual DType residual_dtype() const { return activation_dtype(); }
  virtual DType kv_dtype() const = 0;

  // Memory.
  virtual Result<Buffer> allocate(int64_t bytes) = 0;
  virtual Status copy_from_host(TensorView dst, const void* src) = 0;
  // The first `prefix_bytes` of every row of `src` (a host array of dst's [rows, ...] shape) into the same
  // place in dst; the rest of each dst row keeps what it held. One copy on CUDA (a page table's used
  // columns: a few KB where the full rows are MBs at long contexts); synchronizes as copy_from_host. The
  // default copies row by row.
  virtual Status copy_row_prefixes_from_host(TensorView dst, const void* src, int64_t prefix_bytes) {
    const int64_t rows = dst.dim(0), row_bytes = rows > 0 ? dst.bytes() / rows : 0;
    if (prefix_bytes < 0 || prefix_bytes > row_bytes) return invalid_argument("row prefix longer than the row");
    const auto* from = static_cast<const uint8_t*>(src);
    auto* to = static_cast<uint8_t*>(dst.data());
    for (int64_t r = 0; prefix_bytes > 0 && r < rows; ++r)
      MX_RETURN_IF_ERROR(copy_from_host(TensorView(to + r * row_bytes, DType::kU8, {prefix_bytes}, dst.device()),
                                        from + r * row_bytes));
    return Status::ok();
  }
  virtual Status copy_to_host(void* dst, const TensorView& src) = 0;
  virtual Status synchronize() = 0;

  // Weights. The result lives in backend memory; a copy, if one is made, is appended to `owner`.
  // The CPU backend returns `host` itself (checkpoint mmap): the caller keeps the host memory alive.
  virtual Result<TensorView> upload_weight(const TensorView& host, std::vector<Buffer>* owner) = 0;
  // Experts may be repacked into a backend-specific layout (reported in the result's `layout`).
  virtual Result<ExpertWeights> upload_experts(const ExpertWeights& host, std::vector<Buffer>* owner) = 0;

  // Ops.
  // out[t] = table[token_ids[t]]; table [V, H] bf16; out in residual_dtype().
  virtual Status embedding(const TensorView& table, const TensorView& token_ids, TensorView out) = 0;
  // out = rms_norm(x) * weight (fp32 math); weight bf16 [H]; x in residual_dtype(), out in activation_dtype().
  virtual Status rms_norm(const TensorView& x, const TensorView& weight, float eps, TensorView out) = 0;
  // residual += delta, then out = rms_norm(residual) * weight.
  virtual Status add_rms_norm(TensorView residual, const TensorView& delta, const TensorView& weight, float eps,
                              TensorView out) = 0;
  // out[t, n] = sum_k x[t, k] * weight[n, k] + bias[n]; weight bf16 [N, K], bias bf16 [N] or empty.
  // out may be f32 or the activation dtype.
  virtual Status linear(const TensorView& x, const TensorView& weight, const TensorView& bias, TensorView out) = 0;
  // The same product with FP8 dense weights (`--dense-dtype fp8`): weight fp8 e4m3 [N, K], scale f32 [N] (one per
  // output channel), out[t, n] = scale[n] * sum_k x[t, k] * weight[n, k] + bias[n]. Backends without it refuse.
  virtual Status linear_fp8(const TensorView& x, const TensorView& weight, const TensorView& scale,
                            const TensorView& bias, TensorView out) {
    (void)x, (void)weight, (void)scale, (void)bias, (void)out;
    return unimplemented(name() + " backend has no FP8 dense linear");
  }
  virtual Status qkv_rope(const QkvRopeParams& p, const BatchView& batch) = 0;
  // The q|k|v projection into rope.qkv (linear, or linear_fp8 when `scale` is given), then qkv_rope(rope, batch):
  // one op so that a backend may rotate and write the cache in the GEMM's epilogue (CUDA's skinny kernel at
  // decode, without q/k norms), rope.qkv then left unwritten.
  virtual Status linear_qkv_rope(const TensorView& x, const TensorView& weight, const TensorView& scale,
                                 const TensorView& bias, const QkvRopeParams& rope, const BatchView& batch) {
    MX_RETURN_IF_ERROR(scale.empty() ? linear(x, weight, bias, rope.qkv) : linear_fp8(x, weight, scale, bias, rope.qkv));
    return qkv_rope(rope, batch);
  }
  virtual Status attention(const AttentionParams& p, const BatchView& batch) = 0;
  // qkv_rope(rope, batch), then attention(attn, batch) of its queries (attn.q is rope.q_out): one op so that a backend
  // may norm and rotate a decode step's q and its new K/V inside the attention (CUDA: Gemma-4's clustered decode
  // attention at one query per sequence), rope.q_out then left unwritten.
  virtual Status qkv_rope_attention(const QkvRopeParams& rope, const AttentionParams& attn, const BatchView& batch) {
    MX_RETURN_IF_ERROR(qkv_rope(rope, batch));
    return attention(attn, batch);
  }
  virtual Status router_topk(const RouterParams& p) = 0;
  // add_rms_norm(residual, delta, weight, eps, out), then router_topk(route) of its out (route.x is `out`): the
  // post-attention norm and gpt-oss's router, which CUDA runs in one launch at decode (router.cu).
  virtual Status add_rms_norm_route(TensorView residual, const TensorView& delta, const TensorView& weight, float eps,
                                    TensorView out, const RouterParams& route) {
    MX_RETURN_IF_ERROR(add_rms_norm(residual, delta, weight, eps, out));
    return router_topk(route);
  }
  virtual Status moe_experts(const MoeParams& p) = 0;
  // moe_experts(p), then add_rms_norm(residual, p.out, weight, eps, out): gpt-oss's experts and the norm after them
  // (the next layer's input norm), one op so that a backend may join them at the combine (p.out need not then be
  // written). CUDA's decode joins them at <= 32 routed slots: the second expert GEMM leaves the experts' rows and the
  // norm's kernel sums them.
  virtual Status moe_experts_add_rms_norm(const MoeParams& p, TensorView residual, const TensorView& weight, float eps,
                                          TensorView out) {
    MX_RETURN_IF_ERROR(moe_experts(p));
    return add_rms_norm(residual, p.out, weight, eps, out);
  }
  // out[r] = x[rows[r]]; rows i32 [R].
  virtual Status gather_rows(const TensorView& x, const TensorView& rows, TensorView out) = 0;
  virtual Status sample(const SampleParams& p) = 0;

  // Ops Gemma-4 needs (CPU and CUDA; a backend without them answers unimplemented).
  // out = rms_norm(x) over the last dim, without a weight; x and out in activation_dtype().
  virtual Status unit_rms_norm(const TensorView& x, float eps, TensorView out) {
    (void)x, (void)eps, (void)out;
    return unimplemented(name() + " backend has no weightless rms_norm yet");
  }
  // x = cap * tanh(x / cap) elementwise (final logit soft-cap); x f32.
  virtual Status soft_cap(TensorView x, float cap) {
    (void)x, (void)cap;
    return unimplemented(name() + " backend has no soft_cap yet");
  }
  // out = gelu_tanh(gate) * up elementwise (GeGLU); all in activation_dtype().
  virtual Status gelu_tanh_mul(const TensorView& gate, const TensorView& up, TensorView out) {
    (void)gate, (void)up, (void)out;
    return unimplemented(name() + " backend has no gelu_tanh_mul yet");
  }
  // out[t, i] = gelu_tanh(gate_up[t, i]) * gate_up[t, I + i]: GeGLU on a fused gate|up projection [T, 2I]
  // (Gemma-4's dense MLP runs both halves as one GEMM); out [T, I]; all in activation_dtype().
  virtual Status geglu(const TensorView& gate_up, TensorView out) {
    (void)gate_up, (void)out;
    return unimplemented(name() + " backend has no geglu yet");
  }
  virtual Status qkv_norms(const QkvNormParams& p) {
    (void)p;
    return unimplemented(name() + " backend has no per-head q/k/v norms yet");
  }
  virtual Status moe_geglu_experts(const GegluMoeParams& p) {
    (void)p;
    return unimplemented(name() + " backend has no bf16 GeGLU experts yet");
  }
  // x *= factor[0] (Gemma-4's layer_scalar); factor bf16/f32 [1] in backend memory; x in residual_dtype().
  virtual Status scale_by(TensorView x, const TensorView& factor) {
    (void)x, (void)factor;
    return unimplemented(name() + " backend has no scale_by yet");
  }

  virtual Status gemma_attention_end(const GemmaAttentionEndParams& p) {
    (void)p;
    return unimplemented(name() + " backend has no fused Gemma-4 attention-end norms");
  }
  virtual Status gemma_layer_end(const GemmaLayerEndParams& p) {
    (void)p;
    return unimplemented(name() + " backend has no fused Gemma-4 layer-end norms");
  }

  // Ops the EAGLE-3 drafter needs (a Llama-style layer; CPU and CUDA).
  // out = silu(gate) * up elementwise (SwiGLU); all in activation_dtype().
  virtual Status silu_mul(const TensorView& gate, const TensorView& up, TensorView out) {
    (void)gate, (void)up, (void)out;
    return unimplemented(name() + " backend has no silu_mul yet");
  }
  // out = x elementwise in out's dtype (f32 or bf16 either way, round to nearest even): the f32 residual
  // stream as a bf16 operand of linear.
  virtual Status convert(const TensorView& x, TensorView out) {
    (void)x, (void)out;
    return unimplemented(name() + " backend has no dtype convert yet");
  }

  // dst = src, both in backend memory with the same byte size (the bandwidth probe's copy).
  virtual Status copy(TensorView dst, const TensorView& src) {
    (void)dst, (void)src;
    return unimplemented(name() + " backend has no device copy");
  }

  // Two groups of ops that may run at the same time (Gemma-4's dense MLP beside its experts at decode): the ops
  // issued between begin_side() and end_side() (the side group), and those issued after end_side() up to
  // join_side(); after join_side() both have finished. Neither group may read what the other writes. A backend
  // that runs them side by side (CUDA: the side group on a second stream, forked from the first by an event and
  // joined back by another, in a graph capture too) answers true from begin_side(); one that runs every op in
  // order (the default; CUDA above `tokens` of CudaSideStreamOptions) answers false, and end_side() and
  // join_side() change nothing. `tokens`: the step's, for that choice. A true answer also says that the op
  // after end_side() follows the op before begin_side() directly (GegluMoeParams::routing_ready then false).
  virtual Result<bool> begin_side(int64_t tokens) {
    (void)tokens;
    return false;
  }
  virtual Status end_side() { return Status::ok(); }
  virtual Status join_side() { return Status::ok(); }

  // Device facts. Backends without a memory of their own (the CPU) answer unimplemented.
  virtual std::string device_name() const { return name(); }
  virtual Result<DeviceMemory> memory_info() { return unimplemented(name() + " backend has no device memory to query"); }
  // Device memory that allocate() holds now on this backend's device, over every backend of this process
  // (what the process owns, whatever other processes on the device do; not the driver's context, library
  // workspaces, loaded kernels or graphs), or -1 where nothing is counted.
  virtual int64_t allocated_bytes() const { return -1; }
  virtual Result<std::unique_ptr<DeviceTimer>> make_timer(int64_t slots) {
    (void)slots;
    return unimplemented(name() + " backend has no device timer");
  }

  // Scratch and graphs. Backends without private scratch or graph support keep these defaults.
  virtual Status prepare(const WorkspaceSpec&) { return Status::ok(); }
  virtual bool can_capture() const { return false; }
  // Binds the calling thread to this backend's device (CUDA: cudaSetDevice). A thread other than the one
  // that created the backend calls it before its first op (tensor-parallel ranks run on their own threads).
  virtual Status make_current() { return Status::ok(); }
  // Runs `body` once in capture mode and returns its replayable recording. Nothing runs during capture.
  virtual Result<std::unique_ptr<ReplayGraph>> capture(const std::function<Status()>& body) {
    (void)body;
    return unimplemented(name() + " backend cannot capture graphs");
  }
};

struct BackendOptions {
  std::string name = "cpu";  // "cpu" or "cuda"
  int num_threads = 0;       // CPU: worker threads, 0 = all hardware threads
  int device = 0;            // CUDA: device ordinal
};

struct CpuBackendOptions {
  int num_threads = 0;  // 0 = all hardware threads
};
std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options = {});

// The backend named in `options`; "cuda" in a build without CUDA is an error, not a crash.
Result<std::unique_ptr<Backend>> make_backend(const BackendOptions& options);

}  // namespace mx
