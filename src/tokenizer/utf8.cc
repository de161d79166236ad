#include "tokenizer/utf8.h"

namespace mx {
namespace {

// Allowed range of the second byte for a given lead byte (the first row of Unicode's Table 3-7);
// continuation bytes after the second are always 0x80..0xBF.
struct LeadInfo {
  int length;  // 0: not a lead byte
  uint8_t second_lo;
  uint8_t second_hi;
};

LeadInfo lead_info(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b < 0xC2) return {0, 0, 0};
  if (b < 0xE0) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b < 0xF0) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b < 0xF4) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

}  // namespace

int utf8_sequence_length(std::string_view text, size_t pos, int* maximal_subpart) {
  if (maximal_subpart) *maximal_subpart = 0;
  if (pos >= text.size()) return 0;
  const auto b0 = static_cast<uint8_t>(text[pos]);
  const LeadInfo info = lead_info(b0);
  if (info.length == 1) return 1;
  if (info.length == 0) {
    if (maximal_subpart) *maximal_subpart = 1;
    return 0;
  }
  int n = 1;
  for (; n < info.length; ++n) {
    if (pos + n >= text.size()) break;
    const auto b = static_cast<uint8_t>(text[pos + n]);
    const uint8_t lo = n == 1 ? info.second_lo : 0x80;
    const uint8_t hi = n == 1 ? info.second_hi : 0xBF;
    if (b < lo || b > hi) break;
  }
  if (n == info.length) return n;
  if (maximal_subpart) *maximal_subpart = n;
  return 0;
}

int utf8_unfinished_tail(std::string_view text) {
  // A lead byte starts a fresh sequence whatever precedes it, so only the last lead byte (within the last three
  // bytes: a longer tail would be whole or ill-formed) matters.
  for (size_t k = 1; k <= 3 && k <= text.size(); ++k) {
    const size_t start = text.size() - k;
    if ((static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) continue;  // a continuation byte
    if (lead_info(static_cast<uint8_t>(text[start])).length <= 1) return 0;  // ASCII or a byte no sequence starts with
    int subpart = 0;
    const bool prefix = utf8_sequence_length(text, start, &subpart) == 0 && static_cast<size_t>(subpart) == k;
    return prefix ? static_cast<int>(k) : 0;
  }
  return 0;
}

bool utf8_is_valid(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    // ASCII runs dominate real text; skip them eight bytes at a time.
    while (i + 8 <= text.size()) {
      uint64_t word = 0;
      for (int k = 0; k < 8; ++k) word |= static_cast<uint64_t>(static_cast<uint8_t>(text[i + k])) << (8 * k);
      if (word & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= text.size()) break;
    const int n = utf8_sequence_length(text, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string utf8_make_valid(std::string_view text) {
  std::string out;
  out.reserve(text.size() + 8);
  size_t i = 0;
  while (i < text.size()) {
    int subpart = 0;
    const int n = utf8_sequence_length(text, i, &subpart);
    if (n > 0) {
      out.append(text.substr(i, n));
      i += n;
    } else {
      out.append(kReplacementChar);
      i += subpart;
    }
  }
  return out;
}

void utf8_append(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

void Utf8StreamDecoder::push(std::string_view bytes, std::string* out) {
  size_t i = 0;
  // First complete (or reject) a sequence held back from an earlier push.
  while (pending_size_ > 0 && i < bytes.size()) {
    pending_[pending_size_++] = bytes[i++];
    const std::string_view held(pending_, pending_size_);
    int subpart = 0;
    const int n = utf8_sequence_length(held, 0, &subpart);
    if (n > 0) {  // completed
      out->append(held);
      pending_size_ = 0;
    } else if (subpart < pending_size_) {
      // The new byte cannot continue the sequence: the held prefix is one maximal subpart. The bytes after
      // it go back through the general path below.
      out->append(kReplacementChar);
      char rest[4];
      const int rest_size = pending_size_ - subpart;
      for (int k = 0; k < rest_size && k < 4; ++k) rest[k] = pending_[subpart + k];
      pending_size_ = 0;
      push(std::string_view(rest, rest_size), out);
    }
    // else: still a valid prefix, keep holding.
  }
  while (i < bytes.size()) {
    int subpart = 0;
    const int n = utf8_sequence_length(bytes, i, &subpart);
    if (n > 0) {
      // Append the whole run of complete sequences at once.
      size_t j = i + n;
      while (j < bytes.size()) {
        const int m = utf8_sequence_length(bytes, j);
        if (m == 0) break;
        j += m;
      }
      out->append(bytes.substr(i, j - i));
      i = j;
    } else if (i + subpart >= bytes.size() && subpart > 0 && subpart <= 3 &&
               static_cast<uint8_t>(bytes[i]) >= 0xC2 && static_cast<uint8_t>(bytes[i]) <= 0xF4) {
      // A valid prefix cut off by the end of this chunk: hold it.
      for (int k = 0; k < subpart; ++k) pending_[k] = bytes[i + k];
      pending_size_ = subpart;
      i += subpart;
    } else {
      out->append(kReplacementChar);
      i += subpart;
    }
  }
}

void Utf8StreamDecoder::finish(std::string* out) {
  if (pending_size_ > 0) out->append(kReplacementChar);
  pending_size_ = 0;
}

}  // namespace mx
