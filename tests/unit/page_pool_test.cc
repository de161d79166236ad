// PagePool: all-or-nothing allocation, reference counts, LRU eviction of cached pages, and the prefix
// cache's exact matching (tokens and parent chain), checked against the pool's own invariant check.
#include "runtime/page_pool.h"

#include <gtest/gtest.h>

#include <numeric>

namespace mx {
namespace {

std::vector<int32_t> iota_tokens(int32_t first, int64_t n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

// Reference counts implied by a set of page tables.
std::vector<int32_t> refs_of(const PagePool& pool, const std::vector<std::vector<int32_t>*>& tables) {
  std::vector<int32_t> refs(static_cast<size_t>(pool.num_pages()), 0);
  for (auto* t : tables)
    for (int32_t p : *t) ++refs[static_cast<size_t>(p)];
  return refs;
}

// Registers every full page of `tokens` held in `pages`.
void register_all(PagePool& pool, const std::vector<int32_t>& pages, const std::vector<int32_t>& tokens) {
  for (size_t i = 0; i < pages.size() && (i + 1) * 4 <= tokens.size(); ++i)
    pool.register_page(pages, static_cast<int64_t>(i), std::span<const int32_t>(tokens).subspan(i * 4, 4));
}

TEST(PagePool, AllocateIsAllOrNothingAndReleaseFrees) {
  PagePool pool(8, 4, false);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(pool.allocate(5, &a));
  EXPECT_FALSE(pool.allocate(4, &b));
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(pool.num_used(), 5);
  EXPECT_TRUE(pool.check(refs_of(pool, {&a, &b})).is_ok());
  ASSERT_TRUE(pool.allocate(3, &b));
  EXPECT_EQ(pool.num_free(), 0);
  pool.release(a);
  a.clear();
  EXPECT_EQ(pool.num_free(), 5);
  EXPECT_EQ(pool.num_used() + pool.num_free(), pool.num_pages());
  EXPECT_TRUE(pool.check(refs_of(pool, {&a, &b})).is_ok());
  // A stale reference is caught by the check.
  std::vector<int32_t> refs = refs_of(pool, {&a, &b});
  refs[static_cast<size_t>(b[0])] = 2;
  EXPECT_FALSE(pool.check(refs).is_ok());
}

TEST(PagePool, PrefixHitSharesPagesAndRequiresTheWholeChain) {
  PagePool pool(16, 4, true);
  const auto tokens = iota_tokens(100, 12);  // three full pages
  std::vector<int32_t> a;
  ASSERT_TRUE(pool.allocate(3, &a));
  register_all(pool, a, tokens);
  EXPECT_EQ(pool.num_cached(), 3);

  // Same prefix: three shared pages, reference 2 each.
  std::vector<int32_t> b;
  EXPECT_EQ(pool.acquire_prefix(tokens, 3, &b), 3);
  EXPECT_EQ(b, a);
  EXPECT_TRUE(pool.check(refs_of(pool, {&a, &b})).is_ok());

  // max_pages caps the hit (a full hit leaves the last page to recompute).
  std::vector<int32_t> c;
  EXPECT_EQ(pool.acquire_prefix(tokens, 2, &c), 2);

  // A different first page matches nothing, even though pages 2 and 3 are identical: the chain decides.
  auto other = tokens;
  other[1] = 7;
  std::vector<int32_t> d;
  EXPECT_EQ(pool.acquire_prefix(other, 3, &d), 0);
  // A different second page stops after one page.
  other = tokens;
  other[5] = 7;
  EXPECT_EQ(pool.acquire_prefix(other, 3, &d), 1);
  EXPECT_TRUE(pool.check(refs_of(pool, {&a, &b, &c, &d})).is_ok());
  for (auto* t : {&a, &b, &c, &d}) {
    pool.release(*t);
    t->clear();
  }
  EXPECT_EQ(pool.num_used(), 0);
  EXPECT_EQ(pool.num_cached(), 3);  // still cached, free to evict
  EXPECT_TRUE(pool.check(refs_of(pool, {})).is_ok());
}

TEST(PagePool, EvictsUncachedFirstThenLeastRecentlyReleased) {
  PagePool pool(6, 4, true);
  const auto t1 = iota_tokens(0, 8), t2 = iota_tokens(50, 8);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(pool.allocate(2, &a));
  register_all(pool, a, t1);
  ASSERT_TRUE(pool.allocate(2, &b));
  register_all(pool, b, t2);
  pool.release(a);  // released first: evicted first among cached pages
  pool.release(b);
  a.clear();
  b.clear();
  // Two never-cached pages go first: both prefixes survive.
  std::vector<int32_t> c;
  ASSERT_TRUE(pool.allocate(2, &c));
  std::vector<int32_t> probe;
  EXPECT_EQ(pool.acquire_prefix(t1, 2, &probe), 2);
  pool.release(probe);
  probe.clear();
  // The probe just refreshed t1, so t2 (released earlier now) is the next to go, deepest page first.
  ASSERT_TRUE(pool.allocate(1, &c));
  EXPECT_EQ(pool.acquire_prefix(t2, 2, &probe), 1);
  pool.release(probe);
  probe.clear();
  EXPECT_EQ(pool.acquire_prefix(t1, 2, &probe), 2);
  pool.release(probe);
  EXPECT_TRUE(pool.check(refs_of(pool, {&c})).is_ok());
}

TEST(PagePool, ReusingAParentOrphansItsChildren) {
  PagePool pool(3, 2, true);
  const std::vector<int32_t> t = {1, 2, 3, 4};
  const auto first = std::span<const int32_t>(t).subspan(0, 2), second = std::span<const int32_t>(t).subspan(2, 2);
  std::vector<int32_t> a;
  ASSERT_TRUE(pool.allocate(2, &a));
  pool.register_page(a, 0, first);
  pool.register_page(a, 1, second);
  EXPECT_EQ(pool.num_cached(), 2);
  // Release the parent before the child, so the parent is evicted first and the child survives it.
  pool.release(std::span<const int32_t>(a).subspan(0, 1));
  pool.release(std::span<const int32_t>(a).subspan(1, 1));
  std::vector<int32_t> b;
  ASSERT_TRUE(pool.allocate(2, &b));  // the never-cached page, then the parent
  EXPECT_EQ(pool.num_cached(), 1);
  std::vector<int32_t> probe;
  EXPECT_EQ(pool.acquire_prefix(t, 2, &probe), 0);
  // The parent's page now holds the same tokens again, registered afresh: the old child must not match
  // under it (its keys and values were computed after a page that no longer exists).
  const std::vector<int32_t> row = {b[1]};
  pool.register_page(row, 0, first);
  EXPECT_EQ(pool.acquire_prefix(t, 2, &probe), 1);
  EXPECT_EQ(probe, std::vector<int32_t>{b[1]});
  EXPECT_TRUE(pool.check(refs_of(pool, {&b, &probe})).is_ok());
}

TEST(PagePool, DuplicateContentIsNotRegisteredTwice) {
  PagePool pool(8, 4, true);
  const auto t = iota_tokens(9, 8);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(pool.allocate(2, &a));
  ASSERT_TRUE(pool.allocate(2, &b));
  register_all(pool, a, t);
  register_all(pool, b, t);  // computed concurrently: the first registration wins
  EXPECT_EQ(pool.num_cached(), 2);
  std::vector<int32_t> probe;
  EXPECT_EQ(pool.acquire_prefix(t, 2, &probe), 2);
  EXPECT_EQ(probe, a);
  EXPECT_TRUE(pool.check(refs_of(pool, {&a, &b, &probe})).is_ok());
}

}  // namespace
}  // namespace mx
