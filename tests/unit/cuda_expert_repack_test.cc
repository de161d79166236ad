// The swap-AB MXFP4 repacking: every weight read back through the kernel's fragment decode equals the
// checkpoint's dequantized weight, and gate/up rows pair up in each strip.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/expert_repack.h"

namespace mx::cuda {
namespace {

void check_round_trip(int64_t rows, int64_t k, bool pairs) {
  std::mt19937 rng(7);
  std::vector<uint8_t> blocks(static_cast<size_t>(rows * k / 2)), scales(static_cast<size_t>(rows * k / 32));
  for (auto& b : blocks) b = static_cast<uint8_t>(rng());
  for (auto& s : scales) s = static_cast<uint8_t>(100 + rng() % 29);  // up to 128
  ASSERT_TRUE(check_swap_ab(rows, k, scales.data()).is_ok());
  std::vector<uint8_t> pb(blocks.size()), ps(scales.size());
  repack_mxfp4_swap_ab(blocks.data(), scales.data(), rows, k, pairs, pb.data(), ps.data());
  std::vector<float> want(static_cast<size_t>(k));
  for (int64_t packed = 0; packed < rows; ++packed) {
    const int64_t src = swap_ab_source_row(packed / 16, static_cast<int>(packed % 16), pairs);
    cpu::dequantize_mxfp4_row(blocks.data() + src * k / 2, scales.data() + src * k / 32, k, want.data());
    for (int64_t c = 0; c < k; ++c)
      ASSERT_EQ(swap_ab_weight(pb.data(), ps.data(), rows, k, packed, c), want[c]) << "row " << packed << " col " << c;
  }
}

TEST(CudaExpertRepack, RoundTripsDownProjection) { check_round_trip(32, 192, false); }
TEST(CudaExpertRepack, RoundTripsGateUpPairs) { check_round_trip(64, 320, true); }

TEST(CudaExpertRepack, GateAndUpOfAChannelShareAStrip) {
  for (int rr = 0; rr < 8; ++rr) {
    EXPECT_EQ(swap_ab_source_row(3, rr, true), 2 * (3 * 8 + rr));
    EXPECT_EQ(swap_ab_source_row(3, rr + 8, true), 2 * (3 * 8 + rr) + 1);
  }
  EXPECT_EQ(swap_ab_source_row(2, 5, false), 37);
}

TEST(CudaExpertRepack, RejectsUnsupportedShapesAndScales) {
  std::vector<uint8_t> scales(16 * 2, 127);
  EXPECT_FALSE(check_swap_ab(15, 64, scales.data()).is_ok());
  EXPECT_FALSE(check_swap_ab(16, 32, scales.data()).is_ok());
  scales[5] = 129;  // 2^2: the pre-biased bf16 scale would overflow
  EXPECT_FALSE(check_swap_ab(16, 64, scales.data()).is_ok());
}

}  // namespace
}  // namespace mx::cuda
