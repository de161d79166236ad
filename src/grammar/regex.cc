// A recursive-descent parser: alternation > concatenation > quantified atom. Characters are decoded
// from UTF-8 and kept as code point range sets until an atom is emitted, so negated classes and \W work
// over all of Unicode, not over bytes.
#include "grammar/regex.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <utility>
#include <vector>

namespace mx::grammar {

namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;
constexpr uint32_t kMaxCodepoint = 0x10FFFF;
constexpr int32_t kMaxRepeat = 100000;  // larger counts are refused (the compile limit would refuse them anyway)

Ranges normalized(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (auto [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.emplace_back(lo, hi);
    }
  }
  return out;
}

Ranges complement(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (auto [lo, hi] : normalized(r)) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodepoint) out.emplace_back(next, kMaxCodepoint);
  return out;
}

Ranges subtract(const Ranges& a, const Ranges& b) {
  Ranges keep = complement(b), out;
  for (auto [alo, ahi] : normalized(a)) {
    for (auto [klo, khi] : keep) {
      const uint32_t lo = std::max(alo, klo), hi = std::min(ahi, khi);
      if (lo <= hi) out.emplace_back(lo, hi);
    }
  }
  return out;
}

const Ranges kDigit{{'0', '9'}};
const Ranges kWord{{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace{{'\t', '\r'}, {' ', ' '}};
const Ranges kJsonEscaped{{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};

class RegexParser {
 public:
  RegexParser(std::string_view p, const RegexOptions& o) : p_(p), options_(o) {}

  Result<Expr> parse() {
    if (!p_.empty() && p_[0] == '^') ++pos_;
    MX_ASSIGN_OR_RETURN(Expr e, parse_alternation());
    if (pos_ < p_.size()) return error(p_[pos_] == ')' ? "unbalanced ')'" : "unexpected character");
    return e;
  }

 private:
  Status error(const std::string& what) const {
    return invalid_argument("regex '" + std::string(p_) + "': " + what + " at offset " + std::to_string(pos_));
  }
  bool at_end() const { return pos_ >= p_.size(); }
  char peek() const { return p_[pos_]; }

  Result<Expr> parse_alternation() {
    std::vector<Expr> alts;
    while (true) {
      MX_ASSIGN_OR_RETURN(Expr e, parse_concatenation());
      alts.push_back(std::move(e));
      if (at_end() || peek() != '|') break;
      ++pos_;
    }
    return alt(std::move(alts));
  }

  Result<Expr> parse_concatenation() {
    std::vector<Expr> items;
    while (!at_end() && peek() != '|' && peek() != ')') {
      if (peek() == '$' && pos_ + 1 == p_.size()) {  // the trailing anchor: the match is whole anyway
        ++pos_;
        break;
      }
      MX_ASSIGN_OR_RETURN(Expr atom, parse_atom());
      MX_ASSIGN_OR_RETURN(Expr q, parse_quantifier(std::move(atom)));
      items.push_back(std::move(q));
    }
    if (items.size() == 1) return std::move(items[0]);
    return seq(std::move(items));
  }

  Result<int32_t> parse_count() {
    if (at_end() || peek() < '0' || peek() > '9') return error("expected a number in {}");
    int64_t v = 0;
    while (!at_end() && peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > kMaxRepeat) return error("repetition count above " + std::to_string(kMaxRepeat));
      ++pos_;
    }
    return static_cast<int32_t>(v);
  }

  Result<Expr> parse_quantifier(Expr atom) {
    while (!at_end()) {
      int32_t lo, hi;
      const char c = peek();
      if (c == '*') {
        lo = 0, hi = -1, ++pos_;
      } else if (c == '+') {
        lo = 1, hi = -1, ++pos_;
      } else if (c == '?') {
        lo = 0, hi = 1, ++pos_;
      } else if (c == '{') {
        ++pos_;
        MX_ASSIGN_OR_RETURN(lo, parse_count());
        hi = lo;
        if (!at_end() && peek() == ',') {
          ++pos_;
          hi = -1;
          if (!at_end() && peek() != '}') {
            MX_ASSIGN_OR_RETURN(hi, parse_count());
          }
        }
        if (at_end() || peek() != '}') return error("unterminated {m,n}");
        ++pos_;
        if (hi >= 0 && hi < lo) return error("{m,n} with n < m");
      } else {
        break;
      }
      if (!at_end() && (peek() == '?' || peek() == '+')) ++pos_;  // lazy / possessive: same language
      atom = repeat(std::move(atom), lo, hi);
    }
    return atom;
  }

  Expr chars(const Ranges& r) const {
    return utf8_codepoint_ranges(options_.json_string_safe ? subtract(r, kJsonEscaped) : normalized(r));
  }

  // One UTF-8 encoded code point of the pattern.
  Result<uint32_t> next_codepoint() {
    const uint8_t b = static_cast<uint8_t>(p_[pos_]);
    const int n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (n == 0 || pos_ + n > p_.size()) return error("invalid UTF-8");
    uint32_t cp = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
    for (int i = 1; i < n; ++i) cp = (cp << 6) | (static_cast<uint8_t>(p_[pos_ + i]) & 0x3F);
    pos_ += n;
    return cp;
  }

  Result<uint32_t> parse_hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (at_end() || !std::isxdigit(static_cast<unsigned char>(peek()))) return error("bad hex escape");
      const char c = peek();
      v = v * 16 + (c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
      ++pos_;
    }
    return v;
  }

  // After a backslash: a class (\d ...) or one code point.
  Result<Ranges> parse_escape() {
    if (at_end()) return error("trailing backslash");
    const char c = peek();
    ++pos_;
    switch (c) {
      case 'd': return kDigit;
      case 'D': return complement(kDigit);
      case 'w': return kWord;
      case 'W': return complement(kWord);
      case 's': return kSpace;
      case 'S': return complement(kSpace);
      case 'n': return Ranges{{'\n', '\n'}};
      case 't': return Ranges{{'\t', '\t'}};
      case 'r': return Ranges{{'\r', '\r'}};
      case 'f': return Ranges{{'\f', '\f'}};
      case 'v': return Ranges{{'\v', '\v'}};
      case '0': return Ranges{{0, 0}};
      case 'x': {
        MX_ASSIGN_OR_RETURN(uint32_t v, parse_hex(2));
        return Ranges{{v, v}};
      }
      case 'u': {
        uint32_t v = 0;
        if (!at_end() && peek() == '{') {
          ++pos_;
          const size_t start = pos_;
          while (!at_end() && peek() != '}') ++pos_;
          if (at_end() || pos_ == start || pos_ - start > 6) return error("bad \\u{...} escape");
          pos_ = start;
          MX_ASSIGN_OR_RETURN(v, parse_hex(static_cast<int>(p_.find('}', start) - start)));
          ++pos_;
        } else {
          MX_ASSIGN_OR_RETURN(v, parse_hex(4));
        }
        if (v > kMaxCodepoint) return error("code point above U+10FFFF");
        return Ranges{{v, v}};
      }
      case 'b':
      case 'B': return error("word boundaries (\\b, \\B) are not supported");
      default: break;
    }
    if (c >= '1' && c <= '9') return error("back-references are not supported");
    if (std::isalnum(static_cast<unsigned char>(c))) return error(std::string("unknown escape \\") + c);
    --pos_;
    MX_ASSIGN_OR_RETURN(uint32_t cp, next_codepoint());
    return Ranges{{cp, cp}};
  }

  Result<Expr> parse_class() {
    bool negated = false;
    if (!at_end() && peek() == '^') {
      negated = true;
      ++pos_;
    }
    Ranges set;
    bool first = true;
    while (true) {
      if (at_end()) return error("unterminated character class");
      if (peek() == ']' && !first) {
        ++pos_;
        break;
      }
      first = false;
      Ranges item;
      if (peek() == '[' && pos_ + 1 < p_.size() && p_[pos_ + 1] == ':') return error("POSIX classes are not supported");
      if (peek() == '\\') {
        ++pos_;
        MX_ASSIGN_OR_RETURN(item, parse_escape());
      } else {
        MX_ASSIGN_OR_RETURN(uint32_t cp, next_codepoint());
        item = {{cp, cp}};
      }
      // A range a-b (a '-' before ']' is literal).
      if (item.size() == 1 && item[0].first == item[0].second && pos_ + 1 < p_.size() && peek() == '-' &&
          p_[pos_ + 1] != ']') {
        ++pos_;
        Ranges end;
        if (peek() == '\\') {
          ++pos_;
          MX_ASSIGN_OR_RETURN(end, parse_escape());
        } else {
          MX_ASSIGN_OR_RETURN(uint32_t cp, next_codepoint());
          end = {{cp, cp}};
        }
        if (end.size() != 1 || end[0].first != end[0].second) return error("a class range must end in one character");
        if (end[0].first < item[0].first) return error("class range out of order");
        item = {{item[0].first, end[0].first}};
      }
      set.insert(set.end(), item.begin(), item.end());
    }
    return chars(negated ? complement(set) : set);
  }

  Result<Expr> parse_atom() {
    const char c = peek();
    switch (c) {
      case '(': {
        ++pos_;
        if (!at_end() && peek() == '?') {
          ++pos_;
          if (!at_end() && peek() == ':') {
            ++pos_;
          } else if (!at_end() && (peek() == '<' || peek() == 'P') && pos_ + 1 < p_.size() && p_[pos_ + 1] != '=' &&
                     p_[pos_ + 1] != '!') {
            const size_t close = p_.find('>', pos_);
            if (close == std::string_view::npos) return error("unterminated group name");
            pos_ = close + 1;
          } else {
            return error("lookaround and inline flags are not supported");
          }
        }
        MX_ASSIGN_OR_RETURN(Expr inner, parse_alternation());
        if (at_end() || peek() != ')') return error("missing ')'");
        ++pos_;
        return inner;
      }
      case '[':
        ++pos_;
        return parse_class();
      case '.':
        ++pos_;
        return chars(complement(Ranges{{'\n', '\n'}}));
      case '\\': {
        ++pos_;
        MX_ASSIGN_OR_RETURN(Ranges r, parse_escape());
        return chars(r);
      }
      case '*':
      case '+':
      case '?':
      case '{': return error("quantifier without a preceding atom");
      case '^': return error("'^' is supported only at the start");
      case '$': return error("'$' is supported only at the end");
      default: break;
    }
    MX_ASSIGN_OR_RETURN(uint32_t cp, next_codepoint());
    return chars(Ranges{{cp, cp}});
  }

  std::string_view p_;
  RegexOptions options_;
  size_t pos_ = 0;
};

}  // namespace

Result<Expr> parse_regex(std::string_view pattern, const RegexOptions& options) {
  return RegexParser(pattern, options).parse();
}

Result<Grammar> regex_grammar(std::string_view pattern) {
  MX_ASSIGN_OR_RETURN(Expr e, parse_regex(pattern));
  Grammar g;
  g.root = g.add_rule("root");
  g.rules[g.root].body = std::move(e);
  return g;
}

}  // namespace mx::grammar
