// Each subschema becomes an expression inlined where it is used, so most rules have one call site and
// the token-mask cache can decide tokens that run past the end of a value (grammar_matcher.h). Rules are
// made only where sharing is needed: $ref targets (recursion), the any-value grammar, and array items
// whose unrolled copies would be large.
#include "grammar/json_schema.h"

#include <cctype>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "grammar/regex.h"

namespace mx::grammar {

namespace {

using nlohmann::json;

constexpr int kMaxDepth = 64;
constexpr int64_t kInlineItemBudget = 4000;  // expression nodes an array may unroll before items become a rule
constexpr double kMaxExactBound = 9007199254740992.0;  // 2^53: larger bounds are treated as absent

const std::set<std::string> kAnnotations = {"title",      "description", "default",  "examples", "$schema",
                                            "$id",        "$comment",    "deprecated", "readOnly", "writeOnly",
                                            "$defs",      "definitions", "strict",   "name",     "discriminator",
                                            "$anchor"};
const std::set<std::string> kKnown = {"type",      "enum",      "const",     "anyOf",    "oneOf",   "allOf",
                                      "$ref",      "nullable",  "properties", "required", "additionalProperties",
                                      "items",     "minItems",  "maxItems",  "pattern",  "format",  "minLength",
                                      "maxLength", "minimum",   "maximum",   "exclusiveMinimum", "exclusiveMaximum",
                                      "multipleOf"};

// Digits of unsigned values with equal length, lo <= hi: the usual range-to-pattern split.
Expr same_length_range(const std::string& lo, const std::string& hi) {
  if (lo.empty()) return empty_expr();
  auto digit_set = [](char a, char b) {
    ByteSet s;
    s.add_range(static_cast<uint8_t>(a), static_cast<uint8_t>(b));
    return bytes_expr(s);
  };
  const std::string rest_lo = lo.substr(1), rest_hi = hi.substr(1);
  if (lo[0] == hi[0]) return seq({digit_set(lo[0], lo[0]), same_length_range(rest_lo, rest_hi)});
  const std::string zeros(rest_lo.size(), '0'), nines(rest_lo.size(), '9');
  auto any_digits = [&] { return repeat(digit_set('0', '9'), static_cast<int32_t>(rest_lo.size()), static_cast<int32_t>(rest_lo.size())); };
  std::vector<Expr> alts;
  char first_full = lo[0], last_full = hi[0];
  if (rest_lo != zeros) {
    alts.push_back(seq({digit_set(lo[0], lo[0]), same_length_range(rest_lo, nines)}));
    ++first_full;
  }
  if (rest_hi != nines) --last_full;
  if (first_full <= last_full) alts.push_back(seq({digit_set(first_full, last_full), any_digits()}));
  if (rest_hi != nines) alts.push_back(seq({digit_set(hi[0], hi[0]), same_length_range(zeros, rest_hi)}));
  return alt(std::move(alts));
}

// Decimal integers (no sign, no leading zeros) in [lo, hi]; hi absent: unbounded.
Expr unsigned_range(uint64_t lo, std::optional<uint64_t> hi) {
  std::vector<Expr> alts;
  const std::string lo_s = std::to_string(lo);
  const size_t max_len = hi ? std::to_string(*hi).size() : lo_s.size();
  for (size_t len = lo_s.size(); len <= max_len; ++len) {
    std::string band_lo(len, '0');
    if (len == lo_s.size()) {
      band_lo = lo_s;
    } else {
      band_lo[0] = '1';
    }
    const std::string band_hi = hi && len == max_len ? std::to_string(*hi) : std::string(len, '9');
    alts.push_back(same_length_range(band_lo, band_hi));
  }
  if (!hi) {  // any longer number
    ByteSet nonzero, digit;
    nonzero.add_range('1', '9');
    digit.add_range('0', '9');
    const int32_t n = static_cast<int32_t>(lo_s.size());
    alts.push_back(seq({bytes_expr(nonzero), repeat(bytes_expr(digit), n, -1)}));
  }
  return alt(std::move(alts));
}

uint64_t magnitude(int64_t v) { return v < 0 ? static_cast<uint64_t>(-(v + 1)) + 1 : static_cast<uint64_t>(v); }

// Integers in [lo, hi] (either side absent: unbounded); nullopt when the range is empty.
std::optional<Expr> integer_range(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  if (lo && hi && *lo > *hi) return std::nullopt;
  std::vector<Expr> alts;
  if (!hi || *hi >= 0) alts.push_back(unsigned_range(lo && *lo > 0 ? static_cast<uint64_t>(*lo) : 0,
                                                     hi ? std::optional<uint64_t>(static_cast<uint64_t>(*hi)) : std::nullopt));
  if (!lo || *lo < 0) {
    const uint64_t min_mag = hi && *hi < 0 ? magnitude(*hi) : 1;
    alts.push_back(seq({byte_expr('-'), unsigned_range(min_mag, lo ? std::optional<uint64_t>(magnitude(*lo)) : std::nullopt)}));
  }
  return alt(std::move(alts));
}

Expr digits(int32_t min_count, int32_t max_count) {
  ByteSet d;
  d.add_range('0', '9');
  return repeat(bytes_expr(d), min_count, max_count);
}

Expr fraction() { return seq({byte_expr('.'), digits(1, 15)}); }

Expr unbounded_number() {
  ByteSet e, sign;
  e.add('e');
  e.add('E');
  sign.add('+');
  sign.add('-');
  Expr exponent = seq({bytes_expr(e), optional(bytes_expr(sign)), digits(1, 3)});
  return seq({optional(byte_expr('-')), unsigned_range(0, std::nullopt), optional(fraction()), optional(std::move(exponent))});
}

class SchemaCompiler {
 public:
  SchemaCompiler(const json& root, const JsonSchemaOptions& options) : root_(root), quote_(options.string_quote) {}

