// One KV page pool (of one layer group, see kv_pools.h) and the prefix cache over it. Host bookkeeping only:
// it hands out page numbers of the group's KvCache pool (pages of P tokens across the group's layers' K and
// V) and never touches device memory.
//
// Every page has a reference count: one per page-table row (request) that holds it. A page with no
// reference is free; free pages sit on one LRU list: never-cached pages at the front (used first), pages
// that still hold a cached prefix at the back in release order, so allocation evicts the least recently
// released prefix pages last.
//
// Prefix cache: a full, computed page can be registered under the key (parent page, parent generation,
// its P tokens). That makes the cache a trie over pages stored in one hash map: a lookup walks a prompt
// page by page from the root and checks each candidate's tokens and parent exactly, so hash collisions
// can never alias two different prefixes. Reusing a page bumps its generation, which orphans the
// registered children of its old content (they are never matched again and get evicted as they age).
// The pools of the other layer groups cache "companion" pages instead: registered under the anchor pool's
// page that holds the same tokens and that page's generation, so they are exact too and stay findable when
// earlier pages of their own group (below a sliding window) are gone.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"

namespace mx {

// Prefix-cache changes as they happen (on the engine thread), for KV-cache events that routers read
// (server/kv_event_publisher). A stored page holds exactly P computed tokens; its parent is the page
// before it in the sequence (-1 at the start). Implementations must be quick: they run inside a step.
class PrefixCacheObserver {
 public:
  virtual ~PrefixCacheObserver() = default;
  virtual void on_page_stored(int32_t page, int32_t parent_page, std::span<const int32_t> tokens) = 0;
  virtual void on_page_removed(int32_t page) = 0;  // evicted or forgotten: its content is gone
  virtual void on_cleared() = 0;                   // every cached page forgotten at once
};

class PagePool {
 public:
  PagePool(int64_t num_pages, int64_t page_size, bool enable_prefix_cache);

  int64_t num_pages() const { return num_pages_; }
  int64_t page_size() const { return page_size_; }
  bool prefix_cache_enabled() const { return prefix_cache_; }
  int64_t num_free() const { return num_free_; }                 // no reference (cached or not)
  int64_t num_used() const { return num_pages_ - num_free_; }    // referenced by at least one request
  int64_t num_cached() const { return static_cast<int64_t>(index_.size()); }  // registered prefix pages
  int64_t pages_for_tokens(int64_t tokens) const { return (tokens + page_size_ - 1) / page_size_; }

  // Walks `tokens` page by page (at most `max_pages` full pages) through the prefix cache, takes a
  // reference on every matched page and appends it to `pages`. Returns the number of pages matched.
  int64_t acquire_prefix(std::span<const int32_t> tokens, int64_t max_pages, std::vector<int32_t>* pages);

  // Appends `count` fresh pages (reference 1) to `pages`, evicting cached free pages as needed.
  // All or nothing: returns false and changes nothing when fewer than `count` pages are free.
  bool allocate(int64_t count, std::vector<int32_t>* pages);

  // Drops one reference on each page (kNoPage slots are skipped). Pages are released last to first so
  // that, of a sequence's cached pages, its deepest ones are evicted first.
  void release(std::span<const int32_t> pages);

  // Registers page `index` of a page-table row, which now holds the computed keys of `page_tokens`
  // (exactly P tokens), under its parent page (`pages[index - 1]`, or the root). Does nothing when the
  // parent is not registered or the same content is already registered by another page. Returns whether
  // the page is registered now (newly or from before).
  bool register_page(std::span<const int32_t> pages, int64_t index, std::span<const int32_t> page_tokens);

  // Companion pages: `page` holds the same tokens as the anchor pool's `anchor_page` while that page has
  // generation `anchor_gen`. Does nothing when `page` is registered already or the anchor is taken.
  void register_companion(int32_t page, int32_t anchor_page, uint32_t anchor_gen);
  // The page registered for (anchor_page, anchor_gen), or kNoPage.
  int32_t find_companion(int32_t anchor_page, uint32_t anchor_gen) const;
  // Takes one more reference on a page (a cached one comes off the free list).
  void acquire(int32_t page);
  // A page's generation: bumped whenever its content is forgotten.
  uint32_t generation(int32_t page) const { return gen_[static_cast<size_t>(page)]; }

  // Internal consistency against the page tables the caller knows: `expected_refs[p]` is how many rows
  // hold page p. Checks reference counts, the free list, free + used == total, and the cache index.
  Status check(std::span<const int32_t> expected_refs) const;

  // Forgets every cached prefix (free pages stay free).
  void clear_prefix_cache();

  // Told of every page registered in and removed from the prefix cache; may be null. Not owned.
  void set_observer(PrefixCacheObserver* observer) { observer_ = observer; }

 private:
  static constexpr int32_t kNone = -1;
  static_assert(kNone == kNoPage);

  uint64_t key_of(int32_t parent, uint32_t parent_gen, std::span<const int32_t> tokens) const;
  // Registers `page` under the key; false when the key is taken.
  bool store(int32_t page, int32_t parent, uint32_t parent_gen, std::span<const int32_t> page_tokens);
  bool matches(int32_t page, int32_t parent, uint32_t parent_gen, std::span<const int32_t> tokens) const;
  void unregister(int32_t page);
  void list_remove(int32_t page);
  void list_push_front(int32_t page);
  void list_push_back(int32_t page);

  PrefixCacheObserver* observer_ = nullptr;
  int64_t num_pages_;
  int64_t page_size_;
  bool prefix_cache_;
  int64_t num_free_ = 0;

  // Per page, indexed by page number.
  std::vector<int32_t> refs_;
  std::vector<uint32_t> gen_;         // bumped whenever the page's content is forgotten
  std::vector<uint8_t> registered_;   // 1 while in `index_`
  std::vector<uint64_t> key_;         // its key in `index_` while registered
  std::vector<int32_t> parent_;       // parent page (kNone = root) while registered
  std::vector<uint32_t> parent_gen_;
  std::vector<int32_t> tokens_;       // [num_pages, P] the tokens a registered page holds
  std::vector<int32_t> prev_, next_;  // free list links (kNone at the ends)
  std::vector<uint8_t> on_list_;
  int32_t head_ = kNone, tail_ = kNone;

  std::unordered_map<uint64_t, int32_t> index_;  // key -> registered page
  uint64_t salt_;                                  // per process: keys cannot be precomputed offline
};

}  // namespace mx
