// BatchStaging: one page table per layer group, packed so that group g of a batch of S sequences always sits
// at the same address; a single row serves every group; bad row counts are errors, not crashes; a step goes
// up in one copy, and a batch of one shape finds every section where the last one of that shape did.
#include "runtime/batch_staging.h"

#include <gtest/gtest.h>

#include "backend/forwarding_backend.h"

namespace mx {
namespace {

std::vector<int32_t> table(const TensorView& t) {
  const auto* p = t.ptr<const int32_t>();
  return std::vector<int32_t>(p, p + t.numel());
}

// Counts uploads (each one synchronizes a CUDA stream) and the bytes they move.
class CopyCounter final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  Status copy_from_host(TensorView dst, const void* src) override {
    ++copies;
    bytes += dst.bytes();
    return ForwardingBackend::copy_from_host(dst, src);
  }
  Status copy_row_prefixes_from_host(TensorView dst, const void* src, int64_t prefix_bytes) override {
    ++copies;
    bytes += dst.dim(0) * prefix_bytes;
    return ForwardingBackend::copy_row_prefixes_from_host(dst, src, prefix_bytes);
  }
  int copies = 0;
  int64_t bytes = 0;
};

TEST(BatchStaging, OneCopyPerStepAndFixedAddressesPerShape) {
  CopyCounter backend(make_cpu_backend(CpuBackendOptions{1}));
  auto staging = BatchStaging::create(backend, BatchLimits{40, 4, 3, 40, 2, false});
  ASSERT_TRUE(staging.is_ok()) << staging.status().to_string();
  const std::vector<int32_t> a = {11, 12, 13}, b = {21, 22, 23}, pages = {7, 8};
  auto verify = staging->stage({{a, 30, pages, true, false}, {b, 5, pages, true, false}});
  ASSERT_TRUE(verify.is_ok()) << verify.status().to_string();
  EXPECT_EQ(backend.copies, 1);
  EXPECT_EQ(table(verify->token_ids), (std::vector<int32_t>{11, 12, 13, 21, 22, 23}));
  EXPECT_EQ(table(verify->positions), (std::vector<int32_t>{30, 31, 32, 5, 6, 7}));
  EXPECT_EQ(table(verify->token_seq), (std::vector<int32_t>{0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(table(verify->logit_rows), (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(table(verify->page_table(1)), (std::vector<int32_t>{7, 8, 0, 7, 8, 0}));
  // A decode step in between moves the sections; the next step of the first shape finds them where they were.
  auto decode = staging->stage({{std::span(a).first(1), 9, pages, false, false}});
  ASSERT_TRUE(decode.is_ok());
  EXPECT_EQ(table(decode->positions), std::vector<int32_t>{9});
  EXPECT_EQ(table(decode->logit_rows), std::vector<int32_t>{0});
  const BatchView first = *verify;
  verify = staging->stage({{b, 40, pages, true, false}, {a, 50, {}, true, false, {}}});
  ASSERT_TRUE(verify.is_ok());
  EXPECT_EQ(backend.copies, 3);
  EXPECT_EQ(verify->positions.data(), first.positions.data());
  EXPECT_EQ(verify->token_seq.data(), first.token_seq.data());
  EXPECT_EQ(verify->logit_rows.data(), first.logit_rows.data());
  EXPECT_EQ(verify->page_table(0).data(), first.page_table(0).data());
  EXPECT_EQ(verify->page_table(1).data(), first.page_table(1).data());
  EXPECT_EQ(table(verify->page_table(0)), (std::vector<int32_t>{7, 8, 0, 0, 0, 0}));
}

// At a long context limit (8192 pages a row) a step uploads only the table columns its rows use (rounded
// to 16), in a second copy; a step with few pages to leave out stays one copy, as does every step with
// whole_tables.
TEST(BatchStaging, LongRowsUploadOnlyTheirUsedColumns) {
  CopyCounter backend(make_cpu_backend(CpuBackendOptions{1}));
  const int64_t W = 8192;
  auto staging = BatchStaging::create(backend, BatchLimits{8, 2, W, 8, 2, false});
  ASSERT_TRUE(staging.is_ok()) << staging.status().to_string();
  const std::vector<int32_t> tokens = {5, 6};
  std::vector<int32_t> long_row(20), short_row = {3};
  for (int32_t i = 0; i < 20; ++i) long_row[static_cast<size_t>(i)] = 100 + i;
  auto view = staging->stage({{std::span(tokens).first(1), 310, long_row, false, false},
                              {std::span(tokens).last(1), 2, short_row, false, false}});
  ASSERT_TRUE(view.is_ok()) << view.status().to_string();
  EXPECT_EQ(backend.copies, 2);
  EXPECT_EQ(backend.bytes, 4 * 64 + 4 * 4 * 32);  // the sections (64 i32) and 4 rows of 32 columns, not 128 KB
  for (int64_t g = 0; g < 2; ++g) {
    const std::vector<int32_t> t = table(view->page_table(g));
    EXPECT_EQ(std::vector<int32_t>(t.begin(), t.begin() + 20), long_row);
    EXPECT_EQ(t[20], 0);
    EXPECT_EQ(t[static_cast<size_t>(W)], 3);
    EXPECT_EQ(t[static_cast<size_t>(W) + 1], 0);
  }
  // One sequence: its two rows' 8176 unused columns are just under the split's 64 KB: one copy.
  backend.copies = 0;
  auto one = staging->stage({{std::span(tokens).first(1), 0, short_row, false, false}});
  ASSERT_TRUE(one.is_ok());
  EXPECT_EQ(backend.copies, 1);
  EXPECT_EQ(table(one->page_table(1))[0], 3);
  // Benchmarks' whole_tables: every column, in the step's one copy (the before of the change).
  auto whole = BatchStaging::create(backend, BatchLimits{8, 2, W, 8, 2, true});
  ASSERT_TRUE(whole.is_ok());
  backend.copies = 0, backend.bytes = 0;
  ASSERT_TRUE(whole->stage({{std::span(tokens).first(1), 310, long_row, false, false},
                            {std::span(tokens).last(1), 2, short_row, false, false}}).is_ok());
  EXPECT_EQ(backend.copies, 1);
  EXPECT_EQ(backend.bytes, 4 * 64 + 4 * 4 * W);
}

TEST(BatchStaging, OnePageTablePerLayerGroup) {
  auto backend = make_cpu_backend(CpuBackendOptions{1});
  auto staging = BatchStaging::create(*backend, BatchLimits{8, 2, 3, 2, 2, false});
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
  EXPECT_FALSE(BatchStaging::create(*backend, BatchLimits{8, 2, 3, 2, kMaxKvGroups + 1, false}).is_ok());
}

}  // namespace
}  // namespace mx
