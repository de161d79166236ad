// The scheduler: decides which tokens of which requests run in the next forward pass, owns the page
// tables (through the KvPools, one pool per KV layer group) and applies each step's sampled tokens (stop
// checks, finishing, freeing; sliding-window groups release the pages their window left behind). It never
// touches device memory and never sees logits.
//
// Policy, per step, under a token budget (max_num_batched_tokens):
//  1. Running requests, oldest admission first, each gets min(tokens left to compute, budget left): one
//     token for a decode, a chunk for a prefill, so decodes and prefill chunks share a batch. When a
//     request's next pages cannot be allocated, the newest running request is preempted (its pages
//     released, its progress dropped, recomputed later; counted), until the pages fit or it was itself
//     the newest.
//  2. Then, if nothing was preempted this step, waiting requests in FCFS order (preempted ones first)
//     while running < max_running_requests: a prefix-cache lookup (at most (tokens - 1) / P full pages,
//     so a full hit still recomputes the last token), then a chunk like above. The first one that does
//     not fit stops admission (no overtaking).
//  Speculative decoding (EngineConfig::speculative): a running request about to decode one token asks the
//  drafter for up to k next tokens (capped by max_tokens, the context and the budget); the entry then
//  computes k + 1 tokens (Request::verify_tokens: the last token and the drafts) with logits for each row,
//  if the pages for all of them are free (otherwise it decodes plainly: drafts never preempt). update()
//  appends the sample of row 0, then of row i + 1 while the sample of row i equalled draft i (stop checks
//  after each token, so eos, stop strings and max_tokens cut an accepted run), counts the rows whose KV
//  stays as computed, registers only their full pages in the prefix cache and frees the pages that hold
//  only rejected positions.
// The oldest running request can always progress: everything newer can be preempted and any request fits
// the pool alone (EngineConfig caps max_model_len by the pool), so the engine never deadlocks.
#pragma once

#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/engine_config.h"
#include "runtime/kv_pools.h"
#include "runtime/request.h"
#include "spec/drafter.h"

namespace mx {

// One request's share of a step: compute tokens[start, start + num_tokens) and, when `sample`, sample the
// next token from the last one's logits. `all_logits`: logits for every token (prompt logits).
// `num_draft` > 0: a verify entry: the tokens are Request::verify_tokens (num_tokens = 1 + num_draft),
// every row is sampled.
struct ScheduledEntry {
  Request* request = nullptr;
  int64_t start = 0;
  int64_t num_tokens = 0;
  bool sample = false;
  bool all_logits = false;
  int64_t num_draft = 0;
  // Overlapped steps (schedule_ahead): the token this entry computes is the previous step's sample of this
  // row, still on the device (not yet in Request::tokens); -1: Request::tokens holds it.
  int64_t token_from_row = -1;
  // Logits rows the entry needs (in batch order): every token for prompt logits and verification, else
  // one when it samples.
  int64_t logit_rows() const { return all_logits ? num_tokens : (sample ? 1 + num_draft : 0); }
};

struct ScheduledBatch {
  std::vector<ScheduledEntry> entries;
  int64_t num_tokens = 0;
  int64_t num_samples = 0;  // sampled rows: one per sampling entry, 1 + num_draft for a verify entry
  bool empty() const { return entries.empty(); }
};

struct SchedulerStats {
  int64_t steps = 0;
  int64_t computed_tokens = 0;     // every token run through the model, recomputation included
  int64_t prefix_hit_tokens = 0;   // tokens whose keys came from the prefix cache instead
  int64_t prefix_query_tokens = 0; // tokens of the requests admitted with a prefix-cache lookup
  int64_t generated_tokens = 0;
  int64_t preemptions = 0;
  int64_t finished = 0;
  int64_t aborted = 0;
  int64_t overlapped_steps = 0;    // scheduled by schedule_ahead, while the step before ran
  // Speculative decoding (vLLM's spec_decode counters): verify entries, drafts proposed, drafts accepted,
  // and accepted drafts by position in the draft (0 = the first).
  int64_t spec_drafts = 0;
  int64_t spec_draft_tokens = 0;
  int64_t spec_accepted_tokens = 0;
  std::vector<int64_t> spec_accepted_per_pos;
};

// Tokens a verify step yields per request on average: 1 + accepted / drafts (vLLM's mean acceptance
// length; 0 before the first verify step).
double mean_accepted_length(const SchedulerStats& stats);
// "speculation: N verify steps, A/D draft tokens accepted (x%), mean accepted length L, per position ...".
std::string describe_speculation(const SchedulerStats& stats);

class Scheduler {
 public:
  // `config` is resolved and must outlive the scheduler.
  explicit Scheduler(const EngineConfig& config);

