// EAGLE-3 drafting for a batch of sequences after a target step (chain drafting, one greedy token per
// step): capture the target's hidden states during its forward pass, extend the draft's KV over the
// positions the target just kept, and run the chain.
//
// The draft's KV (one layer) is paged like the target's full-attention layers and indexed by the same
// pages: the target's full-attention group's page table is the draft's, so the page pool, prefix caching
// and rollback need nothing of their own. A page the target shares through its prefix cache carries the
// draft KV its first owner wrote (at the page's last position that pairs with the first owner's next
// token: a draft-quality detail, never a correctness one: the target verifies every draft).
// Rollback is implicit: the entries a step writes are (a) the extend rows, at positions the target kept,
// and (b) the chain rows, at positions past the target's last kept one; the next step's extend rewrites
// every position from the last kept one on before any chain row reads it, so rejected drafts leave nothing
// behind. A chain position on a page the sequence does not hold yet goes to a scratch page of the draft's
// own (one per sequence of the step, after the pool's pages): with page_size >= K - 1 the chain spills onto
// at most one such page.
// The draft KV is zeroed when made: positions the draft never wrote (prefix pages whose first owner did not
// draft) read as zeros, not as NaN garbage.
// Chain passes as graphs (enable_chain_graphs): a step whose sequences all draft the same k >= 2 runs its
// k - 1 chain passes by replaying one graph per (batch bucket, k), captured at the bucket's first such step
// (after an eager run of the same passes, which sets up backend scratch and is that step's result). The
// graph reads what the step uploads at fixed addresses (the chain's positions, a page table of a fixed
// width) and the extend pass's drafts; padding sequences up to the bucket draft from the zeroed state on
// their own scratch pages and their drafts are never read. The extend pass stays eager (its rows vary).
#pragma once

#include <map>
#include <memory>
#include <span>
#include <vector>

#include "backend/kv_cache.h"
#include "model/eagle3/eagle3_model.h"
#include "model/model.h"

namespace mx {

// One sequence's share of a draft step.
struct Eagle3SequenceStep {
  // The target step's rows of this sequence whose hidden states the draft takes: rows first_target_row ...
  // at positions first_position ..., one per entry of next_tokens (token first_position + i + 1, the one
  // each row's hidden state predicted). Rows whose next token is not known (the last row of a sequence
  // that stops) are left out.
  int64_t first_target_row = 0;
  int64_t first_position = 0;
  std::span<const int32_t> next_tokens;
  // The sequence's pages in the target's full-attention group, in logical order.
  std::span<const int32_t> pages;
  // Draft tokens wanted after the last row (0: extend the KV only); needs at least one row.
  int64_t num_drafts = 0;
};

// Sizes known when the engine makes its workspaces (before it plans the KV pool).
struct Eagle3DrafterLimits {
  int64_t max_tokens = 0;  // rows of one target step (max_num_batched_tokens)
  int64_t max_seqs = 0;    // sequences of one draft step
};

// The target's full-attention page pool, known once the engine planned it.
struct Eagle3DraftPool {
  int64_t pages = 0;  // the draft's page numbering: the same pages
  int64_t page_size = 0;
};

class Eagle3Drafter {
 public:
  // Allocates the workspace (the capture buffers the target's forward passes write: before any graph of
  // them is captured); `model` must outlive the drafter.
  static Result<std::unique_ptr<Eagle3Drafter>> create(const Eagle3Model& model, const Eagle3DrafterLimits& limits);
  // Allocates (once) and zeroes the draft KV for the target's pool, which the engine sizes after the
  // workspaces; a later call with another pool is an error.
  Status attach_pool(const Eagle3DraftPool& pool);
  // After attach_pool, on a backend that captures graphs: chain passes of steps of up to each of
  // `batch_sizes` sequences (ascending, each <= max_seqs) replay graphs whose page tables are
  // `max_pages_per_seq` + 1 wide (a sequence's pages and the chain's spill page). Allocates the step's upload
  // buffer at its largest (graphs keep its addresses). Once; a second call must repeat the first.
  Status enable_chain_graphs(std::span<const int64_t> batch_sizes, int64_t max_pages_per_seq);
  bool chain_graphs_enabled() const { return !graph_sizes_.empty(); }

