// The BPE rank table: token bytes <-> rank, and the tiktoken merge rule over it.
//
// Byte-level BPE as tiktoken defines it: inside one pre-token, a byte string that is itself a rank key is one
// token; otherwise start from single bytes and repeatedly merge the adjacent pair whose concatenation has the
// lowest rank (leftmost on ties) until no adjacent pair concatenates to a rank key. The table is immutable
// after construction and safe to share between threads.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace mx {

class BpeRanks {
 public:
  BpeRanks() = default;

  // `tokens[r]` holds the bytes of rank r; an empty string marks an unused rank. Fails on duplicate byte
  // strings or when one of the 256 single bytes has no rank (byte-level BPE needs all of them).
  static Result<BpeRanks> build(std::vector<std::string> tokens);

  // Rank of exactly these bytes, or -1.
  int32_t find(std::string_view bytes) const;

  // Bytes of a rank; empty for an unused or out-of-range rank.
  std::string_view bytes_of(int32_t rank) const;

  // One past the highest rank.
  int32_t size() const { return static_cast<int32_t>(offsets_.empty() ? 0 : offsets_.size() - 1); }

  // Appends the tokens of one pre-token to *out.
  void encode_piece(std::string_view piece, std::vector<int32_t>* out) const;

 private:
  void merge_quadratic(std::string_view piece, std::vector<int32_t>* out) const;
  void merge_with_heap(std::string_view piece, std::vector<int32_t>* out) const;

  std::string arena_;             // all token bytes back to back, in rank order
  std::vector<uint32_t> offsets_; // [size + 1]: rank r is arena_[offsets_[r], offsets_[r + 1])
  std::vector<int32_t> slots_;    // open-addressing table of ranks (-1 = empty); size is a power of two
  uint64_t slot_mask_ = 0;
};

// A fast non-cryptographic hash of a byte string (used by the rank table and the pre-token cache).
uint64_t hash_bytes(std::string_view bytes);

}  // namespace mx
