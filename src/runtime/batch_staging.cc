#include "runtime/batch_staging.h"

#include <algorithm>

namespace mx {
namespace {

// Section starts are rounded up to 16 i32 (64 bytes), so every section is as aligned as the buffer's start.
int64_t section_end(int64_t elements) { return (elements + 15) / 16 * 16; }

// Page-table columns a step writes and uploads: its longest row, rounded up to 16 (the width of a table
// changes only every 16 pages of its longest sequence).
int64_t used_columns(int64_t longest, int64_t max_pages) { return std::min(max_pages, section_end(std::max<int64_t>(longest, 1))); }

// Below this many bytes left out, the tables ride in the step's one copy whole: a second copy (a second
// stream sync, ~10 us) costs more than moving what no kernel reads.
constexpr int64_t kSplitTableUploadBytes = 64 << 10;

}  // namespace

Result<BatchStaging> BatchStaging::create(Backend& backend, const BatchLimits& limits) {
  BatchStaging s;
  s.backend_ = &backend;
  s.limits_ = limits;
  if (limits.num_kv_groups < 1 || limits.num_kv_groups > kMaxKvGroups)
    return invalid_argument("a batch carries 1 to " + std::to_string(kMaxKvGroups) + " page tables, not " +
                            std::to_string(limits.num_kv_groups));
  const int64_t count = 3 * section_end(limits.max_tokens) + section_end(limits.max_logit_rows) +
                        limits.num_kv_groups * limits.max_seqs * limits.max_pages_per_seq;
  s.host_.assign(static_cast<size_t>(count), 0);
  MX_ASSIGN_OR_RETURN(s.device_, backend.allocate(count * static_cast<int64_t>(sizeof(int32_t))));
  return s;
}

Result<BatchView> BatchStaging::stage(const std::vector<BatchSequence>& seqs) {
  MX_ASSIGN_OR_RETURN(BatchView view, pack(seqs));
  MX_RETURN_IF_ERROR(upload());
  return view;
}

Result<BatchView> BatchStaging::pack(const std::vector<BatchSequence>& seqs) {
  packed_tables_at_ = -1;
  const BatchLimits& lim = limits_;
  int64_t num_tokens = 0, num_rows = 0;
  for (const auto& s : seqs) {
    num_tokens += static_cast<int64_t>(s.tokens.size());
    num_rows += s.no_logits ? 0 : (s.all_logits ? static_cast<int64_t>(s.tokens.size()) : 1);
    const bool per_group = !s.group_pages.empty();
    if (per_group && static_cast<int64_t>(s.group_pages.size()) != lim.num_kv_groups)
      return invalid_argument("a batch sequence has " + std::to_string(s.group_pages.size()) + " page-table rows for " +
                              std::to_string(lim.num_kv_groups) + " layer groups");
    for (int64_t g = 0; g < lim.num_kv_groups; ++g)
      if (static_cast<int64_t>(per_group ? s.group_pages[static_cast<size_t>(g)].size() : s.pages.size()) > lim.max_pages_per_seq)
        return resource_exhausted("sequence needs more than " + std::to_string(lim.max_pages_per_seq) + " pages");
    if (s.tokens.empty()) return invalid_argument("a batch sequence has no tokens");
  }
  if (num_tokens > lim.max_tokens || static_cast<int64_t>(seqs.size()) > lim.max_seqs || num_rows > lim.max_logit_rows)
    return resource_exhausted("batch of " + std::to_string(num_tokens) + " tokens in " + std::to_string(seqs.size()) +
                              " sequences exceeds the staging limits");

  const int64_t num_seqs = static_cast<int64_t>(seqs.size());
  const int64_t positions_at = section_end(num_tokens), token_seq_at = 2 * positions_at,
                logit_rows_at = 3 * positions_at, tables_at = logit_rows_at + section_end(num_rows);
  int32_t* token_ids = host_.data();
  int32_t* positions = token_ids + positions_at;
  int32_t* token_seq = token_ids + token_seq_at;
  int32_t* logit_rows = token_ids + logit_rows_at;
  int32_t* page_tables = token_ids + tables_at;
  const int64_t table_size = num_seqs * lim.max_pages_per_seq;  // one group's table, packed
  // Only the columns some row uses are written and uploaded: a kernel reads a row's entries up to its
  // sequence's last position, never past them, so the device's columns beyond keep stale pages unread (at
  // a 131072-token limit a full row is 8192 pages, 32 KB per group and sequence, of which a short sequence
  // uses a few).
  int64_t longest = 0;
  for (const auto& s : seqs)
    for (int64_t g = 0; g < lim.num_kv_groups; ++g)
      longest = std::max(longest, static_cast<int64_t>(s.group_pages.empty() ? s.pages.size() : s.group_pages[static_cast<size_t>(g)].size()));
  const int64_t columns = lim.whole_tables ? lim.max_pages_per_seq : used_columns(longest, lim.max_pages_per_seq);
  BatchView batch;
  int64_t t = 0, r = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto& s = seqs[i];
    const auto n = static_cast<int64_t>(s.tokens.size());
    for (int64_t j = 0; j < n; ++j, ++t) {
      token_ids[t] = s.tokens[static_cast<size_t>(j)];
      positions[t] = static_cast<int32_t>(s.start_position + j);
      token_seq[t] = static_cast<int32_t>(i);
      if (!s.no_logits && (s.all_logits || j == n - 1)) logit_rows[r++] = static_cast<int32_t>(t);
    }
    batch.max_position = std::max(batch.max_position, s.start_position + n - 1);
    batch.max_seq_tokens = std::max(batch.max_seq_tokens, n);
    for (int64_t g = 0; g < lim.num_kv_groups; ++g) {
      const std::span<const int32_t> pages = s.group_pages.empty() ? s.pages : std::span<const int32_t>(s.group_pages[static_cast<size_t>(g)]);
      int32_t* row = page_tables + g * table_size + static_cast<int64_t>(i) * lim.max_pages_per_seq;
      std::copy(pages.begin(), pages.end(), row);
      std::fill(row + pages.size(), row + columns, 0);
    }
  }
  packed_tables_at_ = tables_at;
  packed_table_rows_ = lim.num_kv_groups * num_seqs;
  packed_columns_ = columns;
  int32_t* device = static_cast<int32_t*>(device_.data());
  const Device where = backend_->device();
  auto section = [&](int64_t offset, int64_t n) { return TensorView(device + offset, DType::kI32, {n}, where); };
  batch.num_tokens = num_tokens;
  batch.num_seqs = num_seqs;
  batch.num_logit_rows = num_rows;
  batch.token_ids = section(0, num_tokens);
  batch.positions = section(positions_at, num_tokens);
  batch.token_seq = section(token_seq_at, num_tokens);
  batch.logit_rows = section(logit_rows_at, num_rows);
  batch.num_kv_groups = lim.num_kv_groups;
  const TensorView all_tables(device + tables_at, DType::kI32, {lim.num_kv_groups * num_seqs, lim.max_pages_per_seq}, where);
  for (int64_t g = 0; g < lim.num_kv_groups; ++g) batch.page_tables[g] = all_tables.rows(g * num_seqs, (g + 1) * num_seqs);
  return batch;
}

Status BatchStaging::upload() {
  if (packed_tables_at_ < 0) return internal_error("batch upload without a packed batch");
  const int64_t max_pages = limits_.max_pages_per_seq, tables_at = packed_tables_at_, table_rows = packed_table_rows_;
  packed_tables_at_ = -1;
  int32_t* device = static_cast<int32_t*>(device_.data());
  const Device where = backend_->device();
  if ((max_pages - packed_columns_) * table_rows * 4 < kSplitTableUploadBytes)
    return backend_->copy_from_host(TensorView(device, DType::kI32, {tables_at + table_rows * max_pages}, where), host_.data());
  MX_RETURN_IF_ERROR(backend_->copy_from_host(TensorView(device, DType::kI32, {tables_at}, where), host_.data()));
  return backend_->copy_row_prefixes_from_host(TensorView(device + tables_at, DType::kI32, {table_rows, max_pages}, where),
                                               host_.data() + tables_at, packed_columns_ * 4);
}

}  // namespace mx
