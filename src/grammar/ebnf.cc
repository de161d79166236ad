#include "grammar/ebnf.h"

#include <cctype>
#include <map>
#include <string>
#include <vector>

#include "grammar/regex.h"

namespace mx::grammar {

namespace {

bool name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; }

void append_utf8(uint32_t cp, std::string* out) {
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

class EbnfParser {
 public:
  explicit EbnfParser(std::string_view text) : t_(text) {}

  Result<Grammar> run() {
    skip_space();
    while (!at_end()) {
      const std::string name = read_name();
      if (name.empty()) return error("expected a rule name");
      skip_space();
      if (t_.substr(pos_, 3) != "::=") return error("expected '::=' after '" + name + "'");
      pos_ += 3;
      const int32_t rule = rule_index(name);
      if (defined_.count(name)) return error("rule '" + name + "' is defined twice");
      defined_[name] = line_;
      MX_ASSIGN_OR_RETURN(Expr body, parse_alternation());
      g_.rules[rule].body = std::move(body);
      skip_space();
    }
    for (const auto& [name, line] : used_) {
      if (!defined_.count(name)) return invalid_argument("grammar line " + std::to_string(line) + ": rule '" + name + "' is not defined");
    }
    if (!defined_.count("root")) return invalid_argument("grammar has no 'root' rule");
    g_.root = rules_["root"];
    return std::move(g_);
  }

 private:
  Status error(const std::string& what) const {
    return invalid_argument("grammar line " + std::to_string(line_) + ": " + what);
  }
  bool at_end() const { return pos_ >= t_.size(); }

  void skip_space() {
    while (!at_end()) {
      const char c = t_[pos_];
      if (c == '#') {
        while (!at_end() && t_[pos_] != '\n') ++pos_;
      } else if (std::isspace(static_cast<unsigned char>(c))) {
        if (c == '\n') ++line_;
        ++pos_;
      } else {
        break;
      }
    }
  }

  std::string read_name() {
    const size_t start = pos_;
    while (!at_end() && name_char(t_[pos_])) ++pos_;
    return std::string(t_.substr(start, pos_ - start));
  }

  int32_t rule_index(const std::string& name) {
    auto it = rules_.find(name);
    if (it != rules_.end()) return it->second;
    const int32_t r = g_.add_rule(name);
    rules_[name] = r;
    return r;
  }

  // Is the text at pos_ the start of the next rule (`name ::=`)?
  bool at_rule_start() const {
    size_t p = pos_;
    while (p < t_.size() && name_char(t_[p])) ++p;
    if (p == pos_) return false;
    while (p < t_.size() && (t_[p] == ' ' || t_[p] == '\t' || t_[p] == '\n' || t_[p] == '\r')) ++p;
    return t_.substr(p, 3) == "::=";
  }

  Result<Expr> parse_alternation() {
    std::vector<Expr> alts;
    while (true) {
      MX_ASSIGN_OR_RETURN(Expr e, parse_sequence());
      alts.push_back(std::move(e));
      skip_space();
      if (at_end() || t_[pos_] != '|') break;
      ++pos_;
    }
    return alt(std::move(alts));
  }

  Result<Expr> parse_sequence() {
    std::vector<Expr> items;
    while (true) {
      skip_space();
      if (at_end() || t_[pos_] == '|' || t_[pos_] == ')' || at_rule_start()) break;
      MX_ASSIGN_OR_RETURN(Expr atom, parse_atom());
      MX_ASSIGN_OR_RETURN(Expr q, parse_quantifier(std::move(atom)));
      items.push_back(std::move(q));
    }
    if (items.size() == 1) return std::move(items[0]);
    return seq(std::move(items));
  }

  Result<int32_t> read_count() {
    skip_space();
    int64_t v = 0;
    const size_t start = pos_;
    while (!at_end() && std::isdigit(static_cast<unsigned char>(t_[pos_]))) {
      v = v * 10 + (t_[pos_++] - '0');
      if (v > 100000) return error("repetition count above 100000");
    }
    if (pos_ == start) return error("expected a number in {}");
    skip_space();
    return static_cast<int32_t>(v);
  }

  Result<Expr> parse_quantifier(Expr atom) {
    while (!at_end()) {
      const char c = t_[pos_];
      if (c == '*' || c == '+' || c == '?') {
        ++pos_;
        atom = repeat(std::move(atom), c == '+' ? 1 : 0, c == '?' ? 1 : -1);
      } else if (c == '{') {
        ++pos_;
        MX_ASSIGN_OR_RETURN(int32_t lo, read_count());
        int32_t hi = lo;
        if (!at_end() && t_[pos_] == ',') {
          ++pos_;
          skip_space();
          hi = -1;
          if (!at_end() && t_[pos_] != '}') {
            MX_ASSIGN_OR_RETURN(hi, read_count());
          }
        }
        if (at_end() || t_[pos_] != '}') return error("unterminated {m,n}");
        ++pos_;
        if (hi >= 0 && hi < lo) return error("{m,n} with n < m");
        atom = repeat(std::move(atom), lo, hi);
      } else {
        break;
      }
    }
    return atom;
  }

  Result<uint32_t> read_hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (at_end() || !std::isxdigit(static_cast<unsigned char>(t_[pos_]))) return error("bad hex escape");
      const char c = t_[pos_++];
      v = v * 16 + (c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    return v;
  }

  Result<Expr> parse_literal() {
    std::string bytes;
    ++pos_;  // the opening quote
    while (true) {
      if (at_end() || t_[pos_] == '\n') return error("unterminated string literal");
      const char c = t_[pos_++];
      if (c == '"') break;
      if (c != '\\') {
        bytes.push_back(c);
        continue;
      }
      if (at_end()) return error("unterminated string literal");
      const char e = t_[pos_++];
      switch (e) {
        case 'n': bytes.push_back('\n'); break;
        case 't': bytes.push_back('\t'); break;
        case 'r': bytes.push_back('\r'); break;
        case '\\': bytes.push_back('\\'); break;
        case '"': bytes.push_back('"'); break;
        case '\'': bytes.push_back('\''); break;
        case 'x': {
          MX_ASSIGN_OR_RETURN(uint32_t v, read_hex(2));
          bytes.push_back(static_cast<char>(v));
          break;
        }
        case 'u': {
          MX_ASSIGN_OR_RETURN(uint32_t v, read_hex(4));
          append_utf8(v, &bytes);
          break;
        }
        default: return error(std::string("unknown escape \\") + e + " in a literal");
      }
    }
    return literal(bytes);
  }

  Result<Expr> parse_atom() {
    const char c = t_[pos_];
    if (c == '"') return parse_literal();
    if (c == '(') {
      ++pos_;
      MX_ASSIGN_OR_RETURN(Expr inner, parse_alternation());
      skip_space();
      if (at_end() || t_[pos_] != ')') return error("missing ')'");
      ++pos_;
      return inner;
    }
    if (c == '[') {
      size_t end = pos_ + 1;
      if (end < t_.size() && t_[end] == '^') ++end;
      if (end < t_.size() && t_[end] == ']') ++end;  // a leading ']' is a member
      while (end < t_.size() && t_[end] != ']') end += t_[end] == '\\' ? 2 : 1;
      if (end >= t_.size()) return error("unterminated character class");
      auto cls = parse_regex(t_.substr(pos_, end + 1 - pos_));
      if (!cls.is_ok()) return error(cls.status().message());
      pos_ = end + 1;
      return std::move(cls).value();
    }
    if (c == '.') {
      ++pos_;
      return utf8_codepoint_ranges({{0, 0x10FFFF}});
    }
    if (name_char(c)) {
      const std::string name = read_name();
      used_.emplace(name, line_);
      return rule_ref(rule_index(name));
    }
    return error(std::string("unexpected '") + c + "'");
  }

  std::string_view t_;
  size_t pos_ = 0;
  int line_ = 1;
  Grammar g_;
  std::map<std::string, int32_t> rules_;
  std::map<std::string, int> defined_, used_;
};

}  // namespace

Result<Grammar> parse_ebnf(std::string_view text) { return EbnfParser(text).run(); }

}  // namespace mx::grammar
