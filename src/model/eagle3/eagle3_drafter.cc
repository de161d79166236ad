#include "model/eagle3/eagle3_drafter.h"

#include <algorithm>

namespace mx {

Result<std::unique_ptr<Eagle3Drafter>> Eagle3Drafter::create(const Eagle3Model& model,
                                                             const Eagle3DrafterLimits& limits) {
  if (limits.max_tokens < 1 || limits.max_seqs < 1) return invalid_argument("EAGLE-3 drafter limits must be positive");
  std::unique_ptr<Eagle3Drafter> d(new Eagle3Drafter(model, limits));
  MX_RETURN_IF_ERROR(d->allocate());
  return d;
}

Status Eagle3Drafter::allocate() {
  Backend& b = model_.backend();
  MX_ASSIGN_OR_RETURN(ws_, model_.make_workspace(limits_.max_tokens, limits_.max_seqs));
  Eagle3Workspace* ws = ws_.get();
  const std::array<int64_t, 3> indices = model_.aux_indices();
  const int64_t Ht = model_.config().target_hidden_size;
  observer_ = [ws, indices, Ht, &b](int64_t index, const TensorView& hidden) {
    for (int64_t j = 0; j < 3; ++j) {
      if (indices[static_cast<size_t>(j)] != index) continue;
      const int64_t T = hidden.dim(0);
      MX_CHECK(T <= ws->max_tokens && hidden.dim(1) == Ht) << "EAGLE-3 capture of " << T << " rows";
      const TensorView slot = ws->captured.rows(j, j + 1).reshaped({ws->max_tokens, Ht}).rows(0, T);
      const Status st = b.copy(slot, hidden);
      MX_CHECK(st.is_ok()) << st.to_string();
    }
  };
  return Status::ok();
}

Status Eagle3Drafter::attach_pool(const Eagle3DraftPool& pool) {
  if (pool.pages < 1 || pool.page_size < 1) return invalid_argument("EAGLE-3 drafter: the target's pool must have pages");
  if (pool_.pages != 0) {
    if (pool.pages != pool_.pages || pool.page_size != pool_.page_size)
      return internal_error("EAGLE-3 drafter: the target's pool changed");
    return Status::ok();
  }
  Backend& b = model_.backend();
  const int64_t pages = pool.pages + limits_.max_seqs;
  const KvLayout layout = KvLayout::from_layers({model_.kv_spec()});
  MX_ASSIGN_OR_RETURN(kv_, KvCache::allocate(b, KvCacheShape{layout, pool.page_size, {pages}}));
  // Zeroed in slabs of pages (see the header: unwritten positions must read as numbers).
  const KvLayerView layer = kv_.layer(0);
  const int64_t page_bytes = layer.k.bytes() / pages;
  const int64_t slab_pages = std::max<int64_t>(1, (int64_t{64} << 20) / page_bytes);
  const std::vector<uint8_t> zeros(static_cast<size_t>(std::min(slab_pages, pages) * page_bytes), 0);
  for (const TensorView& t : {layer.k, layer.v})
    for (int64_t p = 0; p < pages; p += slab_pages)
      MX_RETURN_IF_ERROR(b.copy_from_host(t.rows(p, std::min(pages, p + slab_pages)), zeros.data()));
  MX_ASSIGN_OR_RETURN(rows_staging_, b.allocate((6 * limits_.max_tokens + limits_.max_seqs) * 4));
  pool_ = pool;
  return Status::ok();
}

Status Eagle3Drafter::run(bool extend, int64_t seqs, int64_t max_position, int64_t max_seq_tokens) {
  Backend& b = model_.backend();
  const auto T = static_cast<int64_t>(host_.tokens.size()), R = static_cast<int64_t>(host_.logit_rows.size());
  if (extend) {
    if (table_staging_.bytes() < static_cast<int64_t>(host_.pages.size()) * 4) {  // outside graphs: drafts run eagerly
      table_staging_ = Buffer();
      MX_ASSIGN_OR_RETURN(table_staging_, b.allocate(static_cast<int64_t>(host_.pages.size()) * 2 * 4));
    }
    const TensorView t = table_staging_.view(DType::kI32, {static_cast<int64_t>(host_.pages.size())});
    MX_RETURN_IF_ERROR(b.copy_from_host(t, host_.pages.data()));
  }
  packed_.clear();
  for (const std::vector<int32_t>* part : {&host_.tokens, &host_.positions, &host_.seqs, &host_.logit_rows})
    packed_.insert(packed_.end(), part->begin(), part->end());
  if (extend) packed_.insert(packed_.end(), host_.captured_rows.begin(), host_.captured_rows.end());
  const TensorView rows = rows_staging_.view(DType::kI32, {static_cast<int64_t>(packed_.size())});
  MX_RETURN_IF_ERROR(b.copy_from_host(rows, packed_.data()));

  BatchView batch;
  batch.num_tokens = T;
  batch.num_seqs = seqs;
  batch.token_ids = rows.rows(0, T);
  batch.positions = rows.rows(T, 2 * T);
  batch.token_seq = rows.rows(2 * T, 3 * T);
  batch.page_tables[0] = table_staging_.view(DType::kI32, {seqs, page_width_});
  batch.num_kv_groups = 1;
  batch.logit_rows = rows.rows(3 * T, 3 * T + R);
  batch.num_logit_rows = R;
  batch.max_position = max_position;
  batch.max_seq_tokens = max_seq_tokens;
  if (extend) MX_RETURN_IF_ERROR(model_.fuse_captured(rows.rows(3 * T + R, 6 * T + R), *ws_));
  else MX_RETURN_IF_ERROR(model_.continue_chain(T, *ws_));
  ++forward_passes_;
  return model_.forward(batch, kv_.layer(0), *ws_);
}

Status Eagle3Drafter::step(std::span<const Eagle3SequenceStep> seqs, std::vector<std::vector<int32_t>>* drafts) {
  if (pool_.pages == 0) return internal_error("EAGLE-3 drafter stepped before attach_pool");
  const int64_t P = pool_.page_size, max_tokens = limits_.max_tokens;
  drafts->resize(seqs.size());
  for (auto& d : *drafts) d.clear();
  // Sequences with rows, those that draft first (most drafts first): the sequences still drafting at chain
  // step j are then a prefix, and each chain step's hidden input is the previous pass's first rows.
  std::vector<size_t> order;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Eagle3SequenceStep& s = seqs[i];
    if (s.num_drafts < 0 || s.num_drafts > P + 1)
      return invalid_argument("EAGLE-3: " + std::to_string(s.num_drafts) + " drafts asked with KV pages of " +
                              std::to_string(P) + " (the chain spills onto one scratch page: at most page_size + 1)");
    if (s.next_tokens.empty()) {
      if (s.num_drafts > 0) return invalid_argument("EAGLE-3: drafts asked for a sequence without rows this step");
      continue;
    }
    order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return seqs[a].num_drafts > seqs[b].num_drafts; });
  const auto S = static_cast<int64_t>(order.size());
  if (S == 0) return Status::ok();
  if (S > limits_.max_seqs) return invalid_argument("EAGLE-3: more sequences in a step than the drafter holds");

  // The extend pass: every sequence's rows, its page table (chain positions past its pages on its scratch
  // page), the last row of each drafting sequence as a logit row.
  HostBatch& h = host_;
  h.tokens.clear(), h.positions.clear(), h.seqs.clear(), h.logit_rows.clear(), h.captured_rows.clear();
  std::vector<int64_t> last_position(static_cast<size_t>(S));
  int64_t max_position = 0, max_seq_tokens = 0;
  page_width_ = 1;
  for (int64_t c = 0; c < S; ++c) {
    const Eagle3SequenceStep& s = seqs[order[static_cast<size_t>(c)]];
    const auto n = static_cast<int64_t>(s.next_tokens.size());
    const int64_t last = s.first_position + n - 1;
    const int64_t chain_end = last + std::max<int64_t>(s.num_drafts - 1, 0);
    const auto held = static_cast<int64_t>(s.pages.size());
    if (s.first_position < 0 || last / P >= held) return invalid_argument("EAGLE-3: a sequence's rows reach past its pages");
    page_width_ = std::max(page_width_, chain_end / P + 1);
    max_position = std::max(max_position, chain_end);
    max_seq_tokens = std::max(max_seq_tokens, n);
    last_position[static_cast<size_t>(c)] = last;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = s.first_target_row + i;
      if (row < 0 || row >= max_tokens) return invalid_argument("EAGLE-3: target row outside the step");
      if (s.num_drafts > 0 && i == n - 1) h.logit_rows.push_back(static_cast<int32_t>(h.tokens.size()));
      h.tokens.push_back(s.next_tokens[static_cast<size_t>(i)]);
      h.positions.push_back(static_cast<int32_t>(s.first_position + i));
      h.seqs.push_back(static_cast<int32_t>(c));
      for (int64_t j = 0; j < 3; ++j) h.captured_rows.push_back(static_cast<int32_t>(j * max_tokens + row));
    }
  }
  if (static_cast<int64_t>(h.tokens.size()) > max_tokens)
    return invalid_argument("EAGLE-3: more rows in a step than the drafter holds");
  h.pages.assign(static_cast<size_t>(S * page_width_), 0);
  for (int64_t c = 0; c < S; ++c) {
    const std::span<const int32_t> pages = seqs[order[static_cast<size_t>(c)]].pages;
    for (int64_t k = 0; k < page_width_; ++k) {
      int32_t page = static_cast<int32_t>(pool_.pages + c);  // the sequence's scratch page
      if (k < static_cast<int64_t>(pages.size())) {
        page = pages[static_cast<size_t>(k)];
        if (page < 0 || page >= pool_.pages) return invalid_argument("EAGLE-3: a page outside the target's pool");
      }
      h.pages[static_cast<size_t>(c * page_width_ + k)] = page;
    }
  }
  MX_RETURN_IF_ERROR(run(true, S, max_position, max_seq_tokens));

  // The chain: pass j feeds each still-drafting sequence its draft j - 1 at the position after its last.
  Backend& b = model_.backend();
  auto produced = static_cast<int64_t>(h.logit_rows.size());  // the last pass's logit rows: the first sequences
  for (int64_t j = 1;; ++j) {
    ids_.resize(static_cast<size_t>(produced));
    MX_RETURN_IF_ERROR(b.copy_to_host(ids_.data(), ws_->draft_ids.rows(0, produced)));
    for (int64_t c = 0; c < produced; ++c) {
      const int32_t id = model_.target_id(ids_[static_cast<size_t>(c)]);
      if (id < 0) return internal_error("EAGLE-3 draft id outside the draft vocabulary");
      ids_[static_cast<size_t>(c)] = id;
      (*drafts)[order[static_cast<size_t>(c)]].push_back(id);
    }
    int64_t active = 0;
    while (active < produced && seqs[order[static_cast<size_t>(active)]].num_drafts > j) ++active;
    if (active == 0) return Status::ok();
    h.tokens.assign(ids_.begin(), ids_.begin() + active);
    h.positions.resize(static_cast<size_t>(active));
    h.seqs.resize(static_cast<size_t>(active));
    for (int64_t c = 0; c < active; ++c) {
      h.positions[static_cast<size_t>(c)] = static_cast<int32_t>(last_position[static_cast<size_t>(c)] + j);
      h.seqs[static_cast<size_t>(c)] = static_cast<int32_t>(c);
    }
    h.logit_rows = h.seqs;
    MX_RETURN_IF_ERROR(run(false, S, max_position, 1));
    produced = active;
  }
}

}  // namespace mx
