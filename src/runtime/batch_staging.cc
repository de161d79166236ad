#include "runtime/batch_staging.h"

#include <algorithm>

namespace mx {

Result<BatchStaging> BatchStaging::create(Backend& backend, const BatchLimits& limits) {
  BatchStaging s;
  s.backend_ = &backend;
  s.limits_ = limits;
  const int64_t count = 3 * limits.max_tokens + limits.max_seqs * limits.max_pages_per_seq + limits.max_logit_rows;
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
    if (static_cast<int64_t>(s.pages.size()) > lim.max_pages_per_seq)
      return resource_exhausted("sequence needs more than " + std::to_string(lim.max_pages_per_seq) + " pages");
    if (s.tokens.empty()) return invalid_argument("a batch sequence has no tokens");
  }
  if (num_tokens > lim.max_tokens || static_cast<int64_t>(seqs.size()) > lim.max_seqs || num_rows > lim.max_logit_rows)
    return resource_exhausted("batch of " + std::to_string(num_tokens) + " tokens in " + std::to_string(seqs.size()) +
                              " sequences exceeds the staging limits");

  int32_t* token_ids = host_.data();
  int32_t* positions = token_ids + lim.max_tokens;
  int32_t* token_seq = positions + lim.max_tokens;
  int32_t* page_table = token_seq + lim.max_tokens;
  int32_t* logit_rows = page_table + lim.max_seqs * lim.max_pages_per_seq;
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
    int32_t* row = page_table + static_cast<int64_t>(i) * lim.max_pages_per_seq;
    std::fill(row, row + lim.max_pages_per_seq, 0);
    std::copy(s.pages.begin(), s.pages.end(), row);
  }
  // One copy per step: the used prefix of each section.
  auto section = [&](int32_t* host, int64_t offset, Shape shape) -> Result<TensorView> {
    TensorView dst(static_cast<int32_t*>(device_.data()) + offset, DType::kI32, shape, backend_->device());
    MX_RETURN_IF_ERROR(backend_->copy_from_host(dst, host));
    return dst;
  };
  const int64_t num_seqs = static_cast<int64_t>(seqs.size());
  batch.num_tokens = num_tokens;
  batch.num_seqs = num_seqs;
  batch.num_logit_rows = num_rows;
  MX_ASSIGN_OR_RETURN(batch.token_ids, section(token_ids, 0, {num_tokens}));
  MX_ASSIGN_OR_RETURN(batch.positions, section(positions, lim.max_tokens, {num_tokens}));
  MX_ASSIGN_OR_RETURN(batch.token_seq, section(token_seq, 2 * lim.max_tokens, {num_tokens}));
  MX_ASSIGN_OR_RETURN(batch.page_table, section(page_table, 3 * lim.max_tokens, {num_seqs, lim.max_pages_per_seq}));
  MX_ASSIGN_OR_RETURN(batch.logit_rows,
                      section(logit_rows, 3 * lim.max_tokens + lim.max_seqs * lim.max_pages_per_seq, {num_rows}));
  return batch;
}

}  // namespace mx
