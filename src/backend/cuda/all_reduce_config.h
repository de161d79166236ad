// Which path a tensor-parallel all-reduce takes on CUDA (nccl_communicator.cc) and the launch shape of the
// one-shot kernel (kernels/all_reduce.cu). Plain C++ without CUDA headers so that CPU unit tests cover it.
//
// One-shot: every rank writes its whole message into every rank's exchange slot over peer memory, raises a
// flag there, waits for everyone's flags and sums the slots in rank order. One kernel and one hop, but each
// rank sends (ranks - 1) copies of its message, so it wins only for small messages (decode rows); NCCL's ring
// (or tree) takes the large ones.
#pragma once

#include <cstdint>

namespace mx::cuda {

// Most ranks the one-shot kernel takes (its parameter block holds one pointer per rank).
inline constexpr int kOneShotMaxRanks = 8;
// Bytes of one rank's message that one exchange slot holds: the largest message the one-shot path can carry.
// Each rank's device holds 2 (parities) x ranks slots of this size.
inline constexpr int64_t kOneShotSlotBytes = int64_t{512} << 10;
// Most CTAs of one launch: the flags hold one row per CTA, [kOneShotMaxBlocks, ranks].
inline constexpr int kOneShotMaxBlocks = 32;
inline constexpr int kOneShotThreads = 256;
// Most rows the all-reduce fused with the following add + RMSNorm takes (one CTA per row: more rows would
// leave CTAs each moving a whole row, and batches past 8 spend their time elsewhere).
inline constexpr int64_t kOneShotMaxNormRows = 8;

// `one_shot_max_bytes` of AllReduceOptions: the measured default below.
inline constexpr int64_t kOneShotAutoMaxBytes = -1;

// Largest message (bytes per rank) the default sends one-shot for `ranks` ranks; NCCL above it.
int64_t one_shot_default_max_bytes(int ranks);

// Whether a message of `bytes` (per rank) over `ranks` ranks goes one-shot. `peer_exchange`: every rank can
// reach every other's memory (the exchange exists); `max_bytes` as AllReduceOptions::one_shot_max_bytes
// (kOneShotAutoMaxBytes, 0 = never, else at most kOneShotSlotBytes). Every rank decides the same for the same
// message, which the kernel's handshake needs.
bool use_one_shot_all_reduce(int64_t bytes, int ranks, bool peer_exchange, int64_t max_bytes);

struct OneShotLaunch {
  int blocks = 0, threads = 0;
  bool vectorized = false;  // 16-byte units (the message is a multiple of 16 bytes), else elements
  int64_t units = 0;        // 16-byte units or elements of the message
};
// `bytes` of elements of `element_bytes`: enough CTAs that each thread moves about one unit, at most
// kOneShotMaxBlocks (the CTAs then loop). bytes > 0. From the message's size alone, never its address: every
// rank must split the message among the same CTAs, whose flags pair up across ranks (a rank whose x is not
// 16-byte aligned still moves 16-byte units, reading and writing x an element at a time).
OneShotLaunch one_shot_launch(int64_t bytes, int64_t element_bytes);

}  // namespace mx::cuda
