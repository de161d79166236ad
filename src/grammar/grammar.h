// The one grammar representation every constraint compiles to (JSON Schema, any-JSON, regular expressions,
// EBNF text): named rules whose bodies are expressions over byte sets, rule references, sequences,
// alternatives and bounded or unbounded repetition. Bytes, not characters: tokens are byte strings, and
// UTF-8 is spelled out as byte sequences by the front ends (utf8_codepoint_ranges). The automaton
// (automaton.h) compiles this to a byte-level pushdown automaton; nothing here runs a match.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mx::grammar {

// A set of byte values (256 bits).
struct ByteSet {
  std::array<uint64_t, 4> bits{};

  void add(uint8_t b) { bits[b >> 6] |= uint64_t{1} << (b & 63); }
  void add_range(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) add(static_cast<uint8_t>(b));
  }
  bool has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  bool empty() const { return (bits[0] | bits[1] | bits[2] | bits[3]) == 0; }
};

enum class ExprKind { kBytes, kRule, kSeq, kAlt, kRepeat };

// kBytes: one byte from `bytes`. kRule: the rule `rule`. kSeq / kAlt: `items` in order / any one of them
// (an empty kSeq matches the empty string; an empty kAlt matches nothing). kRepeat: items[0] between
// min_count and max_count times (max_count < 0: unbounded).
struct Expr {
  ExprKind kind = ExprKind::kSeq;
  ByteSet bytes;
  int32_t rule = -1;
  int32_t min_count = 0;
  int32_t max_count = 0;
  std::vector<Expr> items;
};

Expr bytes_expr(const ByteSet& set);
Expr byte_expr(uint8_t b);
Expr literal(std::string_view text);  // the bytes of `text` in order
Expr rule_ref(int32_t rule);
Expr seq(std::vector<Expr> items);
Expr alt(std::vector<Expr> items);
Expr repeat(Expr item, int32_t min_count, int32_t max_count);
inline Expr optional(Expr item) { return repeat(std::move(item), 0, 1); }
inline Expr empty_expr() { return seq({}); }
// The number of nodes in the expression tree (a size bound for compile limits).
int64_t expr_size(const Expr& e);

// A UTF-8 scalar value in [lo, hi] (surrogates excluded) as an alternative of byte-sequence expressions.
Expr utf8_codepoint_ranges(const std::vector<std::pair<uint32_t, uint32_t>>& ranges);

struct Rule {
  std::string name;
  Expr body;
};

// A grammar: rules by index; `root` is what a whole output must match.
struct Grammar {
  std::vector<Rule> rules;
  int32_t root = -1;

  // Adds a rule with an empty body (filled later: rules may refer to each other) and returns its index.
  int32_t add_rule(std::string name);
};

}  // namespace mx::grammar