  Result<Grammar> run() {
    g_.root = g_.add_rule("root");
    MX_ASSIGN_OR_RETURN(Expr body, compile(root_, "#", 0));
    g_.rules[g_.root].body = std::move(body);
    return std::move(g_);
  }

  // The any-value rules, made once.
  int32_t any_value_rule() {
    if (any_value_ >= 0) return any_value_;
    any_value_ = g_.add_rule("any_value");
    const int32_t object = g_.add_rule("any_object"), array = g_.add_rule("any_array");
    Expr member = seq({any_key(), byte_expr(':'), ws(), rule_ref(any_value_)});
    Expr member2 = seq({any_key(), byte_expr(':'), ws(), rule_ref(any_value_)});
    g_.rules[object].body = seq({byte_expr('{'),
                                 optional(seq({std::move(member), repeat(seq({byte_expr(','), ws(), std::move(member2)}), 0, -1)})),
                                 byte_expr('}')});
    g_.rules[array].body =
        seq({byte_expr('['),
             optional(seq({rule_ref(any_value_), repeat(seq({byte_expr(','), ws(), rule_ref(any_value_)}), 0, -1)})),
             byte_expr(']')});
    g_.rules[any_value_].body = alt({rule_ref(object), rule_ref(array), string_expr(0, -1), unbounded_number(),
                                     literal("true"), literal("false"), literal("null")});
    any_object_ = object;
    return any_value_;
  }
  int32_t any_object_rule() {
    any_value_rule();
    return any_object_;
  }
  Grammar take() { return std::move(g_); }
  Grammar& grammar() { return g_; }

