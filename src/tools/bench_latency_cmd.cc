// `mxserve bench latency`: prefill and decode latency per batch size, in-process through the real engine
// path (EngineCore: scheduler, model runner, CUDA graphs, host sampling), each number beside its floor.
//
// Per prompt length and batch size B: B random prompts of that many tokens arrive at once, greedy, --output-len tokens
// each, eos ignored. TTFT = time from the arrival to a request's first token; prefill rate = all prompt
// tokens / time until the last first token (chunked prefill steps may carry early requests' decodes);
// TPOT = median time of the steps that decode all B requests and nothing else. Before a (prompt length, B)'s first row in
// the process, an untimed batch of the prompts its first prefill step holds (the shape's one-time host work).
// Floors: decode = bytes the step must read (dense weights, the distinct experts the batch activates,
// KV at the mid-decode context) / measured copy bandwidth; prefill = FLOPs / measured GEMM rate.
// --breakdown: one decode step per batch size (mid-output: decode_breakdown_due) captured as a graph with a timer
// mark around every backend op (padded like the engine's own graph) and replayed, summed per category (mark
// overhead removed, see breakdown_json); "idle" is the step time minus the engine's graph, logits copy and host
// sampling (with host sampling: the timed steps' wall time less their wait for the device and their sampling). The routing is recorded in a second, eager step; a row without a breakdown says why. Also one prefill
// step of one prompt, eager behind a device hold, at the longest prompt length (on each engine of a comparison). With a draft model, also the third verify step's draft call timed op
// by op (DraftBreakdown; that step stays out of the stats). With --forced-acceptance, also one verify step
// per (k, batch) timed the same way as the decode step (its "breakdown" has verify_drafts = k).
// Pairs whose B x (prompt + output) tokens exceed the KV pool are skipped with a note: the scheduler would
// run them in waves, which would make the TTFT and TPOT describe a different workload.
// Speculative decoding (--speculative-algorithm): per row also the drafts, accepted tokens, mean accepted
// length, the median verify step (every request verified, nothing else ran) and the time per output token
// over the decode phase (all first tokens -> last token); with a draft model (mtp) also the mean time of its
// draft calls (k draft steps for every request, part of each verify step). --forced-acceptance K,...: the verify-cost curve:
// a plain run records every request's greedy output, then per K an engine whose drafter proposes those
// outputs (spec/reference_drafter.h) runs the same prompts, every draft counted as accepted
// (SpeculativeConfig::accept_all: on random weights bf16 near ties would soon part a sequence from its
// recorded drafts); each row gets the verify step beside the plain decode step and the time per output
// token beside plain decoding's.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "backend/profiling_backend.h"
#ifdef MX_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "core/log.h"
#include "model/model_registry.h"
#include "model/synthetic_model.h"
#include "model/tensor_parallel_model.h"
#include "runtime/engine_core.h"
#include "spec/reference_drafter.h"
#include "tools/bench_probes.h"
#include "tools/cli_args.h"
#include "tools/commands.h"
#include "tools/engine_flags.h"

