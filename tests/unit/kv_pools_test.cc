// KvPools: one page pool per KV layer group. A sliding-window group releases the pages its window left
// behind (slots become kNoPage); growth is all or nothing over the groups; a cached prefix is usable only as
// far as every group still holds what the continuation needs (hits, misses after eviction).
#include "runtime/kv_pools.h"

#include <gtest/gtest.h>

#include <numeric>

namespace mx {
namespace {

constexpr int64_t kPage = 4;

std::vector<int32_t> iota_tokens(int32_t first, int64_t n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

// Group 0: window 8 (a query sees itself and 7 keys back), 6 pages; group 1: full attention, 120 pages.
KvPools make_pools(int64_t window_pages = 6) { return KvPools({{8, window_pages}, {0, 120}}, kPage, true); }

int64_t held(const std::vector<int32_t>& row) {
  return std::count_if(row.begin(), row.end(), [](int32_t p) { return p != kNoPage; });
}

TEST(KvPools, WindowGroupReleasesWhatItsWindowLeftBehind) {
  KvPools pools = make_pools();
  EXPECT_EQ(pools.anchor(), 1);
  PageRows rows;
  pools.init_rows(16, &rows);
  ASSERT_TRUE(pools.allocate(12, &rows));  // 3 pages in each group
  EXPECT_EQ(rows[0].size(), 3u);
  EXPECT_EQ(rows[1].size(), 3u);
  // Next query at 12 sees keys 5..12: page 0 (0..3) is behind the window.
  EXPECT_EQ(pools.first_needed_page(0, 12), 1);
  EXPECT_EQ(pools.first_needed_page(1, 12), 0);
  pools.release_below_window(12, &rows);
  EXPECT_EQ(rows[0][0], kNoPage);
  EXPECT_EQ(held(rows[0]), 2);
  EXPECT_EQ(pools.pool(0).num_used(), 2);
  EXPECT_EQ(pools.pool(1).num_used(), 3);
  // Far past the window: the group holds at most the window's pages plus the one being written.
  for (int64_t tokens = 13; tokens <= 400; ++tokens) {
    ASSERT_TRUE(pools.allocate(tokens, &rows)) << tokens;
    pools.release_below_window(tokens, &rows);
    ASSERT_LE(held(rows[0]), 3) << tokens;
    ASSERT_TRUE(pools.check({&rows}).is_ok());
  }
  EXPECT_EQ(rows[0].size(), 100u);
  EXPECT_FALSE(pools.allocate(481, &rows));  // past the full group's 120 pages
  pools.release(&rows);
  EXPECT_EQ(pools.pool(0).num_used(), 0);
  EXPECT_EQ(pools.pool(1).num_used(), 0);
}

TEST(KvPools, GrowthIsAllOrNothingOverTheGroups) {
  KvPools pools = make_pools(2);
  PageRows rows;
  pools.init_rows(16, &rows);
  ASSERT_TRUE(pools.allocate(8, &rows));
  EXPECT_FALSE(pools.allocate(12, &rows));  // the window group has no third page
  EXPECT_EQ(rows[0].size(), 2u);
  EXPECT_EQ(rows[1].size(), 2u);             // the full group took nothing either
  EXPECT_TRUE(pools.check({&rows}).is_ok());
}

TEST(KvPools, PrefixHitNeedsTheWindowBeforeTheCut) {
  KvPools pools = make_pools();
  const auto tokens = iota_tokens(100, 24);  // 6 full pages
  PageRows a;
  pools.init_rows(16, &a);
  for (int64_t t = 4; t <= 24; t += 4) {  // one page per step, registered, then the window moves
    ASSERT_TRUE(pools.allocate(t, &a));
    pools.register_pages(a, tokens, t / kPage - 1, t / kPage);
    pools.release_below_window(t, &a);
  }
  EXPECT_EQ(held(a[0]), 2);  // pages 4 and 5 (keys 17..24 of the next query at 24)
  pools.release(&a);

  // Same tokens: at most (24 - 1) / 4 = 5 pages; the continuation at 20 needs window pages 3 and 4, and page 3
  // was released early but is still cached.
  PageRows b;
  pools.init_rows(16, &b);
  EXPECT_EQ(pools.acquire_prefix(tokens, 5, &b), 5);
  EXPECT_EQ(held(b[1]), 5);
  EXPECT_EQ(b[0][0], kNoPage);
  EXPECT_EQ(held(b[0]), 2);  // pages 3 and 4 (the next query at 20 sees keys 13..20)
  EXPECT_EQ(pools.first_needed_page(0, 20), 3);
  EXPECT_TRUE(pools.check({&b}).is_ok());
  pools.release(&b);

  // A different page 2: the anchor's chain stops there (a miss from page 2 on): 2 pages, and the next query
  // at 8 sees keys 1..8: both window pages.
  auto other = tokens;
  other[9] = 7;
  PageRows c;
  pools.init_rows(16, &c);
  EXPECT_EQ(pools.acquire_prefix(other, 5, &c), 2);
  EXPECT_EQ(held(c[0]), 2);
  pools.release(&c);
  EXPECT_TRUE(pools.check({}).is_ok());
}

TEST(KvPools, EvictedWindowPagesShortenTheHit) {
  KvPools pools = make_pools();
  const auto tokens = iota_tokens(100, 24);
  PageRows a;
  pools.init_rows(16, &a);
  for (int64_t t = 4; t <= 24; t += 4) {
    ASSERT_TRUE(pools.allocate(t, &a));
    pools.register_pages(a, tokens, t / kPage - 1, t / kPage);
    pools.release_below_window(t, &a);
  }
  pools.release(&a);
  // Another sequence takes every window page: the cached window pages are evicted (oldest first).
  PageRows hog;
  pools.init_rows(16, &hog);
  ASSERT_TRUE(pools.allocate(24, &hog));
  EXPECT_EQ(pools.pool(0).num_free(), 0);
  PageRows b;
  pools.init_rows(16, &b);
  // The full group still has all 5 pages, but no cut has its window: no usable prefix, nothing held.
  EXPECT_EQ(pools.acquire_prefix(tokens, 5, &b), 0);
  EXPECT_EQ(held(b[0]) + held(b[1]), 0);
  EXPECT_TRUE(pools.check({&b, &hog}).is_ok());
  pools.release(&hog);
  pools.release(&b);
  EXPECT_EQ(pools.pool(1).num_used(), 0);
}

TEST(KvPools, NoFullGroupMeansNoPrefixCache) {
  KvPools pools({{8, 4}}, kPage, true);
  EXPECT_EQ(pools.anchor(), -1);
  EXPECT_FALSE(pools.prefix_cache_enabled());
  PageRows rows;
  pools.init_rows(4, &rows);
  EXPECT_EQ(pools.acquire_prefix(iota_tokens(0, 16), 3, &rows), 0);
}

}  // namespace
}  // namespace mx