  // Queues a validated request (its vectors already reserved).
  void add(Request* request);
  // Finishes a queued or running request with kAbort and frees its pages now.
  void abort(Request* request);
  // Finishes every request of `batch` with kError (the forward pass failed).
  void fail(const ScheduledBatch& batch, const std::string& message);

  const ScheduledBatch& schedule();
  // Overlapped steps: the next step, scheduled while `inflight` (the last batch schedule() or schedule_ahead()
  // returned) still runs and before its update, assuming each of its requests appends the token being
  // sampled: every request that will not finish by length decodes that token next, read from `inflight`'s
  // samples on the device (ScheduledEntry::token_from_row). Null when the next step must wait for the
  // update: requests could be admitted, speculation or a grammar constraint needs the tokens on the host,
  // `inflight` is not one decode row of every running request, or a page cannot be had without preempting.
  // A request that `inflight`'s update finishes (a stop token or string) or an abort ends is computed anyway
  // and skipped by update(); the engine keeps its Request until then.
  const ScheduledBatch* schedule_ahead(const ScheduledBatch& inflight);
  // Benchmarks: the step's token budget from the next schedule on (1 to config.max_num_batched_tokens, which
  // sized the runner's buffers; EngineCore::set_step_token_budget checks it).
  void set_token_budget(int64_t tokens) { token_budget_ = tokens; }
  // An ahead-scheduled batch that will not run (the step before it failed): its step is not counted.
  void drop_ahead(const ScheduledBatch& batch);
  // `sampled` holds one token per entry with `sample` (1 + num_draft for a verify entry), in entry order.
  void update(const ScheduledBatch& batch, std::span<const SampledToken> sampled);

  // Appends the requests that produced output (tokens, text or a finish) since the last call; finished
  // ones have left the scheduler and hold no pages.
  void take_touched(std::vector<Request*>* out);

  // A request that will decode its next token and may verify drafts then: speculation is on, it is running
  // with only its last token to compute, it has no grammar constraint, prompt logits or forced tokens, and
  // room for a draft and the bonus token under max_tokens and the context. The engine's draft model drafts
  // for these after each step (Request::draft_tokens).
  bool may_speculate(const Request& r) const;

  const KvPools& pools() const { return pools_; }
  const std::vector<Request*>& running() const { return running_; }
  const std::deque<Request*>& waiting() const { return waiting_; }
  const SchedulerStats& stats() const { return stats_; }
  bool has_work() const { return !running_.empty() || !waiting_.empty(); }

  // Every invariant the scheduler and pools promise: reference counts equal page-table references, free +
  // used == total, waiting requests hold no pages, running ones hold exactly the pages their computed
  // tokens need (or more for a chunk in flight) and, in window groups, none below their window, running <=
  // max_running_requests.
  Status check_invariants() const;

 private:
  // Tokens the request may compute this step under the budgets (0 when none).
  int64_t chunk_size(const Request& r, int64_t budget, int64_t rows_left) const;
  // The batch buffer after the last one returned, emptied: the one schedule() and schedule_ahead() fill.
  ScheduledBatch& fresh_batch();
  void add_entry(Request* r, int64_t n, int64_t* budget, int64_t* rows_left);
  // Drafts for a request about to decode one token, when speculation is on and its pages fit (0: none).
  int64_t propose_drafts(Request* r, int64_t budget);
  // A verify entry's outcome: accepted drafts, appended tokens, computed rows kept, pages rolled back.
  void update_verified(const ScheduledEntry& e, std::span<const SampledToken> rows);
  void preempt(Request* r);
  void finish(Request* r, FinishReason reason);
  void append_token(Request* r, const SampledToken& sampled);
  void register_full_pages(Request* r);

  const EngineConfig& config_;
  int64_t token_budget_;  // tokens per step: config_.max_num_batched_tokens unless a benchmark set less
  KvPools pools_;
  bool speculating_ = false;
  std::shared_ptr<const Drafter> drafter_;  // null: no speculation, or drafts from the engine's draft model
  std::deque<Request*> waiting_;
  std::vector<Request*> running_;  // admission order
  // schedule() and schedule_ahead() alternate between the two, so the batch in flight stays intact.
  ScheduledBatch batches_[2];
  int next_batch_ = 0;
  ScheduledBatch* batch_ = nullptr;  // the one being filled
  std::vector<Request*> touched_;
  SchedulerStats stats_;
};

}  // namespace mx