namespace mx {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::ordered_json;

#ifdef MX_HAVE_CUDA
constexpr const char* kDefaultBackend = "cuda";
#else
constexpr const char* kDefaultBackend = "cpu";
#endif

const std::vector<CliOption> kCommandOptions = {
    {"model", true, "model directory (config.json + safetensors)"},
    {"preset", true,
     "instead of --model: gpt-oss-20b, gpt-oss-120b, demo, tiny, gemma-4-26b-a4b or gemma-demo synthetic weights "
     "made in memory"},
    {"seed", true, "seed of synthetic weights and prompts (default 0)"},
    {"backend", true, "cuda (default in CUDA builds) or cpu"},
    {"threads", true, "CPU backend threads (default: all cores)"},
    {"tensor-parallel-size", true, "ranks the model is split over (needs --model; default 1)", {"tp", "tp-size"}},
    {"batch-size", true, "comma-separated batch sizes (default 1,8,32,128)"},
    {"input-len", true, "comma-separated prompt tokens per request (default 1024)"},
    {"output-len", true, "generated tokens per request (default 128)"},
    {"json", true, "also write the results as JSON to this file"},
    {"breakdown", false,
     "GPU time of one decode step per op category (eager, instrumented) and of one prefill step (with several "
     "values of a kernel flag: one per value, JSON prefill_breakdowns); with a draft model also one draft call's ops"},
    {"forced-acceptance", true, "comma-separated draft counts K: verify cost with drafts that are the plain run's outputs"},
    {"whole-page-table-uploads", false,
     "upload every step's page tables at full width (max-model-len / page-size columns) as before 2026-11-28, not "
     "only the columns the step uses: the before of that change"},
    {"skinny-staged", true,
     "the dense linears' decode kernel on CUDA at 1 to 8 tokens: auto or on (default: each CTA's weight strip staged "
     "whole in shared memory before its PDL wait, skinny_linear_staged.cu, where its strips take up to 3 waves of "
     "resident CTAs, the last at least a third full, there in place of cuBLASLt too), one-wave or 2-waves (staged "
     "where one or two waves hold the strips: the befores), 3-waves (the default) or off (skinny_linear.cu "
     "everywhere); several, comma-separated: compared as --bf16-experts-decode"},
    {"decode-attention", true,
     "decode attention kernel on CUDA: auto (default), mma-sync (attention.cu), mma-sync-merge (the same with its "
     "splits through the merge kernel, never as CTA clusters), swap-ab (attention_decode_swap.cu) or swap-ab-cluster "
     "(the same, a token's splits as one CTA cluster: head dims 256/512), or ring-config / ring-3 (auto with the "
     "clustered kernel's ring at one token and short splits, Gemma-4's sliding layers, as its config has it, 4 "
     "stages, or of 3 instead of 2), rope-in-attention (auto with Gemma-4's q/k/v norms and RoPE in the clustered "
     "attention, not in their own launch) or keys-after-wait (auto with every key copy after the attention's PDL wait); "
     "several, comma-separated: compared as --bf16-experts-decode"},
    {"bf16-experts-decode", true,
     "Gemma-4's bf16 experts at decode on CUDA: auto (default), rows (auto with a bulk copy per weight row and stage "
     "instead of one TMA tensor box), register-loads, bulk-copies, streamed or fused (a step of <= 32 routed slots as one persistent "
     "launch); several, comma-separated: every batch once per kernel, "
     "each on an engine of its own over the one loaded model (the kernels' comparison end to end, in one process)"},
    {"skinny-decode-form", true,
     "the dense linears' skinny kernel at decode on CUDA (qkv with its RoPE epilogue, FP8 o_proj, the lm_head): auto "
     "(default: even-strips+inputs-first+staged-head+qkv-staged), session21 (none: the form before 2026-11-29) or "
     "features joined by '+': "
     "even-strips (FP8 weights on skinny_linear_strip_rows' strips where 16 rows fit one wave: 20b's o_proj on 11 "
     "rows), inputs-first (the epilogue's scale, bias and RoPE inputs read before the PDL wait), persistent (strips "
     "past one wave, the lm_head, on one wave of CTAs looping over them), fp8-staged (FP8 weights staged in shared "
     "memory before the PDL wait where bf16 ones are: 20b's o_proj), staged-head (the FP8 lm_head staged at 1-2 tokens, "
     "a CTA a strip), qkv-staged (qkv's FP8 strips with the RoPE epilogue staged the same way; both in auto since "
     "session 23: even-strips+inputs-first is the form before); "
     "several, comma-separated: compared as --bf16-experts-decode"},
    {"skinny-strip-rows", true,
     "output channels per CTA of the dense linears' decode kernel on CUDA (skinny_linear.cu): auto (default) or 8 "
     "to 16; several, comma-separated: every batch once per value, each on an engine of its own over the one "
     "loaded model (as --bf16-experts-decode)"},
    {"moe-decode-combine", true,
     "where gpt-oss's experts are summed at decode on CUDA (<= 32 routed slots): auto (default: in the next norm's "
     "kernel, which lets the next qkv launch before its wait), norm-wait-first (the same, the next qkv launched only "
     "after the norm's wait: the form before 2026-11-29), gemm (in the second expert GEMM, then the norm: the two "
     "ops), norm-inputs-after-wait (auto with the row norms' weights and the router's bias read after their PDL "
     "wait: the form before session 24) or norm-route-apart (auto with 120b's post-attention norm and router as two "
     "launches: the form before session 24); several, comma-separated: compared as --bf16-experts-decode"},
    {"moe-decode-form", true,
     "gpt-oss's MXFP4 decode GEMMs on CUDA (<= 64 routed slots): auto (default: each warp's scale bytes staged in "
     "shared memory; at one token 3 warps a CTA in the first GEMM, 6 in the second; at two 3 and 3), session20 (2 "
     "warps from two tokens on), session21 (the first GEMM routed by a pass over the slots at <= 8 routed slots), "
     "session23 (the fp4 decode's rotations at every size: no left shifts up to 16 routed slots) or registers (the "
     "form before session 20: the scales in the ring's registers, 4 and 4 warps); each older form without the newer "
     "ones; several, comma-separated: compared as --bf16-experts-decode"},
    {"decode-overlap", true,
     "Gemma-4's decode overlaps on CUDA: auto (default: the side stream alone), off, side-stream (the dense MLP on a "
     "second stream beside the experts, CudaSideStreamOptions), l2-prefetch (24 MiB of o_proj's weight into the L2 "
     "during the attention, CudaL2PrefetchOptions) or both; several, comma-separated: every batch once per value, "
     "each on an engine of its own over the one loaded model (as --bf16-experts-decode)"},
    {"moe-wgmma-loads", true,
     "how gpt-oss's 16-token wgmma MoE tiles (batched decode at ~8-16 tokens per expert, sm_90) load their k tiles: "
     "auto (default: the copy engine), cp-async, copy-engine or copy-engine-pairs (an expert's tiles paired: one "
     "fp4 decode for two tiles' rows); several, comma-separated: compared as "
     "--bf16-experts-decode"},
    {"moe-wgmma-glue", true,
     "gpt-oss's 16-token wgmma MoE tiles' routing, gather and combine (batched decode, sm_90): auto (default), "
     "combine-kernel (the routing and the gather in one launch, then the combine kernel and the norm), "
     "combine-in-norm (the same with the combine in the next norm's kernel) or separate (the routing kernel, the "
     "gather, the combine kernel and the norm: the form before 2026-11-29); several, comma-separated: compared as "
     "--bf16-experts-decode"},
    {"moe-wgmma-order", true,
     "the order of gpt-oss's 96- and 256-token wgmma MoE tiles (prefill, sm_90): auto (default: wide first), "
     "wide-first (the tiles whose k loop runs at the full width get the GEMMs' first CTA rows, an expert's shorter "
     "last tile the last) or expert-order (the form before 2026-11-29); several, comma-separated: compared as "
     "--bf16-experts-decode"},
    {"moe-wgmma-prefill-loads", true,
     "how gpt-oss's wgmma MoE prefill tiles load their k tiles (sm_90): the 96-token tiles at 64/96 columns (~48-96 "
     "tokens per expert) and at 96/48 (~96-512), the 256-token tiles (>= 512): auto (the defaults), cp-async (all by "
     "cp.async: the form before 2026-11-29), copy-engine (all as bulk copies of rows, fp4 and scales on the stage's "
     "mbarrier, x gathered tiled by the routing launch), copy-engine-mid (the 64/96-column tiles only: session 22's "
     "defaults), copy-engine-96 (the 96-token tiles only) or copy-engine-256 (the 64/96-column and 256-token tiles); "
     "several, comma-separated: compared as --bf16-experts-decode"},
    {"qkv-rope-epilogue", true,
     "gpt-oss's decode qkv on CUDA: auto (default) or on (RoPE and the KV write in the skinny GEMM's epilogue, one "
     "launch, on bf16 and FP8 dense weights), fp8 (the same on FP8 weights only, bf16's on cuBLASLt: the default "
     "before 2026-11-29), an even 8 to 16 (on, with strips of that many rows) or off (the GEMM, then qkv_rope); "
     "several, comma-separated: compared as --bf16-experts-decode"},
    {"qkv-rope-form", true,
     "gpt-oss's qkv_rope on CUDA: auto (default: the many-token form from 1024 tokens), decode (the per-(token, head "
     "group) CTAs at every size: the form before 2026-11-28), stream (the many-token form at every size) or "
     "q-written (auto's kernels, but qkv_rope writes the rotated Q and the attention reads it back at prefill: the "
     "form before 2026-11-29; auto rotates Q in the attention's Q load); several, comma-separated: compared as "
     "--bf16-experts-decode"},
    {"gemma-prefill-experts", true,
     "Gemma-4's bf16 experts on wgmma at 128-token tiles (prefill, sm_90): auto (default: ws-128x6-128x6) or "
     "UPxS-DOWNxS, the weight rows a CTA and ring stages of the gate|up and the down GEMM on a CTA per item: "
     "128x4-128x4 (the form before session 24), 128x6-128x6, 176x5-256x4, 256x4-256x4, 128x4-128x3 or 176x5-128x3, "
     "or on the warp-specialized persistent kernel: ws-176x5-256x4, ws-128x6-128x6 or ws-176x5-128x6 (with the "
     "decode kernels' defaults); several, comma-separated: compared as --bf16-experts-decode"},
    {"gemma-row-form", true,
     "Gemma-4's fused row kernels (attention end, layer end) on CUDA: auto (default: by rows, 2 chunks a thread from "
     "1024 rows, bounded from 4096), four-chunks (the form before session 23), two-chunks or bounded (2 chunks, "
     "registers bounded for 3-4 CTAs an SM); several, comma-separated: compared as --bf16-experts-decode"},
    {"compare-overlap", false,
     "every batch twice, with serial steps (--disable-overlap-schedule's) and then overlapped ones: the host work "
     "between decode steps before and after, in one process"},
    {"host-sampled-requests", true,
     "the first N requests of each batch ask for 5 top logprobs, which the host ranks from their copied logits "
     "(the sample op draws every token, greedy; default 0)"},
    {"compare-host-sampling", false,
     "every batch twice, with --host-sampled-requests' rows taking every row of their steps to the host (the form "
     "before 2026-11-29) and then alone (the others from the sample op), in one process"},
    {"compare-batched-tokens", true,
     "comma-separated step token budgets (--max-num-batched-tokens values): every batch once per budget, the engine "
     "sized for the largest: the prefill chunk size's before and after (TTFTmax: the prefill phase), in one process"},
    {"log-level", true, "debug, info (default), warning or error"},
    {"help", false, "show this help"},
};

std::vector<CliOption> options() {
  std::vector<CliOption> all = kCommandOptions;
  const auto engine = engine_cli_options();
  all.insert(all.end() - 1, engine.begin(), engine.end());
  return all;
}

// The values of the kernel flags that take names (--skinny-strip-rows takes a number: skinny_strip_rows;
// --qkv-rope-epilogue a name or a number: qkv_rope_epilogue).
const std::map<std::string, std::vector<std::string>>& kernel_flag_names() {
  static const std::map<std::string, std::vector<std::string>> names = {
      {"decode-attention",
       {"auto", "mma-sync", "mma-sync-merge", "swap-ab", "swap-ab-cluster", "ring-config", "ring-3", "rope-in-attention",
        "keys-after-wait"}},
      {"bf16-experts-decode", {"auto", "rows", "register-loads", "bulk-copies", "streamed", "fused"}},
      {"moe-decode-combine", {"auto", "norm-wait-first", "gemm", "norm-inputs-after-wait", "norm-route-apart"}},
      {"moe-decode-form", {"auto", "registers", "session20", "session21", "session23"}},
      {"moe-wgmma-loads", {"auto", "cp-async", "copy-engine", "copy-engine-pairs"}},
      {"moe-wgmma-glue", {"auto", "separate", "combine-kernel", "combine-in-norm"}},
      {"moe-wgmma-order", {"auto", "wide-first", "expert-order"}},
      {"moe-wgmma-prefill-loads", {"auto", "cp-async", "copy-engine", "copy-engine-mid", "copy-engine-96", "copy-engine-256"}},
      {"qkv-rope-form", {"auto", "decode", "stream", "q-written"}},
      {"skinny-staged", {"auto", "off", "on", "one-wave", "2-waves", "3-waves"}},
      {"decode-overlap", {"auto", "off", "side-stream", "l2-prefetch", "both"}},
      {"gemma-row-form", {"auto", "four-chunks", "two-chunks", "bounded"}},
      {"gemma-prefill-experts",
       {"auto", "128x4-128x4", "128x6-128x6", "176x5-256x4", "256x4-256x4", "128x4-128x3", "176x5-128x3",
        "ws-176x5-256x4", "ws-128x6-128x6", "ws-176x5-128x6"}},
  };
  return names;
}

// --skinny-decode-form: auto (nullopt: the defaults), session21 or '+'-joined features, as CudaSkinnyLinearOptions'
// (fp8_even_strips, inputs_first, persistent, fp8_staged, fp8_staged_head_rows > 0, fp8_qkv_staged).
constexpr std::array<const char*, 6> kSkinnyDecodeFeatures = {"even-strips", "inputs-first", "persistent", "fp8-staged",
                                                              "staged-head", "qkv-staged"};
Result<std::optional<std::array<bool, 6>>> skinny_decode_form(const std::string& value) {
  if (value == "auto") return std::optional<std::array<bool, 6>>();
  std::array<bool, 6> form = {};
  if (value == "session21") return std::optional(form);
  std::stringstream parts(value);
  for (std::string part; std::getline(parts, part, '+');) {
    const auto it = std::find(kSkinnyDecodeFeatures.begin(), kSkinnyDecodeFeatures.end(), part);
    const auto i = static_cast<size_t>(it - kSkinnyDecodeFeatures.begin());
    if (it == kSkinnyDecodeFeatures.end() || form[i])
      return invalid_argument("--skinny-decode-form must be auto, session21 or even-strips, inputs-first, persistent, "
                              "fp8-staged, staged-head, qkv-staged joined by '+', got " + value);
    form[i] = true;
  }
  return std::optional(form);
}

// --skinny-strip-rows: auto (0) or 8 to 16 output channels per CTA.
Result<int> skinny_strip_rows(const std::string& value) {
  if (value == "auto") return 0;
  const auto parsed = parse_int_list(value);
  if (!parsed.is_ok() || parsed->size() != 1 || (*parsed)[0] < 8 || (*parsed)[0] > 16)
    return invalid_argument("--skinny-strip-rows must be auto or 8 to 16, got " + value);
  return static_cast<int>((*parsed)[0]);
}

// --qkv-rope-epilogue: CudaSkinnyLinearOptions' (rope_epilogue, rope_strip_rows): auto (0, 0), on (1, 0), fp8 (2, 0),
// off (-1, 0) or an even 8 to 16 rows (1, rows).
Result<std::pair<int, int>> qkv_rope_epilogue(const std::string& value) {
  if (value == "auto" || value == "on" || value == "off" || value == "fp8")
    return std::pair{value == "off" ? -1 : value == "on" ? 1 : value == "fp8" ? 2 : 0, 0};
  const auto parsed = parse_int_list(value);
  if (!parsed.is_ok() || parsed->size() != 1 || (*parsed)[0] < 8 || (*parsed)[0] > 16 || (*parsed)[0] % 2 != 0)
    return invalid_argument("--qkv-rope-epilogue must be auto, on, fp8, off or an even 8 to 16, got " + value);
  return std::pair{1, static_cast<int>((*parsed)[0])};
}

// One flag's value checked, in every build (the message lists the values: "a, b or c").
Status check_kernel_choice(const std::string& flag, const std::string& value) {
  if (flag == "skinny-strip-rows") return skinny_strip_rows(value).status();
  if (flag == "skinny-decode-form") return skinny_decode_form(value).status();
  if (flag == "qkv-rope-epilogue") return qkv_rope_epilogue(value).status();
  const std::vector<std::string>& names = kernel_flag_names().at(flag);
  if (std::find(names.begin(), names.end(), value) != names.end()) return Status::ok();
  std::string list;
  for (size_t i = 0; i < names.size(); ++i) list += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return invalid_argument("--" + flag + " must be " + list + ", got " + value);
}

#ifdef MX_HAVE_CUDA
// A checked value applied to a CUDA backend, before the engine captures its graphs. Each MoE flag changes only its
// own CudaMoeOptions fields (the other MoE flags' choices stay), each skinny flag only its CudaSkinnyLinearOptions
// fields; --decode-overlap sets the side stream and the L2 prefetch (the others' defaults).
Status apply_cuda_kernel_choice(Backend& backend, const std::string& flag, const std::string& value) {
  if (flag == "decode-attention") {
    const CudaAttentionDecode decode = value == "mma-sync"          ? CudaAttentionDecode::kMmaSync
                                       : value == "mma-sync-merge"  ? CudaAttentionDecode::kMmaSyncMerge
                                       : value == "swap-ab"         ? CudaAttentionDecode::kSwapAb
                                       : value == "swap-ab-cluster" ? CudaAttentionDecode::kSwapAbCluster
                                                                    : CudaAttentionDecode::kAuto;
    // ring-config / ring-3: kAuto with the clustered kernel's ring at one token and short splits as its config has
    // it (4 stages: the before) or of 3 (CudaAttentionOptions::cluster_stages_one_token).
    CudaAttentionOptions attention{CudaAttentionPath::kAuto, decode};
    if (value == "ring-config") attention.cluster_stages_one_token = 0;
    if (value == "ring-3") attention.cluster_stages_one_token = 3;
    // rope-in-attention: Gemma-4's q/k/v norms and RoPE in the clustered attention (norm_rope_in_attention);
    // keys-after-wait: every key copy after the attention's PDL wait (the before of keys_before_wait).
    if (value == "rope-in-attention") attention.norm_rope_in_attention = true;
    if (value == "keys-after-wait") attention.keys_before_wait = false;
    return set_cuda_attention_options(backend, attention);
  }
  if (flag == "bf16-experts-decode") {
    const CudaBf16ExpertsDecode decode = value == "register-loads" ? CudaBf16ExpertsDecode::kRegisterLoads
                                         : value == "bulk-copies"  ? CudaBf16ExpertsDecode::kBulkCopies
                                         : value == "streamed"     ? CudaBf16ExpertsDecode::kStreamed
                                         : value == "fused"        ? CudaBf16ExpertsDecode::kFused
                                                                   : CudaBf16ExpertsDecode::kAuto;
    CudaBf16ExpertsOptions o{decode};
    if (value == "rows") o.bulk_copy_form = CudaBulkCopyForm::kRows;
    return set_cuda_bf16_experts_options(backend, o);
  }
  if (flag == "skinny-strip-rows" || flag == "qkv-rope-epilogue") {  // each keeps the other's fields
    MX_ASSIGN_OR_RETURN(CudaSkinnyLinearOptions skinny, cuda_skinny_linear_options(backend));
    if (flag == "skinny-strip-rows") {
      MX_ASSIGN_OR_RETURN(skinny.strip_rows, skinny_strip_rows(value));
    } else {
      MX_ASSIGN_OR_RETURN(const auto epilogue, qkv_rope_epilogue(value));
      std::tie(skinny.rope_epilogue, skinny.rope_strip_rows) = epilogue;
    }
    return set_cuda_skinny_linear_options(backend, skinny);
  }
  if (flag == "moe-decode-combine" || flag == "moe-decode-form" || flag == "moe-wgmma-loads" || flag == "moe-wgmma-glue" ||
      flag == "moe-wgmma-order" || flag == "moe-wgmma-prefill-loads") {
    MX_ASSIGN_OR_RETURN(CudaMoeOptions moe, cuda_moe_options(backend));
    if (flag == "moe-decode-combine") {
      moe.decode_combine_in_norm = value != "gemm";
      moe.decode_norm_dependents_first = value != "norm-wait-first" && value != "gemm";
      moe.norm_inputs_before_wait = value != "norm-inputs-after-wait";
      moe.norm_route_tickets = value != "norm-route-apart";
    } else if (flag == "moe-decode-form") {
      moe.decode_scales_in_registers = value == "registers";
      moe.decode_three_warp_slots = value == "session20" ? 4 : 0;
      moe.decode_mask_route = value != "session20" && value != "session21";
      moe.decode_shift_slots = value == "auto" ? 0 : -1;
      moe.decode_ring_gemm1 = value == "auto" ? 0 : 4;
    }
    else if (flag == "moe-wgmma-glue")
      moe.wgmma_glue = value == "separate" ? -1 : value == "combine-kernel" ? 1 : value == "combine-in-norm" ? 2 : 0;
    else if (flag == "moe-wgmma-order")
      moe.wgmma_wide_first = value == "wide-first" ? 1 : value == "expert-order" ? -1 : 0;
    else if (flag == "moe-wgmma-prefill-loads") {
      moe.wgmma_bulk_mid = value == "auto" ? 0 : value == "cp-async" ? -1 : 1;
      moe.wgmma_bulk_full = value == "auto" ? 0 : value == "copy-engine" || value == "copy-engine-96" ? 1 : -1;
      moe.wgmma_bulk_wide = value == "auto" ? 0 : value == "copy-engine" || value == "copy-engine-256" ? 1 : -1;
    }
    else moe.wgmma_bulk = value == "cp-async" ? -1 : value == "copy-engine" ? 1 : value == "copy-engine-pairs" ? 3 : 0;
    return set_cuda_moe_options(backend, moe);
  }
  if (flag == "skinny-decode-form") {  // keeps the other fields
    MX_ASSIGN_OR_RETURN(CudaSkinnyLinearOptions skinny, cuda_skinny_linear_options(backend));
    MX_ASSIGN_OR_RETURN(const auto form, skinny_decode_form(value));
    const CudaSkinnyLinearOptions defaults;
    const std::array<bool, 6> f = form ? *form
                                       : std::array{defaults.fp8_even_strips, defaults.inputs_first, defaults.persistent,
                                                    defaults.fp8_staged, defaults.fp8_staged_head_rows > 0,
                                                    defaults.fp8_qkv_staged};
    std::tie(skinny.fp8_even_strips, skinny.inputs_first, skinny.persistent, skinny.fp8_staged, skinny.fp8_qkv_staged) =
        std::tuple{f[0], f[1], f[2], f[3], f[5]};
    skinny.fp8_staged_head_rows = f[4] ? std::max(1, defaults.fp8_staged_head_rows) : 0;
    return set_cuda_skinny_linear_options(backend, skinny);
  }
  // --skinny-staged keeps the other skinny flags' fields and sets both of its own for every value: a comparison's next
  // value must not inherit the waves of the one before.
  if (flag == "skinny-staged") {
    MX_ASSIGN_OR_RETURN(CudaSkinnyLinearOptions skinny, cuda_skinny_linear_options(backend));
    const CudaSkinnyLinearOptions defaults;
    skinny.staged = value != "off";
    skinny.staged_waves = value == "one-wave"                         ? 1
                          : value == "2-waves" || value == "3-waves" ? value[0] - '0'
                                                                      : defaults.staged_waves;
    return set_cuda_skinny_linear_options(backend, skinny);
  }
  if (flag == "qkv-rope-form") {
    CudaRopeOptions rope;
    if (value == "decode" || value == "stream") rope.stream_min_tokens = value == "decode" ? INT64_MAX : 1;
    rope.q_in_attention = value != "q-written";
    return set_cuda_rope_options(backend, rope);
  }
  if (flag == "gemma-prefill-experts") {
    CudaBf16ExpertsOptions o;
    const bool ws = value.rfind("ws-", 0) == 0;
    if (value != "auto") o.prefill_warp_specialized = ws ? 1 : -1;
    const std::string form = ws ? value.substr(3) : value;
    if (value != "auto" && std::sscanf(form.c_str(), "%dx%d-%dx%d", &o.prefill_up_rows, &o.prefill_up_stages,
                                       &o.prefill_down_rows, &o.prefill_down_stages) != 4)
      return invalid_argument("--gemma-prefill-experts: " + value);
    return set_cuda_bf16_experts_options(backend, o);
  }
  if (flag == "gemma-row-form") {
    using F = CudaGemmaRowForm;
    return set_cuda_gemma_row_options(backend, {value == "four-chunks" ? F::kFourChunks
                                                : value == "two-chunks" ? F::kTwoChunks
                                                : value == "bounded"    ? F::kTwoChunksBounded
                                                                        : F::kAuto});
  }
  CudaSideStreamOptions side;  // --decode-overlap
  CudaL2PrefetchOptions prefetch;
  if (value == "off" || value == "l2-prefetch") side.max_tokens = 0;
  if (value == "off" || value == "side-stream") prefetch.max_bytes = 0;
  if (value == "l2-prefetch" || value == "both") prefetch.max_bytes = 24ll << 20;
  MX_RETURN_IF_ERROR(set_cuda_side_stream_options(backend, side));
  return set_cuda_l2_prefetch_options(backend, prefetch);
}
#endif

// One value of a kernel flag whose values bench latency compares (--decode-attention, --bf16-experts-decode,
// --skinny-strip-rows, --moe-decode-combine, --moe-decode-form, --moe-wgmma-loads, --moe-wgmma-glue, --moe-wgmma-order,
// --moe-wgmma-prefill-loads, --decode-overlap,
// --qkv-rope-form, --qkv-rope-epilogue, --skinny-staged, --skinny-decode-form, --gemma-row-form,
// --gemma-prefill-experts).
struct KernelChoice {
  std::string flag, value;
  Status apply(Backend& backend) const {
    MX_RETURN_IF_ERROR(check_kernel_choice(flag, value));
#ifdef MX_HAVE_CUDA
    return apply_cuda_kernel_choice(backend, flag, value);
#else
    (void)backend;
    return invalid_argument("--" + flag + " " + value + ": this build has no CUDA backend");
#endif
  }
};

// A flag's name as a JSON key: decode-attention -> decode_attention.
std::string json_key(std::string flag) {
  std::replace(flag.begin(), flag.end(), '-', '_');
  return flag;
}

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

const char* op_category(const OpTiming& op, int64_t vocab) {
  if (op.op == "attention" || op.op == "qkv_rope_attention") return "attention";  // with its qkv norms and RoPE
  if (op.op == "moe_experts" || op.op == "moe_geglu_experts" || op.op == "router_topk" ||
      op.op == "moe_experts_add_rms_norm")
    return "moe";
  if (op.op == "linear") return op.out_features == vocab ? "logits" : "dense_gemm";
  if (op.op == "linear_qkv_rope") return "dense_gemm";  // qkv with its RoPE and KV write, either form
  if (op.op == "gather_rows" || op.op == "sample") return "logits";
  if (op.op == "copy_to_host") return "logits_to_host";
  return "norms_rope_small";
}

constexpr const char* kCategories[] = {"attention", "moe", "dense_gemm", "norms_rope_small", "logits", "logits_to_host"};

struct Setup {
  std::vector<int64_t> batch_sizes;
  std::vector<int64_t> input_lens;
  int64_t output_len = 0;
  uint64_t seed = 0;
  bool breakdown = false;
  std::vector<int64_t> forced_k;  // --forced-acceptance
  int64_t host_requests = 0;      // --host-sampled-requests
};

// One eager decode step timed op by op, and one that records the routing.
struct Breakdown {
  std::vector<OpTiming> ops;
  double host_sampling_ms = 0;
  double engine_graph_ms = 0;    // the engine's own graph for the same step, GPU time (0: eager step)
  double experts_per_layer = 0;  // distinct experts over the batch's real rows, mean over layers
  // The routing's load on the experts, mean over layers: token tiles of 16 and of 32 (sum over the experts of
  // ceil(tokens / tile): what the MoE kernels' grids run), and the most tokens one expert got (max over layers).
  double tiles16_per_layer = 0, tiles32_per_layer = 0;
  int64_t max_tokens_per_expert = 0;
  int64_t verify_drafts = 0;     // > 0: a verify step of that many drafts per sequence (else a decode step)
  std::string error;             // why the breakdown could not be taken (the run goes on)
};

// One draft call timed op by op, eagerly (no hold: an op's gap_before_ms is device time the GPU waited for
// the host, or ran a replayed graph, which shows as the gap before the copy that waits for it).
struct DraftBreakdown {
  std::vector<OpTiming> ops;
  double call_ms = 0;  // host wall time of the timed call, marks included
  std::string error;   // why the timing failed (the run goes on)
};

struct BatchResult {
  int64_t batch = 0;
  std::vector<double> ttft_s;
  double prefill_s = 0;
  std::vector<double> decode_step_s;
  // Per timed decode step (as decode_step_s): the host's wait for the device (graph, copies) and its host
  // sampling, both 0 where the step sampled on the device and overlapped.
  std::vector<double> decode_wait_s, decode_host_sampling_s;
  double decode_s = 0;  // all first tokens -> the last token, less the steps timed op by op
  int64_t instrumented_tokens = 0;  // tokens (all requests) of the steps timed op by op
  int64_t steps = 0;
  std::optional<Breakdown> breakdown;
  // --breakdown of a decode step not taken: the tokens left to the request closest to its end after the first full
  // decode step (-1: no step decoded every request).
  int64_t breakdown_fewest_left = -1;
  // Speculative decoding: this batch's share of the counters, and the steps where every request verified.
  SchedulerStats spec;
  std::vector<double> verify_step_s;
  // Draft-model speculation: host wall time of the draft calls (k draft steps each, inside the steps above),
  // in all and per verify step that drafted (the median leaves out the calls that captured a draft graph).
  double draft_s = 0;
  int64_t draft_calls = 0;
  std::vector<double> verify_draft_s;
  // --breakdown with a draft model: one draft call (the 3rd verify step's) timed op by op, out of the stats.
  std::optional<DraftBreakdown> draft_breakdown;
  std::vector<ReferenceDrafter::Reference> outputs;  // prompt and generated tokens per request
};

// The steps run_breakdown_steps takes, each of them one token for every request (the first may be the overlapped
// step in flight): a decode breakdown needs this many tokens left to the request closest to its end.
constexpr int64_t kBreakdownSteps = 3;

// Whether the decode breakdown is due before the next step, given the full decode steps timed so far and the tokens
// left to the request closest to its end (the step in flight included). Due at the middle of the output (full decode
// step output_len / 2) or, where a long prefill phase let the first requests run ahead so that the middle is past
// before every request decodes, at the last step where its steps still fit, after one full decode step was timed.
bool decode_breakdown_due(int64_t output_len, int64_t full_decodes, int64_t fewest_left) {
  if (full_decodes < 1 || fewest_left < kBreakdownSteps) return false;
  return full_decodes >= std::max<int64_t>(1, output_len / 2) || fewest_left == kBreakdownSteps;
}

// `rows_per_seq`: 1 for a decode step, k + 1 for a verify step of k drafts (the real rows the routing counts).
// `overlap`: whether the batch's other steps are overlapped (restored after the profiled ones). `take` gets each
// step's outputs (the tokens of the kBreakdownSteps steps count as generated).
using TakeOutputs = std::function<Status(const std::vector<RequestOutput>&)>;
Status run_breakdown_steps(EngineCore& core, ProfilingBackend& prof, int64_t batch, int64_t rows_per_seq, int64_t top_k,
                           bool overlap, Breakdown* out, const TakeOutputs& take) {
  std::vector<RequestOutput> outputs;
  // The step in flight (overlapped steps) finishes first and launches none, so the profiled steps are
  // scheduled, captured and run by themselves.
  core.set_overlap_steps(false);
  core.step(&outputs);
  MX_RETURN_IF_ERROR(take(outputs));
  core.runner().set_profile_capture(true);
  MX_RETURN_IF_ERROR(prof.start_timing(0));
  core.step(&outputs);
  auto ops = prof.finish_timing();
  core.runner().set_profile_capture(false);
  MX_RETURN_IF_ERROR(take(outputs));
  MX_RETURN_IF_ERROR(core.runner().profile_status());
  if (!ops.is_ok()) return ops.status();
  out->ops = std::move(*ops);
  out->host_sampling_ms = core.runner().last_sample_seconds() * 1e3;
  out->engine_graph_ms = core.runner().profile_graph_ms();
  // Router outputs are copied to the host after each router call: an eager step (padded the same way).
  core.runner().set_graph_replay(false);
  prof.start_routing_record();
  core.step(&outputs);
  const auto routing = prof.finish_routing();
  core.runner().set_graph_replay(true);
  core.set_overlap_steps(overlap);
  MX_RETURN_IF_ERROR(take(outputs));
  double distinct = 0, tiles16 = 0, tiles32 = 0;
  for (const auto& ids : routing) {
    const size_t real = std::min(ids.size(), static_cast<size_t>(batch * rows_per_seq * top_k));
    std::map<int32_t, int64_t> tokens;
    for (size_t i = 0; i < real; ++i) ++tokens[ids[i]];
    distinct += static_cast<double>(tokens.size());
    for (const auto& [expert, n] : tokens) {
      tiles16 += static_cast<double>((n + 15) / 16);
      tiles32 += static_cast<double>((n + 31) / 32);
      out->max_tokens_per_expert = std::max(out->max_tokens_per_expert, n);
    }
  }
  const double layers = std::max<double>(1, static_cast<double>(routing.size()));
  out->experts_per_layer = distinct / layers;
  out->tiles16_per_layer = tiles16 / layers;
  out->tiles32_per_layer = tiles32 / layers;
  return Status::ok();
}

// `host_requests`: the first that many requests ask for top logprobs (rows the host sampler draws).
Result<BatchResult> run_batch(EngineCore& core, ProfilingBackend& prof, const Model& model, int64_t batch,
                              int64_t input_len, int64_t output_len, uint64_t seed, bool breakdown, bool overlap,
                              RequestId* next_id, int64_t host_requests = 0) {
  core.set_overlap_steps(overlap);
  std::mt19937_64 rng(seed * 1000003 + static_cast<uint64_t>(batch));
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(model.dims().vocab_size - 1));
  std::map<RequestId, int64_t> index;
  BatchResult r;
  r.outputs.resize(static_cast<size_t>(batch));
  for (int64_t i = 0; i < batch; ++i) {
    RequestInput in;
    in.prompt.resize(static_cast<size_t>(input_len));
    for (auto& t : in.prompt) t = token(rng);
    r.outputs[static_cast<size_t>(i)].prompt = in.prompt;
    in.max_tokens = output_len;
    in.ignore_eos = true;
    in.sampling.temperature = 0;  // greedy
    if (i < host_requests) {
      in.sampling.logprobs = true;
      in.sampling.top_logprobs = 5;
    }
    const RequestId id = (*next_id)++;
    index[id] = i;
    MX_RETURN_IF_ERROR(core.add_request(id, std::move(in)));
  }
  r.batch = batch;
  r.ttft_s.assign(static_cast<size_t>(batch), -1);
  int64_t have_first = 0, full_decodes = 0;
  std::vector<RequestOutput> outputs;
  const SchedulerStats first = core.stats().scheduler;
  const double draft_s_before = core.runner().draft_seconds();
  const int64_t draft_calls_before = core.runner().num_draft_calls();
  double timed_draft_s = 0;
  double instrumented_s = 0;  // wall time of the steps timed op by op (out of the decode phase too)
  int64_t most_generated = 0;   // tokens of the request furthest ahead
  Status failed;                // a request that failed: the run stops
  const auto start = Clock::now();
  // A step's outputs: tokens appended per request, first tokens timed.
  auto take = [&](const std::vector<RequestOutput>& outs) -> Status {
    for (const RequestOutput& o : outs) {
      if (o.finish == FinishReason::kError) return failed = internal_error("request failed: " + o.error);
      const auto i = static_cast<size_t>(index.at(o.id));
      auto& generated = r.outputs[i].continuation;
      generated.insert(generated.end(), o.token_ids.begin(), o.token_ids.end());
      most_generated = std::max(most_generated, static_cast<int64_t>(generated.size()));
      if (!o.token_ids.empty() && r.ttft_s[i] < 0) {
        r.ttft_s[i] = since(start);
        ++have_first;
        if (have_first == batch) r.prefill_s = since(start);
      }
    }
    return Status::ok();
  };
  while (core.has_work()) {
    const SchedulerStats before = core.stats().scheduler;
    // Once: the instrumented steps (kept out of the TPOT sample), mid-decode (decode_breakdown_due). Under forced
    // acceptance (every step verifies k drafts, no draft model whose eager ops would land in the timing) the
    // fourth verify step instead.
    const SpeculativeConfig& spec = core.config().speculative;
    const int64_t k = spec.accept_all ? spec.num_draft_tokens : 0;
    const bool at_decode = k == 0 && decode_breakdown_due(output_len, full_decodes, output_len - most_generated);
    const bool at_verify = k > 0 && r.verify_step_s.size() == 3;
    if (breakdown && !r.breakdown && have_first == batch && (at_decode || at_verify) &&
        core.stats().num_running == batch) {
      Breakdown b;
      const auto t = Clock::now();
      b.verify_drafts = at_verify ? k : 0;
      const Status st = run_breakdown_steps(core, prof, batch, 1 + b.verify_drafts, model.cost().experts_per_token(),
                                            overlap, &b, take);
      MX_RETURN_IF_ERROR(failed);
      if (!st.is_ok()) {
        b.error = st.to_string();
        MX_LOG(Error) << "breakdown at batch " << batch << ": " << b.error;
      }
      r.breakdown = std::move(b);
      r.steps += kBreakdownSteps;
      instrumented_s += since(t);
      r.instrumented_tokens += core.stats().scheduler.generated_tokens - before.generated_tokens;
      continue;
    }
    const bool time_draft = breakdown && core.runner().has_draft_model() && !r.draft_breakdown &&
                            have_first == batch && r.verify_step_s.size() == 3;
    if (time_draft) MX_RETURN_IF_ERROR(prof.start_timing(0));
    const double draft_s_before_step = core.runner().draft_seconds();
    const double wait_before_step = core.runner().device_wait_seconds();
    const auto t = Clock::now();
    core.step(&outputs);
    const double dt = since(t);
    ++r.steps;
    if (time_draft) {
      DraftBreakdown d;
      auto ops = prof.finish_timing();
      if (ops.is_ok()) d.ops = std::move(*ops);
      else d.error = ops.status().to_string();
      d.call_ms = (core.runner().draft_seconds() - draft_s_before_step) * 1e3;
      timed_draft_s += d.call_ms / 1e3;
      r.draft_breakdown = std::move(d);
    }
    const SchedulerStats after = core.stats().scheduler;
    MX_RETURN_IF_ERROR(take(outputs));
    const int64_t computed = after.computed_tokens - before.computed_tokens;
    const int64_t generated = after.generated_tokens - before.generated_tokens;
    if (time_draft) {  // its marks slowed it: out of the stats
      instrumented_s += dt;
      r.instrumented_tokens += generated;
      continue;
    }
    if (computed == batch && generated == batch) {
      r.decode_step_s.push_back(dt);
      r.decode_wait_s.push_back(core.runner().device_wait_seconds() - wait_before_step);
      r.decode_host_sampling_s.push_back(core.runner().last_sample_seconds());
      if (++full_decodes == 1) r.breakdown_fewest_left = output_len - most_generated;
    }
    // A verify step of every request and nothing else: each computed 1 + its drafts.
    if (after.spec_drafts - before.spec_drafts == batch &&
        computed == batch + after.spec_draft_tokens - before.spec_draft_tokens && have_first == batch) {
      r.verify_step_s.push_back(dt);
      const double drafted_s = core.runner().draft_seconds() - draft_s_before_step;
      if (drafted_s > 0) r.verify_draft_s.push_back(drafted_s);
    }
  }
  r.decode_s = since(start) - r.prefill_s - instrumented_s;
  const SchedulerStats last = core.stats().scheduler;
  r.spec.spec_drafts = last.spec_drafts - first.spec_drafts;
  r.spec.spec_draft_tokens = last.spec_draft_tokens - first.spec_draft_tokens;
  r.spec.spec_accepted_tokens = last.spec_accepted_tokens - first.spec_accepted_tokens;
  r.draft_s = core.runner().draft_seconds() - draft_s_before - timed_draft_s;
  r.draft_calls = core.runner().num_draft_calls() - draft_calls_before - (r.draft_breakdown ? 1 : 0);
  return r;
}

