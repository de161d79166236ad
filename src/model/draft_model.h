// The model-based drafting seam: a draft model proposes the next k tokens of many sequences at once, on the
// target's device, from what the target's last forward pass left behind.
//
// How the engine drives it (runtime/model_runner.h ModelRunner::draft, after Scheduler::update):
//  1. The target runs a step (prefill chunk, decode or verify) and samples; the scheduler appends the
//     accepted tokens. Each request that will decode next (its last token appended, not yet computed) and may
//     speculate becomes one DraftBatch row: that last token, its position p (= the request's computed tokens),
//     its page tables, and the row of the target's ForwardOutput::hidden that produced the token (the final
//     norm's output at position p - 1; for a verify entry the row of the last accepted draft).
//  2. DraftModel::draft runs k steps for all rows and writes the drafts. The engine copies them to the requests
//     (Request::draft_tokens); the next schedule() verifies them (scheduler.h), capped by max_tokens, the context
//     and the budget. Drafts are greedy point masses, so the existing "accept while the sample equals the draft"
//     rule is exact (spec/drafter.h).
//  3. Nothing to roll back on the draft side when drafts are rejected: a draft model writes no KV of its own.
//     It may read the target's KV cache (the pages of positions 0 .. p - 1; in window groups the last
//     `window + window_slack()` of them, which the engine keeps for it).
//     Except a drafter that keeps_own_kv() (EAGLE-3): it extends its own KV over every row the target kept
//     (DraftBatch::drafting / extend_only give each sequence's rows, tokens and pages on the host, including
//     prompt chunks that draft nothing yet) and rolls back by rewriting (model/eagle3/eagle3_drafter.h).
// A new drafter (EAGLE-3, ...) implements DraftModel and one case of load_draft_model. Hidden states of other
// target layers come through target_observer, which the engine passes to every target forward pass (graphs
// included).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/kv_cache.h"
#include "model/model.h"

namespace mx {

// A sequence's rows in the step the target just ran, on the host (for drafters that keep KV of their own).
struct DraftSequenceRows {
  int64_t first_row = 0, num_rows = 0;          // rows [first_row, first_row + num_rows) of target_hidden
  int64_t first_position = 0;                   // the first row's position; the rest follow
  std::span<const int32_t> tokens;              // the sequence's tokens (each row's next token is among them)
  std::span<const std::vector<int32_t>> pages;  // its page table per KV group (logical -> physical page)
};

// One draft call's inputs, all in the target backend's memory. Row i of every view is sequence i.
struct DraftBatch {
  int64_t num_seqs = 0;       // S
  // One row per sequence: token_ids = the last token, positions = its position p, token_seq = i, the
  // sequences' page tables (one per KV group, as the target's steps carry them).
  BatchView queries;
  // The same rows with positions p - 1: the last key each sequence has in the cache (attention over the target's
  // KV: a query at p - 1 sees keys 0 .. p - 1, window layers the last `window` of them).
  BatchView context;
  TensorView hidden_rows;     // i32 [S]: each sequence's row in target_hidden
  TensorView target_hidden;   // [T, H_target] the target's ForwardOutput::hidden of the step just run
  // Filled when the draft model keeps_own_kv(), which then gets these host rows instead of queries, context
  // and hidden_rows (left empty: each upload synchronizes the stream): drafting[i] = sequence i's kept rows
  // (the last is its hidden row); extend_only = sequences whose rows this step drafts nothing (prompt chunks
  // before the last).
  std::vector<DraftSequenceRows> drafting, extend_only;
};

// A draft model's activation buffers, sized once for up to max_seqs sequences (make_workspace).
class DraftWorkspace {
 public:
  virtual ~DraftWorkspace() = default;
  int64_t max_seqs = 0;
  // Set by the engine once its KV pool is planned: the batch buckets (<= max_seqs) whose draft calls may
  // replay graphs (empty: every draft call eager; a drafter may ignore them) and the widest page-table row of
  // a sequence (max_model_len / page_size).
  std::vector<int64_t> graph_batch_sizes;
  int64_t max_pages_per_seq = 0;
  // A drafter whose drafts come to the host anyway (EAGLE-3 maps draft-vocabulary ids there) may leave them
  // here ([num_drafts, S], step-major) instead of in draft()'s `drafts`: an upload and a download (each a
  // stream sync) fewer. The engine clears it before each call.
  std::vector<int32_t> host_drafts;
};

class DraftModel {
 public:
  virtual ~DraftModel() = default;
  virtual std::string name() const = 0;  // for logs: "gemma4_assistant"
  // Keys below each window group's window that the drafter reads (0: none); the engine keeps them in the pools.
  virtual int64_t window_slack() const { return 0; }
  // Buffers for up to max_seqs sequences of a draft call and target steps of up to max_target_tokens rows.
  virtual Result<std::unique_ptr<DraftWorkspace>> make_workspace(int64_t max_seqs, int64_t max_target_tokens) const = 0;
  // Runs `num_drafts` draft steps for the batch's sequences: drafts i32 [num_drafts, S] (step-major: row j holds
  // every sequence's draft j), in backend memory or in ws.host_drafts. `kv` is the target's cache. Allocates nothing (a drafter
  // that keeps its own KV allocates it at its first call, once the pool is planned). S may be 0 when only
  // extend_only rows came (keeps_own_kv()).
  virtual Status draft(const DraftBatch& batch, const KvCache& kv, DraftWorkspace& ws, int64_t num_drafts,
                       TensorView drafts) const = 0;
  // True: the draft keeps KV of its own over every target position (the batch's host rows are filled, and
  // draft() is called for prompt chunks too).
  virtual bool keeps_own_kv() const { return false; }
  // Passed to every forward pass of the target (eager, warm-up and captured graphs): a drafter that reads
  // hidden states of other target layers copies them into `ws` here. Empty: none.
  virtual HiddenObserver target_observer(DraftWorkspace& ws) const {
    (void)ws;
    return {};
  }
};

// Loads the draft model in `dir` (config.json's model_type picks it) for `target`, on the target's backend:
// "gemma4_assistant" (Gemma-4's MTP drafter, for a Gemma-4 target) or an EAGLE-3 draft (architectures
// LlamaForCausalLMEagle3, for a gpt-oss target). Mismatched targets and unsupported checkpoints are clear errors.
Result<std::unique_ptr<DraftModel>> load_draft_model(const std::string& dir, const Model& target);

}  // namespace mx
