#include "grammar/grammar.h"

#include <utility>

namespace mx::grammar {

Expr bytes_expr(const ByteSet& set) {
  Expr e;
  e.kind = ExprKind::kBytes;
  e.bytes = set;
  return e;
}

Expr byte_expr(uint8_t b) {
  ByteSet s;
  s.add(b);
  return bytes_expr(s);
}

Expr literal(std::string_view text) {
  std::vector<Expr> items;
  items.reserve(text.size());
  for (char c : text) items.push_back(byte_expr(static_cast<uint8_t>(c)));
  if (items.size() == 1) return std::move(items[0]);
  return seq(std::move(items));
}

Expr rule_ref(int32_t rule) {
  Expr e;
  e.kind = ExprKind::kRule;
  e.rule = rule;
  return e;
}

Expr seq(std::vector<Expr> items) {
  Expr e;
  e.kind = ExprKind::kSeq;
  e.items = std::move(items);
  return e;
}

Expr alt(std::vector<Expr> items) {
  if (items.size() == 1) return std::move(items[0]);
  Expr e;
  e.kind = ExprKind::kAlt;
  e.items = std::move(items);
  return e;
}

Expr repeat(Expr item, int32_t min_count, int32_t max_count) {
  Expr e;
  e.kind = ExprKind::kRepeat;
  e.min_count = min_count;
  e.max_count = max_count;
  e.items.push_back(std::move(item));
  return e;
}

int64_t expr_size(const Expr& e) {
  int64_t n = 1;
  for (const Expr& c : e.items) n += expr_size(c);
  return n;
}

namespace {

constexpr uint32_t kMaxScalar = 0x10FFFF;

int utf8_length(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

void utf8_encode(uint32_t cp, uint8_t out[4]) {
  const int n = utf8_length(cp);
  if (n == 1) {
    out[0] = static_cast<uint8_t>(cp);
    return;
  }
  static constexpr uint8_t kLead[5] = {0, 0, 0xC0, 0xE0, 0xF0};
  for (int i = n - 1; i > 0; --i) {
    out[i] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
    cp >>= 6;
  }
  out[0] = static_cast<uint8_t>(kLead[n] | cp);
}

// [lo, hi] with one encoded length: split until every byte position is an independent range, so the set
// is one sequence of byte ranges (the usual UTF-8 range construction).
void add_same_length(uint32_t lo, uint32_t hi, std::vector<Expr>* out) {
  const int n = utf8_length(lo);
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (uint32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        add_same_length(lo, lo | m, out);
        add_same_length((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        add_same_length(lo, (hi & ~m) - 1, out);
        add_same_length(hi & ~m, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  utf8_encode(lo, a);
  utf8_encode(hi, b);
  std::vector<Expr> parts;
  for (int k = 0; k < n; ++k) {
    ByteSet s;
    s.add_range(a[k], b[k]);
    parts.push_back(bytes_expr(s));
  }
  out->push_back(parts.size() == 1 ? std::move(parts[0]) : seq(std::move(parts)));
}

void add_range(uint32_t lo, uint32_t hi, std::vector<Expr>* out) {
  static constexpr uint32_t kLengthEnds[4] = {0x7F, 0x7FF, 0xFFFF, kMaxScalar};
  hi = hi > kMaxScalar ? kMaxScalar : hi;
  if (lo > hi) return;
  if (lo <= 0xDFFF && hi >= 0xD800) {  // surrogates are not scalar values
    if (lo < 0xD800) add_range(lo, 0xD7FF, out);
    if (hi > 0xDFFF) add_range(0xE000, hi, out);
    return;
  }
  for (uint32_t end : kLengthEnds) {
    if (lo > end) continue;
    if (hi <= end) {
      add_same_length(lo, hi, out);
      return;
    }
    add_same_length(lo, end, out);
    lo = end + 1;
  }
}

}  // namespace

Expr utf8_codepoint_ranges(const std::vector<std::pair<uint32_t, uint32_t>>& ranges) {
  // Single-byte members merge into one byte set; longer encodings stay sequences.
  ByteSet ascii;
  std::vector<Expr> alts;
  for (auto [lo, hi] : ranges) {
    if (lo < 0x80) {
      ascii.add_range(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi < 0x7F ? hi : 0x7F));
      lo = 0x80;
    }
    if (lo <= hi) add_range(lo, hi, &alts);
  }
  if (!ascii.empty()) alts.insert(alts.begin(), bytes_expr(ascii));
  return alt(std::move(alts));
}

int32_t Grammar::add_rule(std::string name) {
  rules.push_back(Rule{std::move(name), empty_expr()});
  return static_cast<int32_t>(rules.size()) - 1;
}

}  // namespace mx::grammar
