// A request's life in the engine: what a caller submits (RequestInput), what it gets back
// (RequestOutput deltas on its stream), and the engine thread's private state (Request).
//
// Tokens, not phases: a request is `tokens` (prompt, then generated ids) of which the first
// `num_computed` have their keys and values in the KV cache. Prefill, chunked prefill, decode and
// recomputation after preemption are all "compute the next tokens until num_computed == tokens.size(),
// then sample one more".
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/sampler.h"
#include "runtime/token_constraint.h"
#include "runtime/stop_strings.h"

namespace mx {

using RequestId = int64_t;

enum class FinishReason : uint8_t {
  kNone = 0,  // still running
  kStop,      // a stop token or stop string
  kLength,    // max_tokens or the context length
  kAbort,     // aborted by the caller or at shutdown
  kError,     // the engine failed this request (message in RequestOutput::error)
};

// "stop", "length", "abort", "error" (OpenAI's spellings where they exist); "" for kNone.
const char* finish_reason_name(FinishReason reason);

struct RequestInput {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  std::optional<int64_t> max_tokens;       // unset: up to the context length
  std::vector<int32_t> stop_token_ids;     // in addition to the engine's eos ids
  std::vector<std::string> stop;           // stop strings (need the engine's detokenizer)
  bool ignore_eos = false;                 // do not stop at the engine's eos ids
  bool return_text = false;                // stream decoded text too (implied by `stop`)
  bool want_prompt_logits = false;         // f32 logits at every prompt position, in the final output
                                           // (needs EngineConfig::max_prompt_logit_rows; skips the prefix cache)
  // Test only: emit these ids in order instead of sampling (the forward passes still run, logprobs are the
  // model's for the forced ids). The request ends with kLength when they run out before a stop. This is how
  // server tests play real chat-format transcripts through the engine on a random-weight model.
  std::vector<int32_t> forced_tokens;
  // Structured outputs: masks the tokens this request may sample (token_constraint.h); null: unconstrained.
  std::shared_ptr<TokenConstraint> constraint;
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // prompt tokens served from the prefix cache at first admission
};

// What a stream delivers: everything new since the previous delivery. Deltas merge by appending, so a
// consumer that polls rarely simply receives a larger delta.
struct RequestOutput {
  RequestId id = -1;
  std::vector<int32_t> token_ids;           // newly released generated ids (held back while a stop string may match)
  std::vector<SampledToken> logprobs;       // parallel to token_ids when the request asked for logprobs
  std::string text;                         // newly released text (return_text or stop strings only)
  FinishReason finish = FinishReason::kNone;
  int32_t stop_token = -1;                  // the stop id that finished it, if one did
  std::string stop_string;                  // the stop string that finished it, if one did (excluded from text)
  std::string error;                        // kError only
  Usage usage;                              // totals so far
  int64_t num_preemptions = 0;
  std::vector<float> prompt_logits;         // [prompt length, vocab], final output of want_prompt_logits only
  // When the scheduler first gave the request a place in a step (epoch = not yet): queue time for metrics.
  std::chrono::steady_clock::time_point first_scheduled{};

  bool finished() const { return finish != FinishReason::kNone; }
  void clear();
  // Appends `next` (a later delta of the same request) to this one.
  void merge(RequestOutput&& next);
};

// The engine thread's view of one request. Vectors are reserved at admission for the request's maximum
// length, so growing them while it runs does not allocate.
struct Request {
  RequestId id = -1;
  int64_t arrival = 0;  // FCFS order
  std::chrono::steady_clock::time_point first_scheduled{};  // epoch until first admitted
  RequestInput input;
  int64_t prompt_len = 0;
  int64_t max_new_tokens = 0;        // resolved: max_tokens or what the context leaves
  std::vector<int32_t> tokens;       // prompt then generated ids
  // Page tables, one row per KV layer group: logical page i holds positions [i P, (i + 1) P); kNoPage
  // where a sliding-window group released it (kv_pools.h).
  std::vector<std::vector<int32_t>> pages;
  int64_t num_computed = 0;          // tokens whose keys/values are in `pages`
  // Speculative decoding: the step in flight's query tokens when it verifies drafts: the last token, then
  // the drafts (ScheduledEntry::num_draft of them). Reserved at admission for k + 1.
  std::vector<int32_t> verify_tokens;
  // Draft-model speculation (model/draft_model.h): the drafts the engine's draft model proposed after the last
  // step, valid while the request still has `drafts_for_tokens` tokens (the next schedule() verifies them).
  std::vector<int32_t> draft_tokens;
  int64_t drafts_for_tokens = -1;
  int64_t num_registered_pages = 0;  // leading pages offered to the prefix cache
  bool running = false;
  bool admitted_once = false;
  Rng rng;
  StopStringMatcher stop_matcher;    // used when `has_matcher`
  bool has_matcher = false;
  std::vector<SampledToken> logprobs;  // per generated token, when asked
  std::vector<float> prompt_logits;
  int64_t prompt_logits_filled = 0;  // positions collected (recomputation does not collect twice)

  // What has been handed to the output stream.
  int64_t released_tokens = 0;
  int64_t released_text = 0;
  FinishReason finish = FinishReason::kNone;
  int32_t stop_token = -1;
  std::string error;
  Usage usage;
  int64_t num_preemptions = 0;
  bool touched = false;  // produced something this step: publish a delta

  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t num_generated() const { return num_tokens() - prompt_len; }
  std::span<const int32_t> generated() const {
    return std::span<const int32_t>(tokens).subspan(static_cast<size_t>(prompt_len));
  }
};

}  // namespace mx