  // A string of min..max characters (max < 0: unbounded).
  Expr string_expr(int32_t min_len, int32_t max_len) const {
    if (quoted()) {  // raw text between the quotes: tab, newline and every code point from U+0020
      Expr ch = utf8_codepoint_ranges({{0x09, 0x0A}, {0x20, 0x10FFFF}});
      return seq({literal(quote_), repeat(std::move(ch), min_len, max_len), literal(quote_)});
    }
    ByteSet escapable, hex, hex_no_d, low_hex;
    for (char c : std::string("\"\\/bfnrt")) escapable.add(static_cast<uint8_t>(c));
    hex.add_range('0', '9'), hex.add_range('a', 'f'), hex.add_range('A', 'F');
    hex_no_d.add_range('0', '9'), hex_no_d.add_range('a', 'c'), hex_no_d.add_range('e', 'f');
    hex_no_d.add_range('A', 'C'), hex_no_d.add_range('E', 'F');
    low_hex.add_range('0', '7');
    ByteSet d;
    d.add('d'), d.add('D');
    // \uXXXX outside the surrogates: every escape is one code point, so lengths count right.
    Expr unicode = seq({literal("\\u"), alt({seq({bytes_expr(hex_no_d), repeat(bytes_expr(hex), 3, 3)}),
                                            seq({bytes_expr(d), bytes_expr(low_hex), repeat(bytes_expr(hex), 2, 2)})})});
    Expr ch = alt({utf8_codepoint_ranges({{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x10FFFF}}),
                   seq({byte_expr('\\'), bytes_expr(escapable)}), std::move(unicode)});
    return seq({byte_expr('"'), repeat(std::move(ch), min_len, max_len), byte_expr('"')});
  }

 private:
  bool quoted() const { return !quote_.empty(); }
  // One optional space after ',' and ':' in JSON; none in the quoted notation (as its template writes it).
  Expr ws() const { return quoted() ? empty_expr() : optional(byte_expr(' ')); }

  static bool bare_word(const std::string& key) {
    if (key.empty()) return false;
    for (char c : key)
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
    return true;
  }
  // A fixed value spelled in the output notation (const, enum, keys).
  std::string value_text(const json& v) const {
    if (!quoted()) return v.dump();
    if (v.is_string()) return quote_ + v.get<std::string>() + quote_;
    std::string out;
    if (v.is_object()) {
      out = "{";
      for (const auto& [key, item] : v.items()) out += (out.size() > 1 ? "," : "") + key_text(key) + ":" + value_text(item);
      return out + "}";
    }
    if (v.is_array()) {
      out = "[";
      for (const json& item : v) out += (out.size() > 1 ? "," : "") + value_text(item);
      return out + "]";
    }
    return v.dump();
  }
  std::string key_text(const std::string& key) const {
    if (quoted() && bare_word(key)) return key;
    return value_text(json(key));
  }
  // The key of a member of an object whose keys the schema does not name.
  Expr any_key() const {
    if (!quoted()) return string_expr(0, -1);
    ByteSet word;
    word.add_range('a', 'z'), word.add_range('A', 'Z'), word.add_range('0', '9'), word.add('_');
    return repeat(bytes_expr(word), 1, -1);
  }

  Status error(const std::string& where, const std::string& what) const {
    return invalid_argument("JSON schema at '" + where + "': " + what);
  }

  Result<const json*> resolve(const std::string& ref, const std::string& where) const {
    if (ref.empty() || ref[0] != '#') return error(where, "$ref '" + ref + "' is not a local reference (#/...)");
    try {
      const json::json_pointer ptr(ref.substr(1));
      if (!root_.contains(ptr)) return error(where, "$ref '" + ref + "' points to nothing");
      return &root_.at(ptr);
    } catch (const json::exception&) {
      return error(where, "$ref '" + ref + "' is not a valid JSON pointer");
    }
  }

  Result<Expr> ref_expr(const std::string& ref, const std::string& where) {
    auto it = ref_rules_.find(ref);
    if (it != ref_rules_.end()) return rule_ref(it->second);
    MX_ASSIGN_OR_RETURN(const json* target, resolve(ref, where));
    const int32_t rule = g_.add_rule("ref " + ref);
    ref_rules_[ref] = rule;
    MX_ASSIGN_OR_RETURN(Expr body, compile(*target, ref, 0));
    g_.rules[rule].body = std::move(body);
    return rule_ref(rule);
  }

