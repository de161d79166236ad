// The CUDA all-reduce's path choice and the one-shot kernel's launch shape (all_reduce_config.h), on the CPU:
// which messages go one-shot, that none outgrows an exchange slot, and that the launch covers every unit with
// no more CTAs than the flags have rows for (from the size alone: every rank must launch the same CTAs).
#include <gtest/gtest.h>

#include "backend/cuda/all_reduce_config.h"

namespace mx::cuda {
namespace {

TEST(CudaAllReduceConfig, DecodeRowsGoOneShotAndLargeMessagesGoToNccl) {
  const int64_t row = 2880 * 2;  // one gpt-oss hidden row in bf16
  for (int ranks : {2, 4, 8}) {
    EXPECT_TRUE(use_one_shot_all_reduce(row, ranks, true, kOneShotAutoMaxBytes)) << ranks;
    EXPECT_TRUE(use_one_shot_all_reduce(8 * row, ranks, true, kOneShotAutoMaxBytes)) << ranks;
    EXPECT_FALSE(use_one_shot_all_reduce(8192 * row, ranks, true, kOneShotAutoMaxBytes)) << ranks;
    const int64_t limit = one_shot_default_max_bytes(ranks);
    EXPECT_GT(limit, 0);
    EXPECT_LE(limit, kOneShotSlotBytes);
    EXPECT_TRUE(use_one_shot_all_reduce(limit, ranks, true, kOneShotAutoMaxBytes));
    EXPECT_FALSE(use_one_shot_all_reduce(limit + 1, ranks, true, kOneShotAutoMaxBytes));
  }
  // More ranks send more copies: the crossover never grows with the group.
  EXPECT_GE(one_shot_default_max_bytes(2), one_shot_default_max_bytes(4));
  EXPECT_GE(one_shot_default_max_bytes(4), one_shot_default_max_bytes(8));
}

TEST(CudaAllReduceConfig, NcclWhereTheExchangeCannotTakeIt) {
  EXPECT_FALSE(use_one_shot_all_reduce(64, 2, /*peer_exchange=*/false, kOneShotAutoMaxBytes));
  EXPECT_FALSE(use_one_shot_all_reduce(64, 1, true, kOneShotAutoMaxBytes));
  EXPECT_FALSE(use_one_shot_all_reduce(64, kOneShotMaxRanks + 1, true, kOneShotAutoMaxBytes));
  EXPECT_EQ(one_shot_default_max_bytes(kOneShotMaxRanks + 1), 0);
  EXPECT_FALSE(use_one_shot_all_reduce(0, 2, true, kOneShotAutoMaxBytes));
  // An explicit limit: 0 turns the path off, and no limit lets a message outgrow its slot.
  EXPECT_FALSE(use_one_shot_all_reduce(64, 2, true, 0));
  EXPECT_TRUE(use_one_shot_all_reduce(kOneShotSlotBytes, 2, true, kOneShotSlotBytes));
  EXPECT_FALSE(use_one_shot_all_reduce(kOneShotSlotBytes + 2, 2, true, kOneShotSlotBytes));
  EXPECT_TRUE(use_one_shot_all_reduce(100, 2, true, 100));
  EXPECT_FALSE(use_one_shot_all_reduce(102, 2, true, 100));
}

TEST(CudaAllReduceConfig, LaunchCoversEveryUnitWithinTheFlagRows) {
  for (int64_t element : {2, 4})
    for (int64_t elements : {int64_t{1}, int64_t{7}, int64_t{2880}, int64_t{2883}, int64_t{2880 * 8}, kOneShotSlotBytes / element}) {
      const int64_t bytes = elements * element;
      const OneShotLaunch l = one_shot_launch(bytes, element);
      EXPECT_EQ(l.vectorized, bytes % 16 == 0) << bytes;
      EXPECT_EQ(l.units, l.vectorized ? bytes / 16 : elements) << bytes;
      EXPECT_GE(l.blocks, 1);
      EXPECT_LE(l.blocks, kOneShotMaxBlocks);
      EXPECT_EQ(l.threads, kOneShotThreads);
      // Each CTA takes ceil(units / blocks) units; a CTA with none still joins the handshake.
      EXPECT_GE(static_cast<int64_t>(l.blocks) * l.threads * 64, l.units) << "fewer than 64 units per thread";
      if (l.units <= kOneShotThreads) {
        EXPECT_EQ(l.blocks, 1) << bytes;
      }
    }
}

}  // namespace
}  // namespace mx::cuda
