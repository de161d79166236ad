// Turns a step's sequences (host arrays) into a BatchView in backend memory. The staging buffers are
// allocated once for the largest batch, so building a batch allocates nothing on the device.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"

namespace mx {

struct BatchSequence {
  std::span<const int32_t> tokens;  // the tokens computed this step
  int64_t start_position = 0;       // position of tokens[0]; earlier positions are in the KV cache
  std::span<const int32_t> pages;   // the sequence's page table row (logical -> physical page)
  bool all_logits = false;          // logits for every token of this step, else only for the last one
  bool no_logits = false;           // a middle chunk of a prefill needs none
  // One row per layer group, overriding `pages` (which, when this is empty, every group uses).
  std::span<const std::vector<int32_t>> group_pages = {};
};

struct BatchLimits {
  int64_t max_tokens = 0;
  int64_t max_seqs = 0;
  int64_t max_pages_per_seq = 0;
  int64_t max_logit_rows = 0;
  int64_t num_kv_groups = 1;  // page tables per batch (KvLayout groups)
  // Benchmarks: write and upload every table column (before 2026-11-28 every step did), not only the used ones.
  bool whole_tables = false;
};

class BatchStaging {
 public:
  static Result<BatchStaging> create(Backend& backend, const BatchLimits& limits);

  const BatchLimits& limits() const { return limits_; }
  // Fails (without touching the device) when the batch exceeds the limits. stage() = pack() + upload().
  Result<BatchView> stage(const std::vector<BatchSequence>& seqs);
  // stage() in two halves, so that the host work can overlap the device's previous step: pack writes the
  // step into host memory and returns its view (the device buffers it will occupy); upload copies it there.
  // Nothing may pack between the two.
  Result<BatchView> pack(const std::vector<BatchSequence>& seqs);
  Status upload();

 private:
  Backend* backend_ = nullptr;
  BatchLimits limits_;
  // One step's sections, packed from offset 0 in the order token_ids | positions | token_seq | logit_rows |
  // page tables (each section starting on a 16-element boundary), all i32, so one copy moves the step: every
  // copy synchronizes the stream, and the GPU idles through each. The offsets follow from (tokens, logit
  // rows, sequences) alone, so every batch of one shape (a graph's bucket) finds each section at the same
  // address, as graph replays need. A step's page tables are [groups, seqs, max_pages_per_seq].
  Buffer device_;
  std::vector<int32_t> host_;  // the step staged here first, in the same layout
  // The packed step's upload: elements before the tables, table rows, columns each row uploads.
  int64_t packed_tables_at_ = -1, packed_table_rows_ = 0, packed_columns_ = 0;
};

}  // namespace mx
