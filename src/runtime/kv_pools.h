// The KV page pools of every layer group (KvLayout: layers with the same geometry and window) and the
// rules that tie them together. Host bookkeeping only, like PagePool.
//
// A request holds one page-table row per group ([group][logical page]); logical page i covers positions
// [i P, (i + 1) P) in every group. A full-attention group keeps every page of the sequence. A sliding-window
// group (window W) keeps only the pages its next queries can still see: once the sequence has computed c
// tokens, its next query (position c) sees keys from c - W + 1, so pages wholly below that are released and
// their slots hold kNoPage (the kernels never read below a window).
//
// Prefix cache: the first full-attention group is the anchor: its pool holds the token trie (PagePool). Every
// other group registers each full page as a companion of the anchor page with the same tokens. A cached
// prefix of m pages is usable only if every group still holds what the continuation (next query at m P)
// needs: a full group all m companions, a window group the companions from its window's first page on. The
// lookup takes the longest such prefix. Without a full-attention group there is no anchor and no prefix cache.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/page_pool.h"

namespace mx {

// A request's page tables: [group][logical page] -> physical page of that group's pool, or kNoPage.
using PageRows = std::vector<std::vector<int32_t>>;

struct KvGroupPool {
  int64_t window = 0;     // 0 = full attention
  int64_t num_pages = 0;
};

class KvPools {
 public:
  KvPools(const std::vector<KvGroupPool>& groups, int64_t page_size, bool enable_prefix_cache);

  int64_t num_groups() const { return static_cast<int64_t>(pools_.size()); }
  int64_t page_size() const { return page_size_; }
  int64_t window(int64_t group) const { return windows_[static_cast<size_t>(group)]; }
  const PagePool& pool(int64_t group) const { return pools_[static_cast<size_t>(group)]; }
  // The group whose pool holds the prefix trie (the first full-attention group), or -1.
  int64_t anchor() const { return anchor_; }
  // The pool that bounds the context (the anchor's, else group 0's): what stats and metrics report.
  const PagePool& context_pool() const { return pools_[static_cast<size_t>(anchor_ >= 0 ? anchor_ : 0)]; }
  bool prefix_cache_enabled() const { return anchor_ >= 0 && pool(anchor_).prefix_cache_enabled(); }
  int64_t pages_for_tokens(int64_t tokens) const { return (tokens + page_size_ - 1) / page_size_; }
  // The first logical page `group` still needs when the sequence's next query is at position `next_pos`.
  int64_t first_needed_page(int64_t group, int64_t next_pos) const;

  // Empty rows, one per group, with room for `max_pages` pages each.
  void init_rows(int64_t max_pages, PageRows* rows) const;
  // Matches `tokens` (at most `max_pages` full pages) against the prefix cache, takes a reference on every
  // page the continuation needs and fills `rows` (empty on entry). Returns the number of pages matched.
  int64_t acquire_prefix(std::span<const int32_t> tokens, int64_t max_pages, PageRows* rows);
  // Grows every group's row to cover `tokens` tokens with fresh pages. All or nothing over the groups.
  bool allocate(int64_t tokens, PageRows* rows);
  // Releases, in window groups, the pages below the window of a query at `next_pos` (slots -> kNoPage).
  void release_below_window(int64_t next_pos, PageRows* rows);
  // Releases, in every group, the pages past the first pages_for_tokens(tokens) (speculative rollback: pages
  // that hold only rejected draft positions).
  void truncate(int64_t tokens, PageRows* rows);
  // Releases every page of `rows` and empties them.
  void release(PageRows* rows);
  // Registers logical pages [from, to) of a sequence whose first tokens are `tokens` in the prefix cache.
  void register_pages(const PageRows& rows, std::span<const int32_t> tokens, int64_t from, int64_t to);
  void set_observer(PrefixCacheObserver* observer);

  // Every pool's consistency against the rows the caller knows (each row counted once per page it holds).
  Status check(const std::vector<const PageRows*>& rows) const;

 private:
  std::vector<PagePool> pools_;
  std::vector<int64_t> windows_;
  int64_t page_size_;
  int64_t anchor_ = -1;
};

}  // namespace mx