  Result<Expr> compile(const json& s, const std::string& where, int depth) {
    if (depth > kMaxDepth) return error(where, "nested deeper than " + std::to_string(kMaxDepth) + " levels");
    if (s.is_boolean()) {
      if (!s.get<bool>()) return error(where, "the schema 'false' allows no value");
      return rule_ref(any_value_rule());
    }
    if (!s.is_object()) return error(where, "a schema must be an object or a boolean");
    for (const auto& [key, value] : s.items()) {
      if (kAnnotations.count(key) == 0 && kKnown.count(key) == 0) return error(where, "unsupported keyword '" + key + "'");
    }
    if (s.contains("nullable") && s["nullable"].is_boolean() && s["nullable"].get<bool>()) {
      json rest = s;
      rest.erase("nullable");
      MX_ASSIGN_OR_RETURN(Expr inner, compile(rest, where, depth + 1));
      return alt({std::move(inner), literal("null")});
    }
    if (s.contains("$ref")) {
      if (!s["$ref"].is_string()) return error(where, "$ref must be a string");
      MX_RETURN_IF_ERROR(only_annotations_besides(s, {"$ref"}, where));
      return ref_expr(s["$ref"].get<std::string>(), where);
    }
    if (s.contains("const")) return literal(value_text(s["const"]));
    if (s.contains("enum")) return enum_expr(s, where);
    for (const char* combiner : {"anyOf", "oneOf"}) {
      if (!s.contains(combiner)) continue;
      const json& list = s[combiner];
      if (!list.is_array() || list.empty()) return error(where, std::string(combiner) + " must be a non-empty array");
      MX_RETURN_IF_ERROR(only_annotations_besides(s, {combiner}, where));
      std::vector<Expr> alts;
      for (size_t i = 0; i < list.size(); ++i) {
        MX_ASSIGN_OR_RETURN(Expr e, compile(list[i], where + "/" + combiner + "/" + std::to_string(i), depth + 1));
        alts.push_back(std::move(e));
      }
      return alt(std::move(alts));
    }
    if (s.contains("allOf")) {
      const json& list = s["allOf"];
      if (!list.is_array() || list.size() != 1) return error(where, "allOf is supported with exactly one schema");
      MX_RETURN_IF_ERROR(only_annotations_besides(s, {"allOf"}, where));
      return compile(list[0], where + "/allOf/0", depth + 1);
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const json& x : t) {
          if (!x.is_string()) return error(where, "type must be a string or an array of strings");
          types.push_back(x.get<std::string>());
        }
      } else {
        return error(where, "type must be a string or an array of strings");
      }
    } else if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) {
      types.push_back("object");
    } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
      types.push_back("array");
    } else if (s.contains("pattern") || s.contains("format") || s.contains("minLength") || s.contains("maxLength")) {
      types.push_back("string");
    } else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
               s.contains("exclusiveMaximum")) {
      types.push_back("number");
    } else {
      return rule_ref(any_value_rule());
    }
    std::vector<Expr> alts;
    for (const std::string& type : types) {
      MX_ASSIGN_OR_RETURN(Expr e, typed(s, type, where, depth));
      alts.push_back(std::move(e));
    }
    return alt(std::move(alts));
  }

  Status only_annotations_besides(const json& s, std::set<std::string> allowed, const std::string& where) const {
    for (const auto& [key, value] : s.items()) {
      if (allowed.count(key) == 0 && kAnnotations.count(key) == 0) {
        return error(where, "'" + key + "' beside '" + *allowed.begin() + "' is not supported");
      }
    }
    return Status::ok();
  }

  Result<Expr> enum_expr(const json& s, const std::string& where) {
    const json& values = s["enum"];
    if (!values.is_array() || values.empty()) return error(where, "enum must be a non-empty array");
    std::vector<Expr> alts;
    for (const json& v : values) alts.push_back(literal(value_text(v)));
    return alt(std::move(alts));
  }

  Result<Expr> typed(const json& s, const std::string& type, const std::string& where, int depth) {
    if (type == "string") return string_schema(s, where);
    if (type == "integer") return number_schema(s, where, true);
    if (type == "number") return number_schema(s, where, false);
    if (type == "boolean") return alt({literal("true"), literal("false")});
    if (type == "null") return literal("null");
    if (type == "object") return object_schema(s, where, depth);
    if (type == "array") return array_schema(s, where, depth);
    return error(where, "unknown type '" + type + "'");
  }

  Result<int32_t> count_field(const json& s, const char* key, int32_t fallback, const std::string& where) const {
    if (!s.contains(key)) return fallback;
    const json& v = s[key];
    if (!v.is_number_integer() && !(v.is_number_float() && std::floor(v.get<double>()) == v.get<double>())) {
      return error(where, std::string(key) + " must be a non-negative integer");
    }
    const double d = v.get<double>();
    if (d < 0) return error(where, std::string(key) + " must be a non-negative integer");
    if (d > 100000) return error(where, std::string(key) + " above 100000 is not supported");
    return static_cast<int32_t>(d);
  }

  Result<Expr> string_schema(const json& s, const std::string& where) {
    MX_ASSIGN_OR_RETURN(int32_t min_len, count_field(s, "minLength", 0, where));
    MX_ASSIGN_OR_RETURN(int32_t max_len, count_field(s, "maxLength", -1, where));
    if (max_len >= 0 && max_len < min_len) return error(where, "maxLength below minLength");
    const bool has_length = s.contains("minLength") || s.contains("maxLength");
    std::string pattern;
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) return error(where, "pattern must be a string");
      pattern = s["pattern"].get<std::string>();
    } else if (s.contains("format")) {
      if (!s["format"].is_string()) return error(where, "format must be a string");
      const std::string format = s["format"].get<std::string>();
      pattern = format_pattern(format);
      if (pattern.empty()) return error(where, "format '" + format + "' is not supported");
    }
    if (pattern.empty()) return string_expr(min_len, max_len);
    if (has_length) return error(where, "minLength/maxLength together with pattern or format is not supported");
    RegexOptions options;
    options.json_string_safe = true;
    auto body = parse_regex(pattern, options);
    if (!body.is_ok()) return error(where, body.status().message());
    const std::string quote = quoted() ? quote_ : "\"";
    return seq({literal(quote), std::move(body).value(), literal(quote)});
  }

  static std::string format_pattern(const std::string& format) {
    static const std::map<std::string, std::string> kFormats = {
        // Days up to 28 in every month: every date written is a real one.
        {"date", "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])"},
        {"time", "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"},
        {"date-time",
         "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?"
         "(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"},
        {"duration", "P(([0-9]{1,4}Y)?([0-9]{1,4}M)?[0-9]{1,4}D(T[0-9]{1,4}H([0-9]{1,4}M)?([0-9]{1,4}S)?)?|[0-9]{1,4}W)"},
        {"email", "[a-zA-Z0-9_+-]{1,32}(\\.[a-zA-Z0-9_+-]{1,32}){0,3}@([a-zA-Z0-9]([a-zA-Z0-9-]{0,30}[a-zA-Z0-9])?\\.){1,3}[a-zA-Z]{2,8}"},
        {"hostname", "[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(\\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?){0,2}"},
        {"ipv4", "((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"},
        {"ipv6", "([0-9a-f]{1,4}:){7}[0-9a-f]{1,4}"},
        {"uuid", "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"},
    };
    auto it = kFormats.find(format);
    return it == kFormats.end() ? std::string() : it->second;
  }

  // A bound as an integer rounded inwards (exclusive bounds step past themselves); nullopt when absent or
  // beyond 2^53 (no value is that large in practice, and doubles stop being exact there).
  Result<std::optional<int64_t>> bound(const json& s, bool lower, const std::string& where) const {
    std::optional<int64_t> out;
    for (bool exclusive : {false, true}) {
      const char* key = lower ? (exclusive ? "exclusiveMinimum" : "minimum") : (exclusive ? "exclusiveMaximum" : "maximum");
      if (!s.contains(key)) continue;
      if (!s[key].is_number()) return error(where, std::string(key) + " must be a number");
      const double v = s[key].get<double>();
      if (std::fabs(v) > kMaxExactBound) continue;
      double r = lower ? std::ceil(v) : std::floor(v);
      if (exclusive && r == v) r += lower ? 1 : -1;
      const int64_t b = static_cast<int64_t>(r);
      if (!out || (lower ? b > *out : b < *out)) out = b;
    }
    return out;
  }

  Result<Expr> number_schema(const json& s, const std::string& where, bool integer) {
    if (s.contains("multipleOf")) {
      const json& m = s["multipleOf"];
      if (!m.is_number() || m.get<double>() != 1.0) return error(where, "multipleOf other than 1 is not supported");
      integer = true;
    }
    MX_ASSIGN_OR_RETURN(auto lo, bound(s, true, where));
    MX_ASSIGN_OR_RETURN(auto hi, bound(s, false, where));
    auto ints = integer_range(lo, hi);
    if (integer) {
      if (!ints) return error(where, "no integer satisfies the bounds");
      return std::move(*ints);
    }
    if (!lo && !hi) return unbounded_number();
    std::vector<Expr> alts;
    if (ints) alts.push_back(std::move(*ints));
    // k.f with k >= 0 lies in [k, k + 1): needs lo <= k and k + 1 <= hi.
    const int64_t pos_lo = lo && *lo > 0 ? *lo : 0;
    if (!hi || *hi - 1 >= pos_lo) {
      alts.push_back(seq({unsigned_range(static_cast<uint64_t>(pos_lo),
                                         hi ? std::optional<uint64_t>(static_cast<uint64_t>(*hi - 1)) : std::nullopt),
                          fraction()}));
    }
    // -k.f with k >= 0 lies in (-(k + 1), -k]: needs -(k + 1) >= lo and -k <= hi.
    const int64_t neg_lo = hi && *hi < 0 ? -*hi : 0;
    if (!lo || -*lo - 1 >= neg_lo) {
      alts.push_back(seq({byte_expr('-'),
                          unsigned_range(static_cast<uint64_t>(neg_lo),
                                         lo ? std::optional<uint64_t>(static_cast<uint64_t>(-*lo - 1)) : std::nullopt),
                          fraction()}));
    }
    if (alts.empty()) return error(where, "no number satisfies the bounds");
    return alt(std::move(alts));
  }

  Result<Expr> object_schema(const json& s, const std::string& where, int depth) {
    const json empty = json::object();
    const json& props = s.contains("properties") ? s["properties"] : empty;
    if (!props.is_object()) return error(where, "properties must be an object");
    std::vector<std::string> order;
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) return error(where, "required must be an array");
      for (const json& r : s["required"]) {
        if (!r.is_string()) return error(where, "required must list strings");
        const std::string name = r.get<std::string>();
        if (!props.contains(name)) return error(where, "required property '" + name + "' is not in properties");
        if (required.insert(name).second) order.push_back(name);
      }
    }
    for (const auto& [name, sub] : props.items()) {
      if (required.count(name) == 0) order.push_back(name);
    }
    if (props.empty()) {
      // Only additionalProperties can say what an object holds.
      const json* values = nullptr;
      if (s.contains("additionalProperties")) {
        const json& ap = s["additionalProperties"];
        if (ap.is_boolean() && !ap.get<bool>()) return literal("{}");
        if (ap.is_object()) values = &ap;
      }
      if (!values) return rule_ref(any_object_rule());
      MX_ASSIGN_OR_RETURN(Expr v1, compile(*values, where + "/additionalProperties", depth + 1));
      const int32_t value_rule = g_.add_rule(where + " additionalProperties");
      g_.rules[value_rule].body = std::move(v1);
      auto member = [&] { return seq({any_key(), byte_expr(':'), ws(), rule_ref(value_rule)}); };
      return seq({byte_expr('{'), optional(seq({member(), repeat(seq({byte_expr(','), ws(), member()}), 0, -1)})),
                  byte_expr('}')});
    }
    // Members in order; each optional one may be left out. tail[i][first]: members i.. where `first` says
    // nothing has been written yet (no comma before the next member). Built back to front as rules
    // when optional members make the choice branch, inline otherwise.
    std::vector<Expr> members;
    for (const std::string& name : order) {
      MX_ASSIGN_OR_RETURN(Expr v, compile(props[name], where + "/properties/" + name, depth + 1));
      members.push_back(seq({literal(key_text(name)), byte_expr(':'), ws(), std::move(v)}));
    }
    const size_t n = order.size();
    if (required.size() == n) {
      std::vector<Expr> items{byte_expr('{')};
      for (size_t i = 0; i < n; ++i) {
        if (i > 0) {
          items.push_back(byte_expr(','));
          items.push_back(ws());
        }
        items.push_back(std::move(members[i]));
      }
      items.push_back(byte_expr('}'));
      return seq(std::move(items));
    }
    // With optional members: rules first[i] (nothing written yet) and later[i] (a comma comes first).
    std::vector<int32_t> first(n + 1), later(n + 1);
    for (size_t i = 0; i <= n; ++i) {
      first[i] = g_.add_rule(where + " members from " + std::to_string(i));
      later[i] = g_.add_rule(where + " more members from " + std::to_string(i));
    }
    for (size_t i = n; i-- > 0;) {
      const bool optional_member = required.count(order[i]) == 0;
      Expr member_copy = members[i];
      std::vector<Expr> first_alts{seq({std::move(member_copy), rule_ref(later[i + 1])})};
      std::vector<Expr> later_alts{seq({byte_expr(','), ws(), std::move(members[i]), rule_ref(later[i + 1])})};
      if (optional_member) {
        first_alts.push_back(rule_ref(first[i + 1]));
        later_alts.push_back(rule_ref(later[i + 1]));
      }
      g_.rules[first[i]].body = alt(std::move(first_alts));
      g_.rules[later[i]].body = alt(std::move(later_alts));
    }
    return seq({byte_expr('{'), rule_ref(first[0]), byte_expr('}')});
  }

  Result<Expr> array_schema(const json& s, const std::string& where, int depth) {
    MX_ASSIGN_OR_RETURN(int32_t min_items, count_field(s, "minItems", 0, where));
    MX_ASSIGN_OR_RETURN(int32_t max_items, count_field(s, "maxItems", -1, where));
    if (max_items >= 0 && max_items < min_items) return error(where, "maxItems below minItems");
    if (max_items == 0) return literal("[]");
    Expr item;
    if (s.contains("items")) {
      if (s["items"].is_array()) return error(where, "items as an array (tuples) is not supported");
      MX_ASSIGN_OR_RETURN(item, compile(s["items"], where + "/items", depth + 1));
    } else {
      item = rule_ref(any_value_rule());
    }
    const int64_t copies = max_items < 0 ? 2 : max_items;
    if (expr_size(item) * copies > kInlineItemBudget) {
      const int32_t r = g_.add_rule(where + " items");
      g_.rules[r].body = std::move(item);
      item = rule_ref(r);
    }
    Expr more = repeat(seq({byte_expr(','), ws(), item}), min_items > 0 ? min_items - 1 : 0,
                       max_items < 0 ? -1 : max_items - 1);
    Expr body = seq({std::move(item), std::move(more)});
    return seq({byte_expr('['), min_items > 0 ? std::move(body) : optional(std::move(body)), byte_expr(']')});
  }

  const json& root_;
  const std::string quote_;  // JsonSchemaOptions::string_quote
  Grammar g_;
  std::map<std::string, int32_t> ref_rules_;
  int32_t any_value_ = -1;
  int32_t any_object_ = -1;
};

}  // namespace

Result<Grammar> json_schema_grammar(const nlohmann::json& schema, const JsonSchemaOptions& options) {
  try {
    return SchemaCompiler(schema, options).run();
  } catch (const nlohmann::json::exception& e) {  // a type mismatch inside the schema document
    return invalid_argument(std::string("JSON schema: ") + e.what());
  }
}

Grammar any_json_grammar(bool object_only, const JsonSchemaOptions& options) {
  const json empty = json::object();
  SchemaCompiler c(empty, options);
  Grammar& g = c.grammar();
  g.root = g.add_rule("root");
  const int32_t target = object_only ? c.any_object_rule() : c.any_value_rule();
  g.rules[g.root].body = rule_ref(target);
  return c.take();
}

}  // namespace mx::grammar
