// KV pools per layer group: window trimming, all-or-nothing growth and the prefix lookup over every group.
#include "runtime/kv_pools.h"

#include <algorithm>

#include "core/log.h"

namespace mx {

KvPools::KvPools(const std::vector<KvGroupPool>& groups, int64_t page_size, bool enable_prefix_cache)
    : page_size_(page_size) {
  MX_CHECK(!groups.empty()) << "no KV layer groups";
  pools_.reserve(groups.size());
  for (const KvGroupPool& g : groups) {
    if (anchor_ < 0 && g.window == 0) anchor_ = static_cast<int64_t>(pools_.size());
    windows_.push_back(g.window);
    pools_.emplace_back(g.num_pages, page_size, enable_prefix_cache && std::any_of(groups.begin(), groups.end(),
                                                                                   [](const KvGroupPool& x) { return x.window == 0; }));
  }
}

int64_t KvPools::first_needed_page(int64_t group, int64_t next_pos) const {
  const int64_t w = window(group);
  return w > 0 ? std::max<int64_t>(0, next_pos - w + 1) / page_size_ : 0;
}

void KvPools::init_rows(int64_t max_pages, PageRows* rows) const {
  rows->resize(pools_.size());
  for (auto& row : *rows) {
    row.clear();
    row.reserve(static_cast<size_t>(max_pages));
  }
}

int64_t KvPools::acquire_prefix(std::span<const int32_t> tokens, int64_t max_pages, PageRows* rows) {
  if (!prefix_cache_enabled()) return 0;
  const auto a = static_cast<size_t>(anchor_);
  PagePool& anchor = pools_[a];
  std::vector<int32_t>& anchor_row = (*rows)[a];
  const int64_t matched = anchor.acquire_prefix(tokens, max_pages, &anchor_row);
  // missing[g][i]: companions of anchor pages [0, i) that group g no longer has.
  std::vector<std::vector<int32_t>> found(pools_.size()), missing(pools_.size());
  for (size_t g = 0; g < pools_.size(); ++g) {
    if (g == a) continue;
    found[g].resize(static_cast<size_t>(matched));
    missing[g].assign(static_cast<size_t>(matched) + 1, 0);
    for (int64_t i = 0; i < matched; ++i) {
      const int32_t page = anchor_row[static_cast<size_t>(i)];
      found[g][static_cast<size_t>(i)] = pools_[g].find_companion(page, anchor.generation(page));
      missing[g][static_cast<size_t>(i) + 1] = missing[g][static_cast<size_t>(i)] + (found[g][static_cast<size_t>(i)] == kNoPage);
    }
  }
  // The longest prefix every group can continue from.
  int64_t usable = matched;
  for (; usable > 0; --usable) {
    bool ok = true;
    for (size_t g = 0; g < pools_.size() && ok; ++g) {
      if (g == a) continue;
      const int64_t lo = first_needed_page(static_cast<int64_t>(g), usable * page_size_);
      ok = missing[g][static_cast<size_t>(usable)] == missing[g][static_cast<size_t>(lo)];
    }
    if (ok) break;
  }
  anchor.release(std::span<const int32_t>(anchor_row).subspan(static_cast<size_t>(usable)));
  anchor_row.resize(static_cast<size_t>(usable));
  for (size_t g = 0; g < pools_.size(); ++g) {
    if (g == a) continue;
    std::vector<int32_t>& row = (*rows)[g];
    row.assign(static_cast<size_t>(usable), kNoPage);
    for (int64_t i = first_needed_page(static_cast<int64_t>(g), usable * page_size_); i < usable; ++i) {
      const int32_t page = found[g][static_cast<size_t>(i)];
      pools_[g].acquire(page);
      row[static_cast<size_t>(i)] = page;
    }
  }
  return usable;
}

bool KvPools::allocate(int64_t tokens, PageRows* rows) {
  const int64_t pages = pages_for_tokens(tokens);
  for (size_t g = 0; g < pools_.size(); ++g)
    if (pages - static_cast<int64_t>((*rows)[g].size()) > pools_[g].num_free()) return false;
  for (size_t g = 0; g < pools_.size(); ++g) {
    const bool ok = pools_[g].allocate(pages - static_cast<int64_t>((*rows)[g].size()), &(*rows)[g]);
    MX_CHECK(ok) << "group " << g << " had the free pages a moment ago";
  }
  return true;
}

void KvPools::release_below_window(int64_t next_pos, PageRows* rows) {
  for (size_t g = 0; g < pools_.size(); ++g) {
    if (windows_[g] == 0) continue;
    std::vector<int32_t>& row = (*rows)[g];
    // Slots below the window are released from the bottom up as it moves: the held ones below `lo` are a
    // run ending at lo - 1. Released highest first, so the oldest pages are the first evicted.
    const int64_t lo = std::min<int64_t>(first_needed_page(static_cast<int64_t>(g), next_pos), static_cast<int64_t>(row.size()));
    for (int64_t i = lo - 1; i >= 0 && row[static_cast<size_t>(i)] != kNoPage; --i) {
      pools_[g].release(std::span<const int32_t>(&row[static_cast<size_t>(i)], 1));
      row[static_cast<size_t>(i)] = kNoPage;
    }
  }
}

void KvPools::truncate(int64_t tokens, PageRows* rows) {
  const auto keep = static_cast<size_t>(pages_for_tokens(tokens));
  for (size_t g = 0; g < rows->size(); ++g) {
    std::vector<int32_t>& row = (*rows)[g];
    if (row.size() <= keep) continue;
    pools_[g].release(std::span<const int32_t>(row).subspan(keep));
    row.resize(keep);
  }
}

void KvPools::release(PageRows* rows) {
  for (size_t g = 0; g < rows->size(); ++g) {
    pools_[g].release((*rows)[g]);
    (*rows)[g].clear();
  }
}

void KvPools::register_pages(const PageRows& rows, std::span<const int32_t> tokens, int64_t from, int64_t to) {
  if (!prefix_cache_enabled()) return;
  const auto a = static_cast<size_t>(anchor_);
  for (int64_t i = from; i < to; ++i) {
    const auto page_tokens = tokens.subspan(static_cast<size_t>(i * page_size_), static_cast<size_t>(page_size_));
    if (!pools_[a].register_page(rows[a], i, page_tokens)) continue;
    const int32_t anchor_page = rows[a][static_cast<size_t>(i)];
    for (size_t g = 0; g < pools_.size(); ++g) {
      const int32_t page = g == a ? kNoPage : rows[g][static_cast<size_t>(i)];
      if (page != kNoPage) pools_[g].register_companion(page, anchor_page, pools_[a].generation(anchor_page));
    }
  }
}

void KvPools::set_observer(PrefixCacheObserver* observer) {
  if (anchor_ >= 0) pools_[static_cast<size_t>(anchor_)].set_observer(observer);
}

Status KvPools::check(const std::vector<const PageRows*>& rows) const {
  for (size_t g = 0; g < pools_.size(); ++g) {
    std::vector<int32_t> refs(static_cast<size_t>(pools_[g].num_pages()), 0);
    for (const PageRows* r : rows) {
      if (r->empty()) continue;
      for (int32_t p : (*r)[g]) {
        if (p == kNoPage) continue;
        if (p < 0 || p >= pools_[g].num_pages()) return internal_error("page number out of range in group " + std::to_string(g));
        ++refs[static_cast<size_t>(p)];
      }
    }
    Status s = pools_[g].check(refs);
    if (!s.is_ok()) return internal_error("layer group " + std::to_string(g) + ": " + s.message());
  }
  return Status::ok();
}

}  // namespace mx