// Per category: GPU time of the ops (timer marks around each). In a captured graph every mark is an event
// node that costs the GPU about a microsecond; that overhead, measured as (marked graph's span - the
// engine's own graph) / ops, is taken off each op. "idle_gaps" = the engine's step time (TPOT) minus the
// engine's graph, the logits copy and host sampling: host work between graph launches (scheduling,
// staging, launch). Rows whose steps sample on the host replace it (and sampling_host) with the timed steps'
// own medians (result_json).
json breakdown_json(const Breakdown& b, int64_t vocab, double step_ms, double* idle_ms) {
  double span = 0, copy_ms = 0;
  int64_t captured = 0;
  for (const OpTiming& op : b.ops) {
    if (op.op == "copy_to_host") copy_ms += op.ms;
    if (!op.captured) continue;  // eager ops after the graph (sample op, copies) keep their own times
    span += op.ms + (captured > 0 ? op.gap_before_ms : 0);
    ++captured;
  }
  const double per_op = b.engine_graph_ms > 0 && captured > 0 ? std::max(0.0, (span - b.engine_graph_ms) / captured) : 0;
  std::map<std::string, double> cat;
  std::map<std::string, std::pair<double, int64_t>> by_op;  // per op name (and linear width), over layers
  double sum = 0;
  for (const OpTiming& op : b.ops) {
    const double ms = op.captured ? std::max(0.0, op.ms - per_op) : op.ms;
    cat[op_category(op, vocab)] += ms;
    sum += ms;
    const std::string key = op.op == "linear" ? "linear[" + std::to_string(op.out_features) + "]" : op.op;
    by_op[key].first += ms;
    by_op[key].second += 1;
  }
  json ops = json::array();
  for (const auto& [name, v] : by_op) ops.push_back({{"op", name}, {"calls", v.second}, {"ms", v.first}});
  sum += b.host_sampling_ms;
  json categories = json::object();
  for (const char* c : kCategories) categories[c] = cat[c];
  categories["sampling_host"] = b.host_sampling_ms;
  *idle_ms = 0;
  if (step_ms > 0 && b.engine_graph_ms > 0) {
    *idle_ms = step_ms - b.engine_graph_ms - copy_ms - b.host_sampling_ms;
    categories["idle_gaps"] = *idle_ms;
  }
  json j;
  j["categories_ms"] = categories;
  j["ops_sum_ms"] = sum;
  j["step_ms"] = step_ms;
  j["engine_graph_gpu_ms"] = b.engine_graph_ms;
  j["marked_graph_span_ms"] = span;
  j["mark_overhead_per_op_ms"] = per_op;
  j["experts_per_layer_counted"] = b.experts_per_layer;
  j["moe_tiles16_per_layer"] = b.tiles16_per_layer;
  j["moe_tiles32_per_layer"] = b.tiles32_per_layer;
  j["moe_max_tokens_per_expert"] = b.max_tokens_per_expert;
  if (!b.error.empty()) j["error"] = b.error;
  j["ops"] = ops;
  return j;
}

