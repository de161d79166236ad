#include "model/eagle3/eagle3_drafter.h"

#include <algorithm>

#include "core/log.h"

namespace mx {
namespace {

// A graph step's table goes up apart (a second copy, a second stream sync of ~10 us) when at least this
// many of its bytes are columns no row reads.
constexpr int64_t kSplitTableBytes = 64 << 10;

}  // namespace

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
  MX_ASSIGN_OR_RETURN(drafted_, b.allocate((pool.page_size + 1) * limits_.max_seqs * 4));
  pool_ = pool;
  return Status::ok();
}

Status Eagle3Drafter::enable_chain_graphs(std::span<const int64_t> batch_sizes, int64_t max_pages_per_seq) {
  if (pool_.pages == 0) return internal_error("EAGLE-3 drafter: chain graphs enabled before attach_pool");
  Backend& b = model_.backend();
  if (!b.can_capture()) return invalid_argument("EAGLE-3 chain graphs: the " + b.name() + " backend cannot capture graphs");
  if (batch_sizes.empty() || max_pages_per_seq < 1) return invalid_argument("EAGLE-3 chain graphs need buckets and pages");
  const std::vector<int64_t> sizes(batch_sizes.begin(), batch_sizes.end());
  const int64_t width = max_pages_per_seq + 1;
  if (!graph_sizes_.empty()) {
    if (sizes != graph_sizes_ || width != graph_table_width_) return internal_error("EAGLE-3 chain graphs enabled twice, differently");
    return Status::ok();
  }
  for (size_t i = 0; i < sizes.size(); ++i)
    if (sizes[i] < 1 || sizes[i] > limits_.max_seqs || (i > 0 && sizes[i] <= sizes[i - 1]))
      return invalid_argument("EAGLE-3 chain graph buckets must ascend within 1 .. " + std::to_string(limits_.max_seqs));
  // The largest upload either layout makes (step() packs one of them): graph steps' ids, positions and
  // table, or an eager chain's rows (3 per sequence and pass) and its table, beside the extend pass's rows.
  const int64_t S = limits_.max_seqs, passes = pool_.page_size;  // chain passes per step: <= page_size
  const int64_t extend = 6 * limits_.max_tokens + S;
  const int64_t most = extend + std::max(S + passes * S + S * width, 3 * passes * S + S * width);
  staging_ = Buffer();
  MX_ASSIGN_OR_RETURN(staging_, b.allocate(most * 4));
  // Padding sequences start from these: zero drafts and g, so their rows stay finite numbers.
  const std::vector<uint8_t> zeros(static_cast<size_t>(std::max(drafted_.bytes(), ws_->next_hidden.bytes())), 0);
  MX_RETURN_IF_ERROR(b.copy_from_host(drafted_.view(DType::kU8, {drafted_.bytes()}), zeros.data()));
  MX_RETURN_IF_ERROR(b.copy_from_host(ws_->next_hidden, zeros.data()));
  graph_table_.assign(static_cast<size_t>(sizes.back() * width), 0);
  graph_sizes_ = sizes;
  graph_table_width_ = width;
  return Status::ok();
}

int64_t Eagle3Drafter::chain_bucket(int64_t seqs) const {
  for (int64_t size : graph_sizes_)
    if (size >= seqs) return size;
  return 0;
}

Status Eagle3Drafter::run_chain(const std::vector<ChainPass>& passes) {
  for (const ChainPass& p : passes) MX_RETURN_IF_ERROR(run(p.batch, nullptr, p.drafted));
  return Status::ok();
}