  const Eagle3Model& model() const { return model_; }
  // Pass to the target's forward (Model::forward's observer): copies the residual streams the draft fuses
  // into the workspace, rows as the target batch has them.
  const HiddenObserver& capture_observer() const { return observer_; }
  // Extends the draft KV over each sequence's rows and appends each sequence's drafts (target ids) to
  // drafts[i] (cleared first; resized to seqs.size()). A sequence drafts at most page_size + 1 tokens.
  Status step(std::span<const Eagle3SequenceStep> seqs, std::vector<std::vector<int32_t>>* drafts);
  int64_t num_forward_passes() const { return forward_passes_; }
  int64_t num_chain_graph_replays() const { return chain_replays_; }  // steps whose chain replayed a graph
  // The last forward pass's buffers (its logits and g: tests compare backends on them).
  const Eagle3Workspace& workspace() const { return *ws_; }

 private:
  Eagle3Drafter(const Eagle3Model& model, const Eagle3DrafterLimits& limits) : model_(model), limits_(limits) {}
  Status allocate();
  // One forward pass: an extend pass fuses the captures at `captured_rows`, a chain pass takes the previous
  // pass's g and drafts; both leave their logit rows' drafts (draft-vocabulary ids) in `drafted`.
  Status run(const BatchView& batch, const TensorView* captured_rows, TensorView drafted);
  // A chain pass: its batch and where its drafts go.
  struct ChainPass {
    BatchView batch;
    TensorView drafted;
  };
  Status run_chain(const std::vector<ChainPass>& passes);
  // The smallest graph bucket that holds `seqs` sequences, or 0 (eager).
  int64_t chain_bucket(int64_t seqs) const;
  // Bucket `bucket`'s graph for k drafts: replays it, or (first use) runs `passes` eagerly and captures
  // them; a failed capture leaves that bucket eager.
  Status replay_or_capture(int64_t bucket, int64_t k, const std::vector<ChainPass>& passes);

  const Eagle3Model& model_;
  Eagle3DrafterLimits limits_;
  Eagle3DraftPool pool_;  // pages 0: no KV yet; the scratch pages follow the pool's
  std::unique_ptr<Eagle3Workspace> ws_;
  KvCache kv_;
  // The step's rows of every pass and its page table, uploaded in one copy (each upload synchronizes the
  // stream); grown to the largest step seen while no chain graph is enabled, else allocated at its largest.
  Buffer staging_;
  std::vector<int64_t> graph_sizes_;  // chain graph buckets (empty: every chain eager)
  int64_t graph_table_width_ = 0;     // page-table width of graph steps
  // A graph step's page table on the host, [largest bucket, graph_table_width_]; a step writes only the
  // columns its rows read (the rest keep older, unread pages).
  std::vector<int32_t> graph_table_;
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<ReplayGraph>> chain_graphs_;  // (bucket, k); null: failed
  int64_t chain_replays_ = 0;
  Buffer drafted_;  // i32 [page_size + 1, max_seqs]: draft j (draft-vocabulary ids) of the step's sequences at row j
  HiddenObserver observer_;
  // The step on the host, packed as it is uploaded. Eager chain: the extend pass's rows, then each chain
  // pass's, then the page table. Graph chain (bucket B, k drafts): the page table [B, width] (graph_table_,
  // uploaded apart when mostly unused columns), 0 .. B - 1 (every chain pass's sequence and logit row ids),
  // the k - 1 passes' positions [k - 1, B], then the extend pass's rows.
  struct HostBatch {
    std::vector<int32_t> iota, tokens, positions, seqs, logit_rows, captured_rows, chain, pages;
  } host_;
  std::vector<int32_t> packed_, drafted_host_;
  int64_t forward_passes_ = 0;
};

}  // namespace mx