// The timed draft call: every op in order, and per op name (linears by output width) summed, printed.
json draft_breakdown_json(const DraftBreakdown& d) {
  json ops = json::array();
  std::map<std::string, std::pair<double, int64_t>> by_op;
  double sum = 0, gaps = 0;
  for (const OpTiming& op : d.ops) {
    ops.push_back({{"op", op.op}, {"out_features", op.out_features}, {"ms", op.ms}, {"gap_before_ms", op.gap_before_ms}});
    const std::string key = op.op == "linear" ? "linear[" + std::to_string(op.out_features) + "]" : op.op;
    by_op[key].first += op.ms;
    by_op[key].second += 1;
    sum += op.ms;
    gaps += op.gap_before_ms;
  }
  std::printf("       draft call timed: %.3f ms wall, %zu ops %.3f ms GPU, gaps %.3f ms;", d.call_ms, d.ops.size(), sum, gaps);
  for (const auto& [name, v] : by_op) std::printf(" %s %.3f/%lld", name.c_str(), v.first, static_cast<long long>(v.second));
  std::printf("%s%s\n", d.error.empty() ? "" : " error: ", d.error.c_str());
  json j = {{"call_ms", d.call_ms}, {"ops_ms", sum}, {"gaps_ms", gaps}, {"ops", ops}};
  if (!d.error.empty()) j["error"] = d.error;
  return j;
}

