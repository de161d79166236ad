#include "runtime/batch_staging.h"

#include <algorithm>

namespace mx {
namespace {

// Section starts are rounded up to 16 i32 (64 bytes), so every section is as aligned as the buffer's start.
int64_t section_end(int64_t elements) { return (elements + 15) / 16 * 16; }

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
      std::fill(row, row + lim.max_pages_per_seq, 0);
      std::copy(pages.begin(), pages.end(), row);
    }
  }
  const int64_t tables = lim.num_kv_groups * num_seqs * lim.max_pages_per_seq;
  int32_t* device = static_cast<int32_t*>(device_.data());
  const Device where = backend_->device();
  MX_RETURN_IF_ERROR(backend_->copy_from_host(TensorView(device, DType::kI32, {tables_at + tables}, where), host_.data()));
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

}  // namespace mx