Status Eagle3Drafter::replay_or_capture(int64_t bucket, int64_t k, const std::vector<ChainPass>& passes) {
  const auto key = std::make_pair(bucket, k);
  auto it = chain_graphs_.find(key);
  if (it != chain_graphs_.end() && it->second) {
    ++chain_replays_;
    return it->second->replay();
  }
  MX_RETURN_IF_ERROR(run_chain(passes));
  if (it != chain_graphs_.end()) return Status::ok();  // its capture failed: eager
  // The body by value: a backend may keep it (a CPU test double replays it for real).
  auto graph = model_.backend().capture([this, passes] { return run_chain(passes); });
  if (!graph.is_ok()) {
    MX_LOG(Warning) << "EAGLE-3 chain passes of " << bucket << " sequences, " << k
                    << " drafts run eagerly: their graph capture failed: " << graph.status().to_string();
    chain_graphs_[key] = nullptr;
    return Status::ok();
  }
  chain_graphs_[key] = std::move(*graph);
  return Status::ok();
}

Status Eagle3Drafter::run(const BatchView& batch, const TensorView* captured_rows, TensorView drafted) {
  if (captured_rows) MX_RETURN_IF_ERROR(model_.fuse_captured(*captured_rows, *ws_));
  else MX_RETURN_IF_ERROR(model_.continue_chain(batch.num_tokens, *ws_));
  MX_RETURN_IF_ERROR(model_.forward(batch, kv_.layer(0), *ws_, /*draft_vocabulary=*/captured_rows == nullptr));
  return model_.backend().copy(drafted, ws_->draft_ids.rows(0, batch.num_logit_rows));
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
  auto drafts_of = [&](int64_t c) { return seqs[order[static_cast<size_t>(c)]].num_drafts; };

  // The extend pass: every sequence's rows, its page table (chain positions past its pages on its scratch
  // page), the last row of each drafting sequence as a logit row.
  HostBatch& h = host_;
  h.tokens.clear(), h.positions.clear(), h.seqs.clear(), h.logit_rows.clear(), h.captured_rows.clear();
  std::vector<int64_t> last_position(static_cast<size_t>(S));
  int64_t max_position = 0, max_seq_tokens = 0, page_width = 1;
  for (int64_t c = 0; c < S; ++c) {
    const Eagle3SequenceStep& s = seqs[order[static_cast<size_t>(c)]];
    const auto n = static_cast<int64_t>(s.next_tokens.size());
    const int64_t last = s.first_position + n - 1;
    const int64_t chain_end = last + std::max<int64_t>(s.num_drafts - 1, 0);
    const auto held = static_cast<int64_t>(s.pages.size());
    if (s.first_position < 0 || last / P >= held) return invalid_argument("EAGLE-3: a sequence's rows reach past its pages");
    page_width = std::max(page_width, chain_end / P + 1);
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
  const auto T = static_cast<int64_t>(h.tokens.size()), R = static_cast<int64_t>(h.logit_rows.size());
  if (T > max_tokens) return invalid_argument("EAGLE-3: more rows in a step than the drafter holds");
  const int64_t most_drafts = R > 0 ? drafts_of(0) : 0;
  // A graph chain: every sequence drafts the same k >= 2, a bucket holds them and the table is wide enough.
  const bool uniform = most_drafts >= 2 && R == S && drafts_of(S - 1) == most_drafts;
  const int64_t bucket = uniform && page_width <= graph_table_width_ ? chain_bucket(S) : 0;
  const int64_t width = bucket > 0 ? graph_table_width_ : page_width;
  const int64_t table_rows = bucket > 0 ? bucket : S;  // a graph's padding sequences have rows too
  // Chain pass j (1 ..): each sequence with more than j drafts (a prefix of the order) feeds its draft j at
  // the position after its last + j - 1. Eager: per pass its positions, sequences and logit rows (= 0 ..
  // active). Graph: every pass has all `bucket` rows (sequence and logit row ids 0 .. bucket - 1); a padding
  // sequence's chain starts at position 0 of its scratch page.
  h.chain.clear(), h.iota.clear();
  std::vector<int64_t> active(static_cast<size_t>(std::max<int64_t>(most_drafts, 1)), 0);
  for (int64_t j = 1; j < most_drafts; ++j) {
    int64_t& a = active[static_cast<size_t>(j)];
    while (a < S && drafts_of(a) > j) ++a;
    if (bucket > 0) {
      for (int64_t c = 0; c < bucket; ++c)
        h.chain.push_back(static_cast<int32_t>(c < S ? last_position[static_cast<size_t>(c)] + j : j));
      continue;
    }
    for (int64_t c = 0; c < a; ++c) h.chain.push_back(static_cast<int32_t>(last_position[static_cast<size_t>(c)] + j));
    for (int64_t c = 0; c < a; ++c) h.chain.push_back(static_cast<int32_t>(c));
    for (int64_t c = 0; c < a; ++c) h.chain.push_back(static_cast<int32_t>(c));
  }
  for (int64_t c = 0; c < bucket; ++c) h.iota.push_back(static_cast<int32_t>(c));
  // The table: eager, page_width columns; a graph's is graph_table_width_ wide (max_pages_per_seq + 1, 32
  // KB a row at a 131072-token limit) but only the columns some row reads (page_width, rounded up to 16) are
  // written, and uploaded apart when the rest is big (see kSplitTableBytes).
  const int64_t columns = bucket > 0 ? std::min(width, (page_width + 15) / 16 * 16) : width;
  if (bucket == 0) h.pages.assign(static_cast<size_t>(table_rows * width), 0);
  int32_t* table = bucket > 0 ? graph_table_.data() : h.pages.data();
  for (int64_t c = 0; c < table_rows; ++c) {
    const std::span<const int32_t> pages = c < S ? seqs[order[static_cast<size_t>(c)]].pages : std::span<const int32_t>();
    for (int64_t k = 0; k < columns; ++k) {
      int32_t page = static_cast<int32_t>(pool_.pages + c);  // the sequence's scratch page
      if (k < static_cast<int64_t>(pages.size())) {
        page = pages[static_cast<size_t>(k)];
        if (page < 0 || page >= pool_.pages) return invalid_argument("EAGLE-3: a page outside the target's pool");
      }
      table[c * width + k] = page;
    }
  }

  // One upload for every pass of the step (a graph step's table apart when most of it is unused columns).
  // Eager: extend rows | chain | table. Graph: table | ids 0 .. bucket - 1 | chain | extend rows (the parts
  // its graph reads at addresses fixed per bucket and k).
  const auto chain_size = static_cast<int64_t>(h.chain.size()), table_size = table_rows * width;
  const bool split_table = bucket > 0 && (width - columns) * table_rows * 4 >= kSplitTableBytes;
  packed_.clear();
  if (bucket > 0 && !split_table) packed_.insert(packed_.end(), table, table + table_size);
  const std::vector<const std::vector<int32_t>*> eager_order = {&h.tokens, &h.positions, &h.seqs, &h.logit_rows,
                                                                &h.captured_rows, &h.chain, &h.pages};
  const std::vector<const std::vector<int32_t>*> graph_order = {&h.iota, &h.chain, &h.tokens, &h.positions,
                                                                &h.seqs, &h.logit_rows, &h.captured_rows};
  for (const std::vector<int32_t>* part : bucket > 0 ? graph_order : eager_order)
    packed_.insert(packed_.end(), part->begin(), part->end());
  Backend& b = model_.backend();
  const int64_t packed_at = split_table ? table_size : 0;
  const int64_t total = packed_at + static_cast<int64_t>(packed_.size());
  if (staging_.bytes() < total * 4) {
    if (!graph_sizes_.empty()) return internal_error("EAGLE-3: a step outgrew the upload buffer its chain graphs read");
    staging_ = Buffer();
    MX_ASSIGN_OR_RETURN(staging_, b.allocate(total * 2 * 4));
  }
  const TensorView up = staging_.view(DType::kI32, {total});
  MX_RETURN_IF_ERROR(b.copy_from_host(up.rows(packed_at, total), packed_.data()));
  if (split_table)
    MX_RETURN_IF_ERROR(b.copy_row_prefixes_from_host(up.rows(0, table_size).reshaped({table_rows, width}), table, columns * 4));
  // Where each part landed.
  const int64_t table_at = bucket > 0 ? 0 : 6 * T + R + chain_size;
  const int64_t chain_at = bucket > 0 ? table_size + bucket : 6 * T + R;
  const int64_t extend_at = bucket > 0 ? chain_at + chain_size : 0;
  const int64_t iota_at = table_size;
  // Draft j of the chain's sequence c at row j * stride + c.
  const int64_t stride = bucket > 0 ? bucket : S;
  const TensorView drafted = drafted_.view(DType::kI32, {(P + 1) * limits_.max_seqs});

  BatchView batch;
  batch.num_tokens = T;
  batch.num_seqs = S;
  batch.token_ids = up.rows(extend_at, extend_at + T);
  batch.positions = up.rows(extend_at + T, extend_at + 2 * T);
  batch.token_seq = up.rows(extend_at + 2 * T, extend_at + 3 * T);
  batch.page_tables[0] = up.rows(table_at, table_at + S * width).reshaped({S, width});
  batch.num_kv_groups = 1;
  batch.logit_rows = up.rows(extend_at + 3 * T, extend_at + 3 * T + R);
  batch.num_logit_rows = R;
  batch.max_position = max_position;
  batch.max_seq_tokens = max_seq_tokens;
  const TensorView captured_rows = up.rows(extend_at + 3 * T + R, extend_at + 6 * T + R);
  MX_RETURN_IF_ERROR(run(batch, &captured_rows, drafted.rows(0, R)));
  ++forward_passes_;
  // The chain: pass j's tokens are pass j - 1's drafts (draft-vocabulary ids), on the device.
  std::vector<ChainPass> passes;
  int64_t at = chain_at;
  for (int64_t j = 1; j < most_drafts; ++j) {
    const int64_t a = bucket > 0 ? bucket : active[static_cast<size_t>(j)];
    batch.num_tokens = a;
    batch.num_seqs = bucket > 0 ? bucket : S;
    batch.token_ids = drafted.rows((j - 1) * stride, (j - 1) * stride + a);
    batch.positions = up.rows(at, at + a);
    if (bucket > 0) {
      batch.token_seq = batch.logit_rows = up.rows(iota_at, iota_at + bucket);
      batch.page_tables[0] = up.rows(table_at, table_at + table_size).reshaped({bucket, width});
      at += a;
    } else {
      batch.token_seq = up.rows(at + a, at + 2 * a);
      batch.logit_rows = up.rows(at + 2 * a, at + 3 * a);
      at += 3 * a;
    }
    batch.num_logit_rows = a;
    batch.max_seq_tokens = 1;
    passes.push_back({batch, drafted.rows(j * stride, j * stride + a)});
  }
  forward_passes_ += static_cast<int64_t>(passes.size());
  if (bucket > 0) MX_RETURN_IF_ERROR(replay_or_capture(bucket, most_drafts, passes));
  else MX_RETURN_IF_ERROR(run_chain(passes));
  if (most_drafts == 0) return Status::ok();
  drafted_host_.resize(static_cast<size_t>(most_drafts * stride));
  MX_RETURN_IF_ERROR(b.copy_to_host(drafted_host_.data(), drafted.rows(0, most_drafts * stride)));
  for (int64_t c = 0; c < S; ++c)
    for (int64_t j = 0; j < drafts_of(c); ++j) {
      const int32_t id = model_.target_id(drafted_host_[static_cast<size_t>(j * stride + c)]);
      if (id < 0) return internal_error("EAGLE-3 draft id outside the draft vocabulary");
      (*drafts)[order[static_cast<size_t>(c)]].push_back(id);
    }
  return Status::ok();
}

}  // namespace mx