// Why a run with --breakdown has none: no step decoded every request (the first requests finished before the
// last ones had their first token: a long prefill phase), or too few tokens were left after the first that did.
std::string breakdown_missing(const BatchResult& r, int64_t output_len) {
  const std::string b = std::to_string(r.batch);
  if (r.breakdown_fewest_left < 0)
    return "no step decoded all " + b + " requests (the first finished before the last had its first token; give a "
           "longer --output-len)";
  return "it takes " + std::to_string(kBreakdownSteps) + " steps of all " + b + " requests, and after the first timed " +
         "decode step the first request to finish had " + std::to_string(r.breakdown_fewest_left) +
         (r.breakdown_fewest_left == 1 ? " token left " : " tokens left ") +
         "(give --output-len " + std::to_string(output_len + kBreakdownSteps - r.breakdown_fewest_left) + " or more)";
}

// One (prompt length, batch size) row: times beside their floors, and the breakdown when taken.
json result_json(const BatchResult& r, const Model& model, const Backend& backend, const DeviceProbes& probes,
                 int64_t input_len, int64_t output_len) {
  const int64_t b = r.batch;
  const double tpot = median(r.decode_step_s);
  const ModelCost& cost = model.cost();
  const double expected_experts = cost.expected_distinct_experts(b);
  const double experts = r.breakdown && r.breakdown->experts_per_layer > 0 ? r.breakdown->experts_per_layer : expected_experts;
  const int64_t mid_context = input_len + output_len / 2;
  const DecodeStepBytes bytes = cost.decode_step_bytes(b, experts, mid_context, dtype_bytes(backend.kv_dtype(), 1));
  const double decode_floor = bytes.total() / probes.copy_bytes_per_s;
  const double flops = cost.prefill_flops(input_len, b);
  const double prefill_floor = flops / probes.gemm_flops_per_s;
  const double prefill_rate = static_cast<double>(b * input_len) / r.prefill_s;
  json j;
  j["input_len"] = input_len;
  j["batch_size"] = b;
  j["ttft_ms_mean"] = mean(r.ttft_s) * 1e3;
  j["ttft_ms_max"] = r.prefill_s * 1e3;
  j["prefill_tokens_per_s"] = prefill_rate;
  j["prefill_flops"] = flops;
  j["prefill_floor_ms"] = prefill_floor * 1e3;
  j["prefill_of_floor"] = prefill_floor / r.prefill_s;
  j["tpot_ms_median"] = tpot * 1e3;
  j["tpot_ms_mean"] = mean(r.decode_step_s) * 1e3;
  j["decode_steps_measured"] = r.decode_step_s.size();
  json steps = json::array();  // each timed step in order, to the microsecond (a trend shows warming or clocks)
  for (double t : r.decode_step_s) steps.push_back(std::round(t * 1e6) / 1e3);
  j["decode_step_ms"] = std::move(steps);
  j["decode_tokens_per_s"] = tpot > 0 ? static_cast<double>(b) / tpot : 0;
  j["decode_floor_ms"] = decode_floor * 1e3;
  j["decode_of_floor"] = tpot > 0 ? decode_floor / tpot : 0;
  j["decode_floor_bytes"] = {{"dense", bytes.dense}, {"experts", bytes.experts}, {"kv", bytes.kv},
                             {"total", bytes.total()}, {"kv_context", mid_context}};
  j["experts_per_layer_expected"] = expected_experts;
  j["experts_per_layer_used"] = experts;
  j["engine_steps"] = r.steps;
  // Per request: decode phase / tokens after the first (what a client sees between tokens, speculation
  // included), both without the steps timed op by op (--breakdown).
  const double decoded = static_cast<double>(output_len - 1) - static_cast<double>(r.instrumented_tokens) / static_cast<double>(b);
  j["time_per_output_token_ms"] = decoded > 0 ? r.decode_s / decoded * 1e3 : 0;
  if (r.spec.spec_drafts > 0) {
    j["spec"] = {{"drafts", r.spec.spec_drafts},
                 {"draft_tokens", r.spec.spec_draft_tokens},
                 {"accepted_tokens", r.spec.spec_accepted_tokens},
                 {"mean_accepted_length", mean_accepted_length(r.spec)},
                 {"verify_step_ms_median", median(r.verify_step_s) * 1e3},
                 {"verify_steps_measured", r.verify_step_s.size()}};
    if (r.draft_calls > 0) j["spec"]["draft_call_ms_mean"] = r.draft_s / static_cast<double>(r.draft_calls) * 1e3;
    if (!r.verify_draft_s.empty()) j["spec"]["draft_call_ms_median"] = median(r.verify_draft_s) * 1e3;
  }
  std::printf("%6lld %10.2f %10.2f %12.0f %7.1f%% %10.3f %10.0f %7.1f%% %10.1f\n", static_cast<long long>(b),
              mean(r.ttft_s) * 1e3, r.prefill_s * 1e3, prefill_rate, 100 * prefill_floor / r.prefill_s, tpot * 1e3,
              j["decode_tokens_per_s"].get<double>(), 100 * j["decode_of_floor"].get<double>(), experts);
  if (r.spec.spec_drafts > 0)
    std::printf("       speculation: mean accepted length %.2f (%lld/%lld drafts accepted), verify step %.3f ms, "
                "%.3f ms per output token\n",
                mean_accepted_length(r.spec), static_cast<long long>(r.spec.spec_accepted_tokens),
                static_cast<long long>(r.spec.spec_draft_tokens), median(r.verify_step_s) * 1e3,
                j["time_per_output_token_ms"].get<double>());
  if (r.draft_calls > 0)
    std::printf("       draft model: %.3f ms per call, median %.3f in the verify steps (all of the step's k draft "
                "steps, in the verify step above)\n",
                r.draft_s / static_cast<double>(r.draft_calls) * 1e3, median(r.verify_draft_s) * 1e3);
  if (r.draft_breakdown) j["spec"]["draft_breakdown"] = draft_breakdown_json(*r.draft_breakdown);
  if (r.breakdown) {
    double idle = 0;
    const int64_t drafts = r.breakdown->verify_drafts;
    const double step_ms = (drafts > 0 ? median(r.verify_step_s) : tpot) * 1e3;
    j["breakdown"] = breakdown_json(*r.breakdown, model.dims().vocab_size, step_ms, &idle);
    if (drafts == 0 && median(r.decode_host_sampling_s) > 0) {
      // Steps that sample on the host wait for the device and sample in line, inside the step: their own wall
      // time less that wait and that sampling (medians over the timed steps) is the host's other work. The
      // profiled step's copy and sampling are single samples that ran slower than the median step (session 20,
      // batch 64: 13.9 + 12.2 ms against a 19.4 ms TPOT), which made idle_gaps negative.
      std::vector<double> other;
      for (size_t i = 0; i < r.decode_step_s.size(); ++i)
        other.push_back(r.decode_step_s[i] - r.decode_wait_s[i] - r.decode_host_sampling_s[i]);
      idle = median(other) * 1e3;
      json& cat = j["breakdown"]["categories_ms"];
      j["breakdown"]["sampling_host_profiled_step_ms"] = cat["sampling_host"];
      cat["sampling_host"] = median(r.decode_host_sampling_s) * 1e3;
      cat["idle_gaps"] = idle;
      j["breakdown"]["device_wait_ms_median"] = median(r.decode_wait_s) * 1e3;
      j["breakdown"]["idle_gaps_from"] = "timed steps: wall - wait for the device - host sampling (medians)";
    }
    j["breakdown"]["verify_drafts"] = drafts;
    if (drafts > 0)
      std::printf("       verify step (k = %lld) at batch %lld (ms):", static_cast<long long>(drafts), static_cast<long long>(b));
    else std::printf("       decode step at batch %lld (ms):", static_cast<long long>(b));
    for (const auto& [k, v] : j["breakdown"]["categories_ms"].items()) std::printf(" %s %.3f", k.c_str(), v.get<double>());
    std::printf("\n");
    if (r.breakdown->tiles16_per_layer > 0)
      std::printf("       routing per layer: %.1f experts, %.1f tiles of 16 tokens, %.1f of 32, at most %lld tokens an expert\n",
                  r.breakdown->experts_per_layer, r.breakdown->tiles16_per_layer, r.breakdown->tiles32_per_layer,
                  static_cast<long long>(r.breakdown->max_tokens_per_expert));
  }
  return j;
}

