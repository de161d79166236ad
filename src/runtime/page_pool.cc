// Page pool bookkeeping. Everything is O(1) per page except hashing a page's P tokens; nothing here
// allocates after construction except the prefix index's map nodes (bounded by the number of pages).
#include "runtime/page_pool.h"

#include <algorithm>
#include <random>
#include <utility>

#include "core/log.h"

namespace mx {
namespace {

uint64_t mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

}  // namespace

PagePool::PagePool(int64_t num_pages, int64_t page_size, bool enable_prefix_cache)
    : num_pages_(num_pages), page_size_(page_size), prefix_cache_(enable_prefix_cache) {
  MX_CHECK(num_pages > 0 && num_pages < INT32_MAX && page_size > 0) << num_pages << " pages of " << page_size;
  const auto n = static_cast<size_t>(num_pages);
  refs_.assign(n, 0);
  gen_.assign(n, 0);
  registered_.assign(n, 0);
  key_.assign(n, 0);
  parent_.assign(n, kNone);
  parent_gen_.assign(n, 0);
  if (prefix_cache_) tokens_.assign(n * static_cast<size_t>(page_size), 0);
  prev_.assign(n, kNone);
  next_.assign(n, kNone);
  on_list_.assign(n, 0);
  for (int32_t p = 0; p < static_cast<int32_t>(num_pages); ++p) list_push_back(p);
  num_free_ = num_pages;
  if (prefix_cache_) index_.reserve(n);
  salt_ = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
}

uint64_t PagePool::key_of(int32_t parent, uint32_t parent_gen, std::span<const int32_t> tokens) const {
  uint64_t h = mix(salt_, static_cast<uint64_t>(static_cast<uint32_t>(parent)));
  h = mix(h, parent_gen);
  for (int32_t t : tokens) h = mix(h, static_cast<uint32_t>(t));
  return h;
}

bool PagePool::matches(int32_t page, int32_t parent, uint32_t parent_gen, std::span<const int32_t> tokens) const {
  const auto p = static_cast<size_t>(page);
  if (!registered_[p] || parent_[p] != parent || parent_gen_[p] != parent_gen) return false;
  const int32_t* stored = tokens_.data() + p * static_cast<size_t>(page_size_);
  return std::equal(tokens.begin(), tokens.end(), stored);
}

int64_t PagePool::acquire_prefix(std::span<const int32_t> tokens, int64_t max_pages, std::vector<int32_t>* pages) {
  if (!prefix_cache_) return 0;
  const int64_t full = std::min(max_pages, static_cast<int64_t>(tokens.size()) / page_size_);
  int32_t parent = kNone;
  uint32_t parent_gen = 0;
  int64_t matched = 0;
  for (; matched < full; ++matched) {
    auto page_tokens = tokens.subspan(static_cast<size_t>(matched * page_size_), static_cast<size_t>(page_size_));
    auto it = index_.find(key_of(parent, parent_gen, page_tokens));
    if (it == index_.end() || !matches(it->second, parent, parent_gen, page_tokens)) break;
    const int32_t page = it->second;
    acquire(page);
    pages->push_back(page);
    parent = page;
    parent_gen = gen_[static_cast<size_t>(page)];
  }
  return matched;
}

void PagePool::acquire(int32_t page) {
  if (refs_[static_cast<size_t>(page)]++ == 0) {
    list_remove(page);
    --num_free_;
  }
}

bool PagePool::allocate(int64_t count, std::vector<int32_t>* pages) {
  if (count <= 0) return true;
  if (count > num_free_) return false;
  for (int64_t i = 0; i < count; ++i) {
    const int32_t page = head_;
    MX_CHECK(page != kNone) << "free list shorter than its count";
    list_remove(page);
    if (registered_[static_cast<size_t>(page)]) unregister(page);  // evict the cached prefix it held
    refs_[static_cast<size_t>(page)] = 1;
    pages->push_back(page);
  }
  num_free_ -= count;
  return true;
}

void PagePool::release(std::span<const int32_t> pages) {
  for (auto it = pages.rbegin(); it != pages.rend(); ++it) {
    const int32_t page = *it;
    if (page == kNoPage) continue;
    int32_t& ref = refs_[static_cast<size_t>(page)];
    MX_CHECK(ref > 0) << "page " << page << " released more often than acquired";
    if (--ref > 0) continue;
    // A page still holding a cached prefix waits at the back for a hit; others are reused first.
    if (registered_[static_cast<size_t>(page)]) {
      list_push_back(page);
    } else {
      list_push_front(page);  // no child can name an unregistered page as its parent: no generation bump
    }
    ++num_free_;
  }
}

bool PagePool::register_page(std::span<const int32_t> pages, int64_t index, std::span<const int32_t> page_tokens) {
  if (!prefix_cache_) return false;
  MX_CHECK(static_cast<int64_t>(page_tokens.size()) == page_size_ && index < static_cast<int64_t>(pages.size()));
  const int32_t page = pages[static_cast<size_t>(index)];
  if (registered_[static_cast<size_t>(page)]) return true;  // a prefix hit: already registered
  int32_t parent = kNone;
  uint32_t parent_gen = 0;
  if (index > 0) {
    parent = pages[static_cast<size_t>(index - 1)];
    if (!registered_[static_cast<size_t>(parent)]) return false;  // chain broken (its parent was a duplicate)
    parent_gen = gen_[static_cast<size_t>(parent)];
  }
  if (!store(page, parent, parent_gen, page_tokens)) return false;
  if (observer_) observer_->on_page_stored(page, parent, page_tokens);
  return true;
}

bool PagePool::store(int32_t page, int32_t parent, uint32_t parent_gen, std::span<const int32_t> page_tokens) {
  const uint64_t key = key_of(parent, parent_gen, page_tokens);
  if (!index_.emplace(key, page).second) return false;  // same content already cached (or a hash collision)
  const auto p = static_cast<size_t>(page);
  registered_[p] = 1;
  key_[p] = key;
  parent_[p] = parent;
  parent_gen_[p] = parent_gen;
  std::copy(page_tokens.begin(), page_tokens.end(), tokens_.begin() + static_cast<std::ptrdiff_t>(p * page_size_));
  return true;
}

void PagePool::register_companion(int32_t page, int32_t anchor_page, uint32_t anchor_gen) {
  if (!prefix_cache_ || registered_[static_cast<size_t>(page)]) return;
  store(page, anchor_page, anchor_gen, {});  // no tokens: the anchor page and its generation name the content
}

int32_t PagePool::find_companion(int32_t anchor_page, uint32_t anchor_gen) const {
  if (!prefix_cache_) return kNone;
  auto it = index_.find(key_of(anchor_page, anchor_gen, {}));
  if (it == index_.end() || !matches(it->second, anchor_page, anchor_gen, {})) return kNone;
  return it->second;
}

void PagePool::unregister(int32_t page) {
  const auto p = static_cast<size_t>(page);
  index_.erase(key_[p]);
  registered_[p] = 0;
  ++gen_[p];  // orphans the children registered under this content
  if (observer_) observer_->on_page_removed(page);
}

void PagePool::clear_prefix_cache() {
  PrefixCacheObserver* observer = std::exchange(observer_, nullptr);  // one "cleared", not a removal per page
  for (int32_t p = 0; p < static_cast<int32_t>(num_pages_); ++p)
    if (registered_[static_cast<size_t>(p)]) unregister(p);
  observer_ = observer;
  if (observer_) observer_->on_cleared();
}

void PagePool::list_remove(int32_t page) {
  const auto p = static_cast<size_t>(page);
  MX_CHECK(on_list_[p]) << "page " << page << " is not on the free list";
  if (prev_[p] != kNone) next_[static_cast<size_t>(prev_[p])] = next_[p]; else head_ = next_[p];
  if (next_[p] != kNone) prev_[static_cast<size_t>(next_[p])] = prev_[p]; else tail_ = prev_[p];
  prev_[p] = next_[p] = kNone;
  on_list_[p] = 0;
}

void PagePool::list_push_front(int32_t page) {
  const auto p = static_cast<size_t>(page);
  prev_[p] = kNone;
  next_[p] = head_;
  if (head_ != kNone) prev_[static_cast<size_t>(head_)] = page; else tail_ = page;
  head_ = page;
  on_list_[p] = 1;
}

void PagePool::list_push_back(int32_t page) {
  const auto p = static_cast<size_t>(page);
  next_[p] = kNone;
  prev_[p] = tail_;
  if (tail_ != kNone) next_[static_cast<size_t>(tail_)] = page; else head_ = page;
  tail_ = page;
  on_list_[p] = 1;
}

Status PagePool::check(std::span<const int32_t> expected_refs) const {
  if (static_cast<int64_t>(expected_refs.size()) != num_pages_) return internal_error("expected_refs has the wrong size");
  int64_t free = 0, listed = 0;
  for (int64_t p = 0; p < num_pages_; ++p) {
    const auto i = static_cast<size_t>(p);
    if (refs_[i] != expected_refs[i])
      return internal_error("page " + std::to_string(p) + " has " + std::to_string(refs_[i]) + " references, page tables hold " +
                            std::to_string(expected_refs[i]));
    if ((refs_[i] == 0) != (on_list_[i] != 0))
      return internal_error("page " + std::to_string(p) + ": on the free list iff unreferenced is violated");
    free += refs_[i] == 0;
    if (registered_[i]) {
      auto it = index_.find(key_[i]);
      if (it == index_.end() || it->second != static_cast<int32_t>(p))
        return internal_error("registered page " + std::to_string(p) + " is missing from the index");
    }
  }
  for (int32_t p = head_, prev = kNone; p != kNone; prev = p, p = next_[static_cast<size_t>(p)]) {
    if (prev_[static_cast<size_t>(p)] != prev) return internal_error("free list links are broken");
    if (++listed > num_pages_) return internal_error("free list has a cycle");
  }
  if (free != num_free_ || listed != num_free_)
    return internal_error("free count " + std::to_string(num_free_) + ", unreferenced " + std::to_string(free) +
                          ", listed " + std::to_string(listed));
  if (num_free_ + num_used() != num_pages_) return internal_error("free + used != total");
  int64_t registered = 0;
  for (auto r : registered_) registered += r;
  if (registered != static_cast<int64_t>(index_.size())) return internal_error("index size differs from registered pages");
  return Status::ok();
}

}  // namespace mx
