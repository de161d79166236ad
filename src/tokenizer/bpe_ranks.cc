#include "tokenizer/bpe_ranks.h"

#include <cstring>
#include <limits>
#include <queue>

namespace mx {
namespace {

// Pieces up to this many bytes use the simple rescanning merge (cache friendly, no allocation beyond one
// small vector); longer ones use a heap so a megabyte-long run of letters stays O(n log n).
constexpr size_t kQuadraticMergeLimit = 128;
constexpr int32_t kNoRank = std::numeric_limits<int32_t>::max();

inline uint64_t mix(uint64_t h) {
  h ^= h >> 32;
  h *= 0xd6e8feb86659fd93ULL;
  h ^= h >> 32;
  return h;
}

}  // namespace

uint64_t hash_bytes(std::string_view bytes) {
  uint64_t h = 0x9e3779b97f4a7c15ULL ^ (bytes.size() * 0xff51afd7ed558ccdULL);
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, bytes.data() + i, 8);
    h = mix(h ^ w) * 0x9e3779b97f4a7c15ULL;
  }
  uint64_t tail = 0;
  for (size_t k = 0; i + k < bytes.size(); ++k) tail |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i + k])) << (8 * k);
  return mix(h ^ tail);
}

Result<BpeRanks> BpeRanks::build(std::vector<std::string> tokens) {
  if (tokens.size() >= static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    return invalid_argument("too many BPE ranks");
  BpeRanks t;
  size_t total = 0;
  for (const auto& tok : tokens) total += tok.size();
  if (total >= std::numeric_limits<uint32_t>::max()) return invalid_argument("BPE rank table is too large");
  t.arena_.reserve(total);
  t.offsets_.reserve(tokens.size() + 1);
  for (const auto& tok : tokens) {
    t.offsets_.push_back(static_cast<uint32_t>(t.arena_.size()));
    t.arena_ += tok;
  }
  t.offsets_.push_back(static_cast<uint32_t>(t.arena_.size()));

  size_t capacity = 16;
  while (capacity < tokens.size() * 2) capacity <<= 1;
  t.slots_.assign(capacity, -1);
  t.slot_mask_ = capacity - 1;
  for (int32_t r = 0; r < static_cast<int32_t>(tokens.size()); ++r) {
    const std::string_view key = t.bytes_of(r);
    if (key.empty()) continue;
    uint64_t s = hash_bytes(key) & t.slot_mask_;
    while (t.slots_[s] >= 0) {
      if (t.bytes_of(t.slots_[s]) == key)
        return invalid_argument("BPE ranks " + std::to_string(t.slots_[s]) + " and " + std::to_string(r) +
                                " have the same bytes");
      s = (s + 1) & t.slot_mask_;
    }
    t.slots_[s] = r;
  }
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    if (t.find(std::string_view(&c, 1)) < 0)
      return invalid_argument("BPE ranks lack the single byte " + std::to_string(b) + " (not byte-level BPE)");
  }
  return t;
}

int32_t BpeRanks::find(std::string_view bytes) const {
  if (slots_.empty() || bytes.empty()) return -1;
  uint64_t s = hash_bytes(bytes) & slot_mask_;
  while (true) {
    const int32_t r = slots_[s];
    if (r < 0) return -1;
    const uint32_t begin = offsets_[r];
    const uint32_t len = offsets_[r + 1] - begin;
    if (len == bytes.size() && std::memcmp(arena_.data() + begin, bytes.data(), len) == 0) return r;
    s = (s + 1) & slot_mask_;
  }
}

std::string_view BpeRanks::bytes_of(int32_t rank) const {
  if (rank < 0 || rank >= size()) return {};
  return std::string_view(arena_).substr(offsets_[rank], offsets_[rank + 1] - offsets_[rank]);
}

void BpeRanks::encode_piece(std::string_view piece, std::vector<int32_t>* out) const {
  if (piece.empty()) return;
  const int32_t whole = find(piece);
  if (whole >= 0) {
    out->push_back(whole);
    return;
  }
  if (piece.size() <= kQuadraticMergeLimit) {
    merge_quadratic(piece, out);
  } else {
    merge_with_heap(piece, out);
  }
}