struct PlainRow {
  int64_t input_len = 0, batch = 0;
  double tpot_ms = 0, time_per_output_token_ms = 0;
};

// --forced-acceptance: per K, an engine whose drafter proposes the plain run's outputs runs the same
// batches (same seed: same prompts) after the plain engine is gone (its KV pool is freed first). Prints the
// verify-cost table: verify step / plain decode step, and time per output token / plain's, per (K, batch).
Status run_forced_acceptance(const Setup& s, const EngineConfig& base, const Model& model, ProfilingBackend& backend,
                             const DeviceProbes& probes, std::vector<ReferenceDrafter::Reference> references,
                             const std::vector<PlainRow>& plain, std::unique_ptr<EngineCore> plain_core, RequestId* next_id,
                             json* curve) {
  plain_core.reset();
  auto drafter = std::make_shared<const ReferenceDrafter>(std::move(references));
  std::printf("forced acceptance (drafts = the plain run's outputs, all counted as accepted)\n");
  std::vector<std::string> table;
  for (int64_t k : s.forced_k) {
    EngineConfig config = base;
    config.speculative.algorithm = SpeculativeAlgorithm::kExternal;
    config.speculative.num_draft_tokens = k;
    config.speculative.external = drafter;
    config.speculative.accept_all = true;  // bf16 near ties would send sequences off the recorded drafts
    MX_ASSIGN_OR_RETURN(auto core, EngineCore::create(model, config));
    MX_ASSIGN_OR_RETURN(auto warm, run_batch(*core, backend, model, 1, plain.front().input_len, 4, s.seed + 99, false,
                                             config.overlap_steps, next_id));
    (void)warm;
    std::printf("k = %lld\n", static_cast<long long>(k));
    for (const PlainRow& p : plain) {
      const int64_t replays_before = core->runner().num_verify_replays();
      MX_ASSIGN_OR_RETURN(BatchResult r, run_batch(*core, backend, model, p.batch, p.input_len, s.output_len, s.seed,
                                                   s.breakdown, config.overlap_steps, next_id, s.host_requests));
      json j = result_json(r, model, backend, probes, p.input_len, s.output_len);
      // Verify steps replayed from a verify graph (bucket, k) during this batch; the rest ran eagerly.
      j["verify_graph_replays"] = core->runner().num_verify_replays() - replays_before;
      const double verify_ms = median(r.verify_step_s) * 1e3;
      const double per_token_ms = j["time_per_output_token_ms"].get<double>();
      j["k"] = k;
      j["plain_tpot_ms"] = p.tpot_ms;
      j["verify_over_decode"] = p.tpot_ms > 0 ? verify_ms / p.tpot_ms : 0;
      j["plain_time_per_output_token_ms"] = p.time_per_output_token_ms;
      j["time_per_output_token_over_plain"] = p.time_per_output_token_ms > 0 ? per_token_ms / p.time_per_output_token_ms : 0;
      char line[200];
      std::snprintf(line, sizeof(line), "%4lld %6lld %8lld %10.3f %10.3f %8.2f %8.2f %10.3f %8.2f %8lld", static_cast<long long>(k),
                    static_cast<long long>(p.batch), static_cast<long long>(p.input_len), p.tpot_ms, verify_ms,
                    j["verify_over_decode"].get<double>(), mean_accepted_length(r.spec), per_token_ms,
                    j["time_per_output_token_over_plain"].get<double>(), j["verify_graph_replays"].get<long long>());
      table.push_back(line);
      curve->push_back(std::move(j));
      std::fflush(stdout);
    }
  }
  std::printf("verify cost (forced acceptance)\n%4s %6s %8s %10s %10s %8s %8s %10s %8s %8s\n", "k", "batch", "input",
              "decode ms", "verify ms", "ratio", "acc.len", "ms/token", "of plain", "graphed");
  for (const std::string& line : table) std::printf("%s\n", line.c_str());
  return Status::ok();
}

