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
// A new drafter (EAGLE-3, ...) implements DraftModel and one case of load_draft_model. What it needs from the
// target beyond the final hidden rows (other layers' hidden states) comes through ForwardOutput. Not covered
// yet: a drafter with a KV cache of its own (EAGLE-3's draft layer) needs pages per request beside the target's
// (written while drafting, truncated with the verify outcome as Scheduler::update_verified truncates the target's).
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/kv_cache.h"
#include "model/model.h"

namespace mx {

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
};

// A draft model's activation buffers, sized once for up to max_seqs sequences (make_workspace).
class DraftWorkspace {
 public:
  virtual ~DraftWorkspace() = default;
  int64_t max_seqs = 0;
};

class DraftModel {
 public:
  virtual ~DraftModel() = default;
  virtual std::string name() const = 0;  // for logs: "gemma4_assistant"
  // Keys below each window group's window that the drafter reads (0: none); the engine keeps them in the pools.
  virtual int64_t window_slack() const { return 0; }
  virtual Result<std::unique_ptr<DraftWorkspace>> make_workspace(int64_t max_seqs) const = 0;
  // Runs `num_drafts` draft steps for the batch's sequences: drafts i32 [num_drafts, S] (step-major: row j holds
  // every sequence's draft j), in backend memory. `kv` is the target's cache. Allocates nothing.
  virtual Status draft(const DraftBatch& batch, const KvCache& kv, DraftWorkspace& ws, int64_t num_drafts,
                       TensorView drafts) const = 0;
};

// Loads the draft model in `dir` (config.json's model_type picks it) for `target`, on the target's backend:
// "gemma4_assistant" (Gemma-4's MTP drafter, for a Gemma-4 target). Mismatched targets and unsupported
// checkpoints are clear errors.
Result<std::unique_ptr<DraftModel>> load_draft_model(const std::string& dir, const Model& target);

}  // namespace mx
