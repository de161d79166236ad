// The one-shot all-reduce over peer memory (all_reduce.cu; all_reduce_config.h says when it runs). Included by
// host code compiled without nvcc: no device code here.
//
// Each rank's device holds an exchange: slots [2 parities][ranks][kOneShotSlotBytes] that the ranks write
// their messages into, flags [kOneShotMaxBlocks][ranks] (u64) that they raise there, and a state that only
// its own rank's kernels touch. A call's epoch (the state's epoch + 1) numbers it; the calls of every rank
// are the same sequence, so the epochs agree without the host, under graph replay too (the state lives on
// the device and the last CTA of each call advances it).
//
// Why one handshake per call is enough: CTA b of rank r writes its share of the message into every rank's
// slot [epoch % 2][r], then raises flag [b][r] to the epoch on every rank; CTA b of every rank waits until
// all ranks' flags [b][*] reach the epoch, then sums its share of the slots [epoch % 2][0..ranks) in rank
// order into x. A rank can run at most one call ahead of another (it cannot pass call e + 1's handshake
// before every rank has started call e + 1, and so finished call e), so it writes the other parity than the
// one still being read; flags only grow (u64: no wrap), so "at least the epoch" is the test.
//
// Abort: a rank waiting for a peer that never comes polls `abort` (host-mapped memory the communicator's
// abort() sets) and leaves x undefined; the round fails on the host.
//
// Fused with the add + RMSNorm that follows a row-parallel projection (norm.out set): one CTA per row of x
// (at most kOneShotMaxNormRows rows), which after writing its row of the sum runs the row's residual add and
// norm exactly as rms_norm_kernel does (row_norm.cuh), so the result is the unfused pair's, bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/all_reduce_config.h"
#include "backend/cuda/kernels/kernels.h"
#include "core/status.h"

namespace mx::cuda {

// Per rank, in its own device memory; zeroed when made.
struct OneShotState {
  uint64_t epoch = 0;         // calls finished on this rank
  uint32_t blocks_done = 0;   // CTAs of the running call that have finished (the last one advances epoch)
};

struct OneShotAllReduceParams {
  void* x = nullptr;  // [n] bf16 or f32: this rank's partial sum in, every rank's total out
  int64_t n = 0;
  bool bf16 = false;  // else f32
  int rank = 0, ranks = 0;
  uint8_t* slots[kOneShotMaxRanks] = {};    // rank r's slots, u8 [2][ranks][kOneShotSlotBytes] (peer memory)
  uint64_t* flags[kOneShotMaxRanks] = {};   // rank r's flags, u64 [kOneShotMaxBlocks][ranks] (peer memory)
  OneShotState* state = nullptr;            // this rank's
  const int* abort = nullptr;               // host-mapped; nonzero once the group aborted
  // With norm.out set: x is bf16 [norm.rows, norm.hidden], then residual += x, out = rms_norm(residual) * weight
  // (norm.delta is x).
  RmsNormParams norm;
};
// n * element size <= kOneShotSlotBytes, 2 <= ranks <= kOneShotMaxRanks; with the norm, bf16 x at a 16-byte
// aligned address, 1 <= rows <= kOneShotMaxNormRows, hidden a multiple of 8 up to 8192.
Status launch_one_shot_all_reduce(const OneShotAllReduceParams& p, cudaStream_t stream);

}  // namespace mx::cuda
