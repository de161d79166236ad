#include "backend/cuda/all_reduce_config.h"

#include <algorithm>

namespace mx::cuda {

int64_t one_shot_default_max_bytes(int ranks) {
  if (ranks < 2 || ranks > kOneShotMaxRanks) return 0;
  // H100s over NVLink (mx_all_reduce_bench): one-shot beats NCCL at every size up to the slot's 512 KB, at
  // 2 ranks (4.8 vs 6.7 us at one 20b row, 7.6 vs 9.9 us at 512 KB: 2026-11-27-h100x2-tp-one-shot-all-reduce)
  // and at 4 (5.3 vs 10.7 us, 12.8 vs 14.0 us: 2026-11-27-h100x4-tp-moe-split), so up to 4 ranks take it to the
  // slot. Each rank sends ranks - 1 copies of its message, so the crossover falls as the group grows: past 4
  // (not measured) the slot is scaled by 3 / (ranks - 1).
  if (ranks <= 4) return kOneShotSlotBytes;
  return kOneShotSlotBytes * 3 / (ranks - 1);
}

bool use_one_shot_all_reduce(int64_t bytes, int ranks, bool peer_exchange, int64_t max_bytes) {
  if (!peer_exchange || ranks < 2 || ranks > kOneShotMaxRanks || bytes <= 0) return false;
  const int64_t limit = max_bytes == kOneShotAutoMaxBytes ? one_shot_default_max_bytes(ranks) : max_bytes;
  return bytes <= std::min(limit, kOneShotSlotBytes);
}

OneShotLaunch one_shot_launch(int64_t bytes, int64_t element_bytes) {
  OneShotLaunch l;
  l.vectorized = bytes % 16 == 0;
  l.units = l.vectorized ? bytes / 16 : bytes / element_bytes;
  l.threads = kOneShotThreads;
  l.blocks = static_cast<int>(std::clamp<int64_t>((l.units + l.threads - 1) / l.threads, 1, kOneShotMaxBlocks));
  return l;
}

}  // namespace mx::cuda