void BpeRanks::merge_quadratic(std::string_view piece, std::vector<int32_t>* out) const {
  // parts[i].start is where part i begins; parts[i].rank is the rank of part i joined with part i + 1.
  struct Part {
    uint32_t start;
    int32_t rank;
  };
  Part parts_buf[kQuadraticMergeLimit + 1];
  const size_t n = piece.size();
  size_t count = n + 1;  // n single-byte parts plus the end sentinel
  auto pair_rank = [&](size_t i) -> int32_t {
    // Rank of parts i and i + 1 joined; parts are contiguous so that is piece[start_i, start_{i+2}).
    if (i + 2 >= count) return kNoRank;
    const int32_t r = find(piece.substr(parts_buf[i].start, parts_buf[i + 2].start - parts_buf[i].start));
    return r < 0 ? kNoRank : r;
  };
  for (size_t i = 0; i < count; ++i) parts_buf[i] = {static_cast<uint32_t>(i), kNoRank};
  for (size_t i = 0; i + 2 < count; ++i) parts_buf[i].rank = pair_rank(i);
  while (count > 2) {
    int32_t best = kNoRank;
    size_t best_i = 0;
    for (size_t i = 0; i + 2 < count; ++i) {
      if (parts_buf[i].rank < best) {  // strict: the leftmost of equal ranks wins
        best = parts_buf[i].rank;
        best_i = i;
      }
    }
    if (best == kNoRank) break;
    // Part best_i absorbs part best_i + 1.
    for (size_t k = best_i + 1; k + 1 < count; ++k) parts_buf[k] = parts_buf[k + 1];
    --count;
    parts_buf[best_i].rank = pair_rank(best_i);
    if (best_i > 0) parts_buf[best_i - 1].rank = pair_rank(best_i - 1);
  }
  for (size_t i = 0; i + 1 < count; ++i)
    out->push_back(find(piece.substr(parts_buf[i].start, parts_buf[i + 1].start - parts_buf[i].start)));
}

void BpeRanks::merge_with_heap(std::string_view piece, std::vector<int32_t>* out) const {
  // A doubly linked list of parts over byte offsets, and a min-heap of (rank, start) candidate merges.
  // Entries go stale when a neighbour merges; an entry is acted on only if the pair starting at `start`
  // still exists and still has that rank, which makes the pop order identical to the rescanning merge.
  const uint32_t n = static_cast<uint32_t>(piece.size());
  std::vector<uint32_t> next(n), prev(n);
  std::vector<bool> alive(n, true);
  for (uint32_t i = 0; i < n; ++i) {
    next[i] = i + 1;
    prev[i] = i == 0 ? UINT32_MAX : i - 1;
  }
  auto end_of = [&](uint32_t start) { return next[start]; };
  auto rank_at = [&](uint32_t start) -> int32_t {
    const uint32_t mid = end_of(start);
    if (mid >= n) return kNoRank;
    const uint32_t end = end_of(mid);
    const int32_t r = find(piece.substr(start, end - start));
    return r < 0 ? kNoRank : r;
  };
  using Entry = std::pair<int32_t, uint32_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  for (uint32_t i = 0; i + 1 < n; ++i) {
    const int32_t r = rank_at(i);
    if (r != kNoRank) heap.push({r, i});
  }
  while (!heap.empty()) {
    const auto [rank, start] = heap.top();
    heap.pop();
    if (!alive[start] || rank_at(start) != rank) continue;
    const uint32_t victim = next[start];
    alive[victim] = false;
    next[start] = next[victim];
    if (next[start] < n) prev[next[start]] = start;
    const int32_t r_here = rank_at(start);
    if (r_here != kNoRank) heap.push({r_here, start});
    if (prev[start] != UINT32_MAX) {
      const int32_t r_left = rank_at(prev[start]);
      if (r_left != kNoRank) heap.push({r_left, prev[start]});
    }
  }
  for (uint32_t i = 0; i < n; i = next[i]) out->push_back(find(piece.substr(i, next[i] - i)));
}

}  // namespace mx