Status run(const CliArgs& args) {
  const auto process_start = Clock::now();
  LogLevel level = LogLevel::kInfo;
  if (args.has("log-level") && !parse_log_level(args.get("log-level"), &level)) return invalid_argument("unknown --log-level");
  set_log_level(level);
  if (args.has("model") == args.has("preset")) return invalid_argument("give exactly one of --model or --preset");
  Setup s;
  MX_ASSIGN_OR_RETURN(s.batch_sizes, parse_int_list(args.get("batch-size", "1,8,32,128")));
  MX_ASSIGN_OR_RETURN(s.input_lens, parse_int_list(args.get("input-len", "1024")));
  MX_ASSIGN_OR_RETURN(s.output_len, args.get_int("output-len", 128));
  MX_ASSIGN_OR_RETURN(int64_t seed, args.get_int("seed", 0));
  MX_ASSIGN_OR_RETURN(int64_t threads, args.get_int("threads", 0));
  s.seed = static_cast<uint64_t>(seed);
  s.breakdown = args.has("breakdown");
  const bool compare_overlap = args.has("compare-overlap");
  if (compare_overlap && (args.has("forced-acceptance") || args.has("disable-overlap-schedule")))
    return invalid_argument("--compare-overlap runs both step kinds itself: drop --forced-acceptance and --disable-overlap-schedule");
  MX_ASSIGN_OR_RETURN(s.host_requests, args.get_int("host-sampled-requests", 0));
  if (s.host_requests < 0) return invalid_argument("--host-sampled-requests must be >= 0");
  const bool compare_host = args.has("compare-host-sampling");
  if (compare_host && (s.host_requests == 0 || compare_overlap || args.has("compare-batched-tokens") ||
                       args.has("forced-acceptance")))
    return invalid_argument("--compare-host-sampling needs --host-sampled-requests, and not --compare-overlap, "
                            "--compare-batched-tokens or --forced-acceptance");
  std::vector<int64_t> budgets;  // --compare-batched-tokens
  if (args.has("compare-batched-tokens")) {
    if (compare_overlap || args.has("max-num-batched-tokens") || args.has("forced-acceptance"))
      return invalid_argument("--compare-batched-tokens sets the step budgets itself: drop --max-num-batched-tokens, "
                              "--compare-overlap and --forced-acceptance");
    MX_ASSIGN_OR_RETURN(budgets, parse_int_list(args.get("compare-batched-tokens")));
    for (int64_t b : budgets)
      if (b < 1 || b > (int64_t{1} << 20)) return invalid_argument("--compare-batched-tokens values must be in [1, 1048576]");
  }
  if (args.has("forced-acceptance")) {
    MX_ASSIGN_OR_RETURN(s.forced_k, parse_int_list(args.get("forced-acceptance")));
    for (int64_t k : s.forced_k)
      if (k < 1 || k > 16) return invalid_argument("--forced-acceptance values must be in [1, 16]");
    if (args.has("speculative-algorithm"))
      return invalid_argument("--forced-acceptance brings its own drafter: drop --speculative-algorithm");
  }
  for (int64_t b : s.batch_sizes)
    if (b < 1 || b > 4096) return invalid_argument("--batch-size values must be in [1, 4096]");
  for (int64_t n : s.input_lens)
    if (n < 1 || n > (int64_t{1} << 24)) return invalid_argument("--input-len values must be in [1, 16777216]");
  if (s.output_len < 2) return invalid_argument("--output-len must be >= 2");
  if (threads < 0 || threads > 1024) return invalid_argument("--threads must be in [0, 1024]");
  const int64_t max_batch = *std::max_element(s.batch_sizes.begin(), s.batch_sizes.end());
  const int64_t max_input = *std::max_element(s.input_lens.begin(), s.input_lens.end());

  BackendOptions bo;
  bo.name = args.get("backend", kDefaultBackend);
  bo.num_threads = static_cast<int>(threads);
  MX_ASSIGN_OR_RETURN(const int tp, tensor_parallel_size(args));
  MX_RETURN_IF_ERROR(check_tensor_parallel_backend(bo, tp));
  if (tp > 1 && !args.has("model"))
    return invalid_argument("--tensor-parallel-size needs --model: every rank loads its share from the directory "
                            "(make one with mxserve make-model)");
  MX_ASSIGN_OR_RETURN(auto inner, make_backend(bo));
  // --decode-attention, --bf16-experts-decode, --skinny-strip-rows, --moe-decode-combine, --moe-decode-form,
  // --moe-wgmma-loads, --moe-wgmma-glue, --moe-wgmma-order, --moe-wgmma-prefill-loads, --decode-overlap, --qkv-rope-form,
  // --qkv-rope-epilogue, --skinny-staged, --skinny-decode-form, --gemma-row-form, --gemma-prefill-experts: one
  // kernel choice each, or several values of one flag compared (an engine each, below): those come first in
  // kernel_choices, `compared` of them.
  std::vector<KernelChoice> kernel_choices;
  size_t compared = 0;
  for (const char* flag :
       {"decode-attention", "bf16-experts-decode", "skinny-strip-rows", "moe-decode-combine", "moe-decode-form",
        "moe-wgmma-loads", "moe-wgmma-glue", "moe-wgmma-order", "moe-wgmma-prefill-loads", "decode-overlap",
        "qkv-rope-form", "qkv-rope-epilogue", "skinny-staged", "skinny-decode-form", "gemma-row-form",
        "gemma-prefill-experts"}) {
    if (!args.has(flag)) continue;
    if (tp > 1)
      return invalid_argument(std::string("--") + flag + " sets one backend's kernels: not with --tensor-parallel-size");
    std::vector<KernelChoice> choices;
    std::stringstream list(args.get(flag));
    for (std::string value; std::getline(list, value, ',');) choices.push_back({flag, value});
    if (choices.size() > 1 &&
        (compare_overlap || compare_host || !budgets.empty() || args.has("forced-acceptance") || compared > 0))
      return invalid_argument(std::string("--") + flag +
                              " with several values compares them itself: not with --compare-overlap, "
                              "--compare-host-sampling, --compare-batched-tokens, --forced-acceptance or another "
                              "flag's several values");
    if (choices.size() > 1) compared = choices.size();
    kernel_choices.insert(choices.size() > 1 ? kernel_choices.begin() : kernel_choices.end(), choices.begin(),
                          choices.end());
  }
  // Every value checked before any is applied (a CPU backend refuses the first that is), all before the model loads.
  for (const KernelChoice& c : kernel_choices) MX_RETURN_IF_ERROR(check_kernel_choice(c.flag, c.value));
  for (const KernelChoice& c : kernel_choices) MX_RETURN_IF_ERROR(c.apply(*inner));
  if (compared > 0) MX_RETURN_IF_ERROR(kernel_choices[0].apply(*inner));  // the first engine's (flags set apart)
  Backend* const kernel_backend = inner.get();  // where a comparison switches the kernels
  ProfilingBackend backend(std::move(inner));
  if (s.breakdown && !backend.make_timer(2).is_ok())
    return invalid_argument("--breakdown needs a backend with a device timer (cuda)");

  MX_ASSIGN_OR_RETURN(const ModelLoadOptions load_options, model_load_options(args));
  const auto load_start = Clock::now();
  std::unique_ptr<Model> model;
  double synth_s = 0;
  if (args.has("model")) {
    MX_ASSIGN_OR_RETURN(model, load_tensor_parallel_model(args.get("model"), backend, bo, tp, load_options));
  } else {
    SyntheticOptions so;
    so.seed = s.seed;
    so.threads = static_cast<int>(threads);
    MX_ASSIGN_OR_RETURN(SyntheticCheckpoint synthetic, synthetic_checkpoint_in_memory(args.get("preset"), so));
    synth_s = since(load_start);
    MX_ASSIGN_OR_RETURN(model, model_from_checkpoint(synthetic.config_json, "preset " + args.get("preset"),
                                                     std::move(synthetic.generation_config),
                                                     std::move(synthetic.checkpoint), backend, load_options));
  }
  const double load_s = since(load_start);
  const int64_t vocab = model->dims().vocab_size;

  EngineConfig config;
  config.max_running_requests = max_batch;
  config.max_num_batched_tokens =
      budgets.empty() ? std::max<int64_t>(16384, max_input) : *std::max_element(budgets.begin(), budgets.end());
  config.max_model_len = max_input + s.output_len;
  MX_RETURN_IF_ERROR(read_engine_flags(args, &config));
  config.whole_page_table_uploads = args.has("whole-page-table-uploads");
  config.enable_prefix_cache = false;  // every prompt is new anyway; no reuse across batch sizes
  const auto engine_start = Clock::now();
  MX_ASSIGN_OR_RETURN(auto core, EngineCore::create(*model, config));
  const double engine_s = since(engine_start);
  const double ready_s = since(process_start);
  const RunnerStartup startup = core->runner().startup();  // a copy: --forced-acceptance ends the core early

  MX_ASSIGN_OR_RETURN(DeviceProbes probes, measure_device_probes(backend));
  std::fprintf(stderr, "device %s: copy %.2f TB/s (r+w), bf16 GEMM %.0f TFLOP/s at n=%lld (%s)\n",
               backend.device_name().c_str(), probes.copy_bytes_per_s / 1e12, probes.gemm_flops_per_s / 1e12,
               static_cast<long long>(probes.gemm_n), probes.clock.c_str());

  const int64_t pool_tokens = core->runner().startup().kv_pages * config.page_size;
  // What each batch runs under: --compare-overlap serial then overlapped steps, --compare-batched-tokens each
  // budget, else the engine's configuration once.
  struct StepVariant {
    bool overlap;
    int64_t budget;
    std::string label;  // printed above the variant's row when comparing
    int choice = 0;     // index into kernel_choices when comparing (a fresh engine whenever it changes)
    bool whole_host = false;  // ModelRunner::set_whole_batch_host_sampling
  };
  const int64_t full_budget = core->config().max_num_batched_tokens;
  std::vector<StepVariant> variants;
  if (compare_overlap) {
    variants = {{false, full_budget, "serial steps"}, {true, full_budget, "overlapped steps"}};
  } else if (compare_host) {
    variants = {{config.overlap_steps, full_budget, "every row of a step with host rows on the host", 0, true},
                {config.overlap_steps, full_budget, "only the host rows on the host", 0, false}};
  } else if (compared > 1) {
    for (size_t i = 0; i < compared; ++i)
      variants.push_back({config.overlap_steps, full_budget, kernel_choices[i].flag + " " + kernel_choices[i].value,
                          static_cast<int>(i)});
  } else {
    for (int64_t budget : budgets)
      variants.push_back({config.overlap_steps, budget, "step budget " + std::to_string(budget) + " tokens"});
    if (variants.empty()) variants.push_back({config.overlap_steps, full_budget, ""});
  }
  RequestId next_id = 1;
  std::vector<PlainRow> plain_rows;                     // --forced-acceptance: the plain rows to compare with
  std::vector<ReferenceDrafter::Reference> references;  // and every request's output
  json results = json::array();
  json skipped = json::array();
  int engine_choice = 0;  // the kernel choice the current engine's graphs were captured with
  std::set<std::tuple<int64_t, int64_t, int64_t>> warmed_shapes;  // (prompt length, prompts, step budget) run untimed
  // Another kernel choice: a fresh engine captures its graphs with it (the old one's KV pool freed first), warmed
  // on one prompt of `input_len`.
  auto use_choice = [&](int choice, int64_t input_len) -> Status {
    if (choice == engine_choice) return Status::ok();
    core.reset();
    MX_RETURN_IF_ERROR(kernel_choices[static_cast<size_t>(choice)].apply(*kernel_backend));
    MX_ASSIGN_OR_RETURN(core, EngineCore::create(*model, config));
    engine_choice = choice;
    MX_ASSIGN_OR_RETURN(auto rewarm, run_batch(*core, backend, *model, 1, input_len, std::min<int64_t>(s.output_len, 4),
                                               s.seed + 99, false, config.overlap_steps, &next_id));
    (void)rewarm;
    return Status::ok();
  };
  for (int64_t input_len : s.input_lens) {
    // Warm-up per prompt length: library plans for its prefill shapes, first-touch costs.
    const int64_t warm_batch = std::min<int64_t>(max_batch, std::max<int64_t>(1, std::min<int64_t>(4, pool_tokens / (input_len + 4))));
    MX_ASSIGN_OR_RETURN(auto warm, run_batch(*core, backend, *model, warm_batch, input_len, std::min<int64_t>(s.output_len, 4),
                                             s.seed + 99, false, config.overlap_steps, &next_id));
    (void)warm;
    std::printf("input %lld tokens, output %lld\n", static_cast<long long>(input_len), static_cast<long long>(s.output_len));
    std::printf("%6s %10s %10s %12s %8s %10s %10s %8s %10s\n", "batch", "TTFT ms", "TTFTmax", "prefill t/s", "of flr",
                "TPOT ms", "decode t/s", "of flr", "experts/L");
    for (int64_t b : s.batch_sizes) {
      const int64_t pages_per_request = (input_len + s.output_len + config.page_size - 1) / config.page_size;
      const int64_t needed = b * pages_per_request * config.page_size;
      if (needed > pool_tokens) {
        std::printf("%6lld skipped: needs %lld KV tokens, the pool holds %lld\n", static_cast<long long>(b),
                    static_cast<long long>(needed), static_cast<long long>(pool_tokens));
        skipped.push_back({{"input_len", input_len}, {"batch_size", b}, {"kv_tokens_needed", needed},
                           {"kv_tokens_in_pool", pool_tokens}});
        continue;
      }
      // The same prompts (the same seed) under each step kind or budget compared.
      for (const StepVariant& v : variants) {
        if (!v.label.empty()) std::printf("       %s:\n", v.label.c_str());
        MX_RETURN_IF_ERROR(use_choice(v.choice, input_len));
        MX_RETURN_IF_ERROR(core->set_step_token_budget(v.budget));
        core->runner().set_whole_batch_host_sampling(v.whole_host);
        // This batch's first prefill step shape (the prompts one step holds) once untimed in the process before its
        // first row: a shape's first step pays one-time host work (cuBLASLt plans by token count, scratch grown
        // behind a device sync), which read as the first engine of a comparison being slow (session 22 W1, 20b
        // 1K b=1: TTFT 23.4-23.8 ms on the first of three identical engines, 15.4 on the others).
        const int64_t shape_prompts = std::min<int64_t>(b, std::max<int64_t>(1, v.budget / input_len));
        if (warmed_shapes.insert({input_len, shape_prompts, v.budget}).second) {
          MX_ASSIGN_OR_RETURN(auto shape_warm, run_batch(*core, backend, *model, shape_prompts, input_len,
                                                         std::min<int64_t>(s.output_len, 4), s.seed + 99, false,
                                                         v.overlap, &next_id));
          (void)shape_warm;
        }
        MX_ASSIGN_OR_RETURN(BatchResult r, run_batch(*core, backend, *model, b, input_len, s.output_len, s.seed, s.breakdown,
                                                     v.overlap, &next_id, s.host_requests));
        results.push_back(result_json(r, *model, backend, probes, input_len, s.output_len));
        results.back()["overlapped_steps"] = v.overlap;
        results.back()["max_num_batched_tokens"] = v.budget;
        if (s.host_requests > 0) {
          results.back()["host_sampled_requests"] = s.host_requests;
          results.back()["whole_batch_host_sampling"] = v.whole_host;
        }
        for (size_t i = 0; i < kernel_choices.size(); ++i) {  // the flags' values this row ran under
          const KernelChoice& c = kernel_choices[i];
          if (i < compared && static_cast<int>(i) != v.choice) continue;
          results.back()[json_key(c.flag)] = c.value;
        }
        if (s.breakdown && !r.breakdown) {
          const std::string why = breakdown_missing(r, s.output_len);
          std::printf("       no breakdown at batch %lld: %s\n", static_cast<long long>(b), why.c_str());
          results.back()["breakdown_missing"] = why;
        }
        if (!s.forced_k.empty()) {
          plain_rows.push_back({input_len, b, results.back()["tpot_ms_median"].get<double>(),
                                results.back()["time_per_output_token_ms"].get<double>()});
          references.insert(references.end(), r.outputs.begin(), r.outputs.end());
        }
        std::fflush(stdout);
      }
    }
  }
  json verify_curve = json::array();
  if (!s.forced_k.empty()) {
    MX_RETURN_IF_ERROR(run_forced_acceptance(s, config, *model, backend, probes, std::move(references), plain_rows,
                                             std::move(core), &next_id, &verify_curve));
  }

  // One prompt's prefill step, eager (no graphs for prefill) behind a device hold: on the engine, or on each
  // engine of a comparison (labelled with its value, as the rows).
  json prefill_breakdown;
  auto time_prefill_step = [&](const std::string& label) -> Result<json> {
    RequestInput in;
    std::mt19937_64 rng(s.seed + 7);
    for (int64_t i = 0; i < max_input; ++i) in.prompt.push_back(static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab)));
    in.max_tokens = 1;
    MX_RETURN_IF_ERROR(core->add_request(next_id++, std::move(in)));
    MX_RETURN_IF_ERROR(backend.start_timing(0.5));
    std::vector<RequestOutput> outputs;
    const auto t = Clock::now();
    core->step(&outputs);
    const double wall_ms = since(t) * 1e3;
    auto ops = backend.finish_timing();
    while (core->has_work()) core->step(&outputs);
    Breakdown b;
    if (ops.is_ok()) b.ops = std::move(*ops);
    else b.error = ops.status().to_string();
    b.host_sampling_ms = core->runner().last_sample_seconds() * 1e3;
    double unused = 0;
    json j = breakdown_json(b, vocab, 0, &unused);
    j["prompt_tokens"] = max_input;
    j["step_wall_ms_including_hold"] = wall_ms;
    std::printf("prefill step, one %lld-token prompt%s%s (ms):", static_cast<long long>(max_input),
                label.empty() ? "" : ", ", label.c_str());
    for (const auto& [k, v] : j["categories_ms"].items()) std::printf(" %s %.3f", k.c_str(), v.get<double>());
    std::printf("\n");
    std::fflush(stdout);
    return j;
  };
  if (s.breakdown && core && compared > 1) {
    prefill_breakdown = json::array();
    for (size_t k = 0; k < compared; ++k) {  // the engine there is first: one fresh engine fewer
      const auto i = (static_cast<size_t>(engine_choice) + k) % compared;
      const KernelChoice& c = kernel_choices[i];
      MX_RETURN_IF_ERROR(use_choice(static_cast<int>(i), max_input));
      MX_ASSIGN_OR_RETURN(json j, time_prefill_step(c.flag + " " + c.value));
      j[json_key(c.flag)] = c.value;
      prefill_breakdown.push_back(std::move(j));
    }
  } else if (s.breakdown && core) {
    MX_ASSIGN_OR_RETURN(prefill_breakdown, time_prefill_step(""));
  }

  json out;
  out["bench"] = "latency";
  const char* commit = std::getenv("MX_COMMIT");
  out["commit"] = commit ? commit : "unknown";
  out["device"] = backend.device_name();
  out["backend"] = backend.name();
  out["model"] = args.has("model") ? args.get("model") : "preset:" + args.get("preset");
  out["dense_dtype"] = args.get("dense-dtype", "bf16");
  out["input_lens"] = s.input_lens;
  out["output_len"] = s.output_len;
  out["cuda_graphs"] = !startup.graph_batch_sizes.empty();
  out["probes"] = {{"copy_tb_per_s_read_plus_write", probes.copy_bytes_per_s / 1e12},
                   {"copy_bytes", probes.copy_bytes},
                   {"gemm_tflops_bf16", probes.gemm_flops_per_s / 1e12},
                   {"gemm_n", probes.gemm_n},
                   {"clock", probes.clock},
                   {"floors", "decode: bytes / copy bandwidth; prefill: FLOPs / measured GEMM rate"}};
  json st;
  st["ready_s"] = ready_s;
  st["load_s"] = load_s;
  st["synthesize_in_memory_s"] = synth_s;
  st["engine_create_s"] = engine_s;
  st["graph_capture_s"] = startup.capture_seconds;
  st["graph_bytes"] = startup.graph_bytes;
  st["graph_batch_sizes"] = startup.graph_batch_sizes;
  st["weights_bytes"] = model->device_weight_bytes();
  st["kv_pages"] = startup.kv_pages;
  st["kv_tokens"] = startup.kv_pages * config.page_size;
  st["kv_bytes"] = startup.kv_bytes;
  if (startup.planned) {
    const KvMemoryInputs& m = startup.memory;
    st["plan"] = {{"device_bytes", m.device_bytes},   {"mem_fraction", m.mem_fraction},
                  {"weights_bytes", m.weights_bytes}, {"activation_bytes", m.activation_bytes},
                  {"other_bytes", m.other_bytes},     {"bytes_per_token", m.bytes_per_token},
                  {"kv_tokens", startup.plan.kv_tokens}, {"max_model_len", m.max_model_len},
                  {"full_context_requests", startup.plan.full_context_requests},
                  {"text", describe_kv_memory_plan(m, startup.plan)}};
    // The same plan on an 80 GB H100 and a 141 GB H200 (81,559 / 143,771 MiB as the driver reports them) at the
    // model's full context, with this run's activations and batch limits.
    for (const auto& [key, mib] : {std::pair{"plan_on_h100_80gb", 81559ll}, std::pair{"plan_on_h200_141gb", 143771ll}}) {
      KvMemoryInputs other = m;
      other.device_bytes = mib << 20;
      other.max_model_len = model->dims().context_len;
      auto plan = plan_kv_memory(other);
      st[key] = plan.is_ok() ? json(describe_kv_memory_plan(other, *plan)) : json(plan.status().message());
    }
    KvMemoryInputs full = m;
    full.max_model_len = model->dims().context_len;
    auto here = plan_kv_memory(full);
    if (here.is_ok()) st["plan_at_full_context"] = describe_kv_memory_plan(full, *here);
  }
  out["startup"] = st;
  out["results"] = results;
  if (!skipped.empty()) out["skipped"] = skipped;
  if (s.breakdown) out[prefill_breakdown.is_array() ? "prefill_breakdowns" : "prefill_breakdown"] = prefill_breakdown;
  if (!s.forced_k.empty()) out["verify_cost"] = verify_curve;
  std::fprintf(stderr, "ready in %.1f s (load %.1f s, engine %.1f s, graphs %.2f s)\n", ready_s, load_s, engine_s,
               startup.capture_seconds);
  if (args.has("json")) {
    std::ofstream f(args.get("json"));
    f << out.dump(2) << "\n";
    if (!f) return io_error("cannot write " + args.get("json"));
  }
  // The teardown, timed (session 21: runs of several engines went on for seconds after their last result).
  const auto teardown = Clock::now();
  core.reset();
  const double engine_free_s = since(teardown);
  model.reset();
  MX_LOG(Info) << "teardown: engine " << engine_free_s << " s, model " << since(teardown) - engine_free_s
               << " s (the backend and the process after this line)";
  return Status::ok();
}

}  // namespace

int run_bench_latency_command(int argc, char** argv) { return run_cli_command(argc, argv, "bench latency", options(), run); }

}  // namespace mx
