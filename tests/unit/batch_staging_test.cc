// BatchStaging: one page table per layer group, packed so that group g of a batch of S sequences always sits
// at the same address; a single row serves every group; bad row counts are errors, not crashes.
#include "runtime/batch_staging.h"

#include <gtest/gtest.h>

namespace mx {
namespace {

std::vector<int32_t> table(const TensorView& t) {
  const auto* p = t.ptr<const int32_t>();
  return std::vector<int32_t>(p, p + t.numel());
}

TEST(BatchStaging, OnePageTablePerLayerGroup) {
  auto backend = make_cpu_backend(CpuBackendOptions{1});
  auto staging = BatchStaging::create(*backend, BatchLimits{8, 2, 3, 2, 2});
  ASSERT_TRUE(staging.is_ok()) << staging.status().to_string();
  const std::vector<int32_t> tokens = {5, 6, 7};
  const std::vector<std::vector<int32_t>> a = {{4, 1}, {kNoPage, 9}};  // group 1 released its first page
  const std::vector<std::vector<int32_t>> b = {{2}, {3}};
  const std::vector<BatchSequence> seqs = {{std::span(tokens).first(2), 20, {}, false, false, a},
                                           {std::span(tokens).last(1), 3, {}, false, false, b}};
  auto view = staging->stage(seqs);
  ASSERT_TRUE(view.is_ok()) << view.status().to_string();
  EXPECT_EQ(view->num_kv_groups, 2);
  EXPECT_EQ(view->max_position, 21);
  EXPECT_EQ(view->max_seq_tokens, 2);  // the CUDA backend picks the decode attention kernel by it
  EXPECT_EQ(table(view->page_table(0)), (std::vector<int32_t>{4, 1, 0, 2, 0, 0}));
  EXPECT_EQ(table(view->page_table(1)), (std::vector<int32_t>{kNoPage, 9, 0, 3, 0, 0}));
  // Group 1's table follows group 0's: the same address for every batch of two sequences.
  EXPECT_EQ(view->page_table(1).ptr<const int32_t>(), view->page_table(0).ptr<const int32_t>() + 2 * 3);

  // One row for every group.
  const std::vector<int32_t> shared = {8};
  auto one = staging->stage({{std::span(tokens).first(1), 0, shared, false, false}});
  ASSERT_TRUE(one.is_ok());
  EXPECT_EQ(one->max_seq_tokens, 1);
  EXPECT_EQ(table(one->page_table(0)), table(one->page_table(1)));

  const std::vector<std::vector<int32_t>> three = {{1}, {2}, {3}};
  auto bad = staging->stage({{std::span(tokens).first(1), 0, {}, false, false, three}});
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("3 page-table rows for 2 layer groups"), std::string::npos);
  EXPECT_FALSE(BatchStaging::create(*backend, BatchLimits{8, 2, 3, 2, kMaxKvGroups + 1}).is_ok());
}

}  // namespace
}  // namespace mx
