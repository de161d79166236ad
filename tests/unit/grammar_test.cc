// The grammar engine: each front end (regex, EBNF, JSON Schema) accepting and rejecting strings byte by
// byte, compile errors, and token masks equal to a brute-force check of every token of a vocabulary sample.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "grammar/automaton.h"
#include "grammar/ebnf.h"
#include "grammar/grammar_matcher.h"
#include "grammar/json_schema.h"
#include "grammar/mask_precompute.h"
#include "grammar/regex.h"
#include "tokenizer_util.h"

namespace mx::grammar {
namespace {

using nlohmann::json;

// A vocabulary of every single byte, enough to feed any string through a matcher.
std::shared_ptr<const TokenVocabulary> byte_vocab() {
  static const auto vocab = [] {
    std::vector<std::string> bytes;
    for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
    return std::make_shared<const TokenVocabulary>(std::move(bytes));
  }();
  return vocab;
}

std::shared_ptr<const CompiledGrammar> compile(const Result<Grammar>& g) {
  EXPECT_TRUE(g.is_ok()) << g.status().to_string();
  auto c = CompiledGrammar::create(*g, byte_vocab());
  EXPECT_TRUE(c.is_ok()) << c.status().to_string();
  return *c;
}

// Whole-string match, fed one byte at a time.
bool matches(const std::shared_ptr<const CompiledGrammar>& g, const std::string& s) {
  GrammarMatcher m(g);
  for (char c : s) {
    if (!m.accept_bytes(std::string(1, c))) return false;
  }
  return m.can_end();
}

// A prefix the grammar can still complete.
bool viable_prefix(const std::shared_ptr<const CompiledGrammar>& g, const std::string& s) {
  GrammarMatcher m(g);
  return s.empty() || m.accept_bytes(s);
}

std::shared_ptr<const CompiledGrammar> schema(const char* text) { return compile(json_schema_grammar(json::parse(text))); }

TEST(GrammarRegex, LiteralsClassesQuantifiers) {
  auto g = compile(regex_grammar("^a[b-d]+x{2,3}(yz|w)?$"));
  EXPECT_TRUE(matches(g, "abxx"));
  EXPECT_TRUE(matches(g, "acdbxxxyz"));
  EXPECT_TRUE(matches(g, "abxxw"));
  EXPECT_FALSE(matches(g, "axx"));
  EXPECT_FALSE(matches(g, "abxxxx"));
  EXPECT_FALSE(matches(g, "abx"));
  EXPECT_FALSE(matches(g, "abxxy"));
  EXPECT_TRUE(viable_prefix(g, "abxxy"));
  EXPECT_FALSE(viable_prefix(g, "abxxyy"));
}

TEST(GrammarRegex, EscapesNegationAndUnicode) {
  auto g = compile(regex_grammar("\\d{3}-[^a-z\\s]\\w*\\.é"));
  EXPECT_TRUE(matches(g, "123-A_9.é"));
  EXPECT_TRUE(matches(g, "123-Ωx.é"));  // a negated class covers all of Unicode
  EXPECT_FALSE(matches(g, "123-a.é"));
  EXPECT_FALSE(matches(g, "123- .é"));
  EXPECT_FALSE(matches(g, "12-A.é"));
  auto dot = compile(regex_grammar("a.c"));
  EXPECT_TRUE(matches(dot, "a\xF0\x9F\x98\x80" "c"));  // one 4-byte code point
  EXPECT_FALSE(matches(dot, "a\nc"));
  EXPECT_FALSE(matches(dot, "a\xFF" "c"));  // not UTF-8
  auto hex = compile(regex_grammar("[\\x41-\\x43]\\u00e9{2}"));
  EXPECT_TRUE(matches(hex, "Béé"));
}

TEST(GrammarRegex, RefusesWhatItCannotMatchExactly) {
  for (const char* p : {"(a", "a)", "[abc", "a{3,1}", "(?=a)b", "\\1", "a\\bc", "*a", "a^b", "\\q"}) {
    EXPECT_FALSE(regex_grammar(p).is_ok()) << p;
  }
}

TEST(GrammarEbnf, RulesRecursionAndComments) {
  auto g = compile(parse_ebnf(R"g(
    # balanced parentheses around a number
    root ::= "(" root ")" | num
    num  ::= [1-9] [0-9]{0,2}
  )g"));
  EXPECT_TRUE(matches(g, "((42))"));
  EXPECT_TRUE(matches(g, "999"));
  EXPECT_FALSE(matches(g, "((42)"));
  EXPECT_FALSE(matches(g, "1000"));
  EXPECT_FALSE(matches(g, "(0)"));
}

TEST(GrammarEbnf, Errors) {
  EXPECT_FALSE(parse_ebnf("root ::= missing").is_ok());
  EXPECT_FALSE(parse_ebnf("start ::= \"a\"").is_ok());
  EXPECT_FALSE(parse_ebnf("root ::= \"a").is_ok());
  auto left = parse_ebnf("root ::= root \"a\" | \"b\"");
  ASSERT_TRUE(left.is_ok());
  auto compiled = Automaton::compile(*left);
  ASSERT_FALSE(compiled.is_ok());
  EXPECT_NE(compiled.status().message().find("left-recursive"), std::string::npos);
}

TEST(GrammarLimits, TooLargeIsAnErrorNotAHang) {
  auto g = regex_grammar("(a{1000}){1000}");
  ASSERT_TRUE(g.is_ok());
  auto c = Automaton::compile(*g);
  ASSERT_FALSE(c.is_ok());
  EXPECT_NE(c.status().message().find("too large"), std::string::npos);
}

// The quoted notation (Gemma-4's tool calls): bare keys, strings between the quote bytes with no escapes,
// fixed values spelled the same way, no whitespace; the same value space as the JSON form.
TEST(GrammarJsonSchema, QuotedNotation) {
  JsonSchemaOptions notation;
  notation.string_quote = "\xff";
  const json s = json::parse(R"({"type":"object","properties":{"city":{"enum":["Paris","a \"b\""]},)"
                             R"("days":{"type":"integer","minimum":1,"maximum":7},"note":{"type":"string","maxLength":3},)"
                             R"("odd key":{"const":{"k":[1,"x"]}},"zone":{"type":"string","pattern":"^[A-Z]{2}$"},)"
                             R"("any":{}},"required":["city","days","note","odd key","zone"]})");
  auto g = compile(json_schema_grammar(s, notation));
  const std::string q = "\xff";
  const std::string base = "{city:" + q + "Paris" + q + ",days:3,note:" + q + "a\"\\" + q + "," + q + "odd key" + q +
                           ":{k:[1," + q + "x" + q + "]},zone:" + q + "AB" + q;
  EXPECT_TRUE(matches(g, base + "}"));
  EXPECT_TRUE(matches(g, base + ",any:{x_1:[true,null," + q + "s" + q + "]}}"));
  EXPECT_TRUE(matches(g, "{city:" + q + "a \"b\"" + q + base.substr(base.find(",days")) + "}"));
  EXPECT_FALSE(matches(g, "{\"city\":\"Paris\"" + base.substr(base.find(",days")) + "}"));  // JSON keys and strings
  EXPECT_FALSE(matches(g, "{city: " + q + "Paris" + q + base.substr(base.find(",days")) + "}"));  // a space
  EXPECT_FALSE(matches(g, "{city:" + q + "Paris" + q + ",days:8" + base.substr(base.find(",note")) + "}"));
  EXPECT_FALSE(matches(g, "{city:" + q + "Paris" + q + ",days:3,note:" + q + "abcd" + q + base.substr(base.find(",\xff" "odd")) + "}"));
  EXPECT_FALSE(viable_prefix(g, "{city:" + q + "Paris" + q + ",days:3,note:" + q + "\xff\xff"));  // the quote never inside
}

TEST(GrammarJsonSchema, IntegerBoundsAreDigitRules) {
  auto g = schema(R"({"type": "integer", "minimum": 0, "maximum": 150})");
  for (int v = -20; v <= 1100; ++v) EXPECT_EQ(matches(g, std::to_string(v)), v >= 0 && v <= 150) << v;
  EXPECT_FALSE(viable_prefix(g, "151"));
  EXPECT_FALSE(viable_prefix(g, "1500"));  // a fourth digit cannot grow
  EXPECT_FALSE(matches(g, "007"));
  auto neg = schema(R"({"type": "integer", "exclusiveMinimum": -37, "maximum": -5})");
  for (int v = -100; v <= 10; ++v) EXPECT_EQ(matches(neg, std::to_string(v)), v > -37 && v <= -5) << v;
  auto open = schema(R"({"type": "integer", "minimum": 95})");
  for (int v = -5; v <= 2000; v += 7) EXPECT_EQ(matches(open, std::to_string(v)), v >= 95) << v;
  EXPECT_TRUE(matches(open, "123456789012"));
}

TEST(GrammarJsonSchema, NumberBounds) {
  auto g = schema(R"({"type": "number", "minimum": -2, "maximum": 3})");
  for (const char* ok : {"-2", "3", "0", "-1.5", "2.999", "-0.25", "0.0"}) EXPECT_TRUE(matches(g, ok)) << ok;
  for (const char* bad : {"-3", "4", "3.5", "-2.5", "1e3", "01"}) EXPECT_FALSE(matches(g, bad)) << bad;
  auto any = schema(R"({"type": "number"})");
  for (const char* ok : {"-0", "-0.5", "12.5e-3", "7E+2", "0.125"}) EXPECT_TRUE(matches(any, ok)) << ok;
  for (const char* bad : {"+1", ".5", "1.", "--1", "0x1"}) EXPECT_FALSE(matches(any, bad)) << bad;
}

TEST(GrammarJsonSchema, StringsEnumsConstFormats) {
  auto s = schema(R"({"type": "string", "minLength": 2, "maxLength": 4})");
  EXPECT_TRUE(matches(s, "\"ab\""));
  EXPECT_TRUE(matches(s, "\"a\\\"\\u00e9\""));
  EXPECT_TRUE(matches(s, "\"\xC3\xA9\xC3\xA9\""));  // two characters, four bytes
  EXPECT_FALSE(matches(s, "\"a\""));
  EXPECT_FALSE(matches(s, "\"abcde\""));
  EXPECT_FALSE(matches(s, "\"a\nb\""));
  EXPECT_FALSE(matches(s, "\"\\ud800x\""));  // no lone surrogate escapes
  auto e = schema(R"({"enum": ["red", "green", 3, null]})");
  EXPECT_TRUE(matches(e, "\"green\""));
  EXPECT_TRUE(matches(e, "3"));
  EXPECT_TRUE(matches(e, "null"));
  EXPECT_FALSE(matches(e, "\"blue\""));
  auto c = schema(R"({"const": {"a": [1, "x"]}})");
  EXPECT_TRUE(matches(c, R"({"a":[1,"x"]})"));
  auto p = schema(R"({"type": "string", "pattern": "^[A-Z]{2}-\\d+$"})");
  EXPECT_TRUE(matches(p, "\"AB-12\""));
  EXPECT_FALSE(matches(p, "\"Ab-12\""));
  auto uuid = schema(R"({"type": "string", "format": "uuid"})");
  EXPECT_TRUE(matches(uuid, "\"123e4567-e89b-12d3-a456-426614174000\""));
  auto date = schema(R"({"type": "string", "format": "date-time"})");
  EXPECT_TRUE(matches(date, "\"2024-02-28T23:59:07Z\""));
  EXPECT_FALSE(matches(date, "\"2024-13-01T00:00:00Z\""));
  auto ip = schema(R"({"type": "string", "format": "ipv4"})");
  EXPECT_TRUE(matches(ip, "\"192.168.0.255\""));
  EXPECT_FALSE(matches(ip, "\"256.1.1.1\""));
}

TEST(GrammarJsonSchema, ObjectsRequiredOptionalNesting) {
  auto g = schema(R"({
    "type": "object",
    "properties": {
      "name": {"type": "string", "maxLength": 8},
      "age": {"type": "integer", "minimum": 0, "maximum": 150},
      "tags": {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 2},
      "pet": {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}}, "required": ["kind"]}
    },
    "required": ["name", "age"],
    "additionalProperties": false
  })");
  EXPECT_TRUE(matches(g, R"({"name":"Bo","age":7})"));
  EXPECT_TRUE(matches(g, R"({"name": "Bo", "age": 7, "pet": {"kind": "dog"}})"));
  EXPECT_TRUE(matches(g, R"({"name":"Bo","age":7,"tags":[true, false]})"));
  EXPECT_FALSE(matches(g, R"({"name":"Bo"})"));
  EXPECT_FALSE(matches(g, R"({"name":"Bo","age":7,"tags":[]})"));
  EXPECT_FALSE(matches(g, R"({"name":"Bo","age":7,"tags":[true,true,true]})"));
  EXPECT_FALSE(matches(g, R"({"name":"Bo","age":7,"extra":1})"));
  EXPECT_FALSE(matches(g, R"({"name":"Bo","age":7,"pet":{}})"));
}

TEST(GrammarJsonSchema, AnyOfRefsAndRecursion) {
  auto g = schema(R"({
    "$defs": {"node": {"type": "object", "properties": {
        "v": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "null"}]},
        "next": {"$ref": "#/$defs/node"}}, "required": ["v"]}},
    "$ref": "#/$defs/node"
  })");
  EXPECT_TRUE(matches(g, R"({"v":1})"));
  EXPECT_TRUE(matches(g, R"({"v":null,"next":{"v":2,"next":{"v":3}}})"));
  EXPECT_FALSE(matches(g, R"({"v":10})"));
  EXPECT_FALSE(matches(g, R"({"v":1,"next":{}})"));
}

TEST(GrammarJsonSchema, UnsupportedKeywordsAreNamedErrors) {
  for (const char* bad : {R"({"type": "object", "patternProperties": {}})", R"({"type": "string", "format": "uri"})",
                          R"({"not": {}})", R"({"type": "number", "multipleOf": 3})", R"({"$ref": "#/nowhere"})",
                          R"({"type": "array", "uniqueItems": true})", R"({"type": "strung"})", R"(false)"}) {
    auto g = json_schema_grammar(json::parse(bad));
    EXPECT_FALSE(g.is_ok()) << bad;
  }
  auto g = json_schema_grammar(json::parse(R"({"type": "object", "patternProperties": {}})"));
  EXPECT_NE(g.status().message().find("patternProperties"), std::string::npos);
}

TEST(GrammarJsonSchema, AnyJson) {
  auto g = compile(any_json_grammar(true));
  EXPECT_TRUE(matches(g, R"({"a": [1, 2.5, {"b": null}], "c": "x"})"));
  EXPECT_TRUE(matches(g, "{}"));
  EXPECT_FALSE(matches(g, "[1]"));
  EXPECT_FALSE(matches(g, R"({"a":})"));
}

// A sample of o200k (every 11th token and every single byte) at the real ids; the rest have no bytes.
std::vector<std::string> o200k_sample_bytes() {
  const Tokenizer& tok = testing::o200k();
  std::vector<std::string> bytes(tok.vocab_size());
  for (int32_t id = 0; id < tok.num_ranks(); ++id) {
    std::string b;
    tok.append_token_bytes(id, &b);
    if (id % 11 == 0 || b.size() == 1) bytes[id] = b;
  }
  return bytes;
}

// The mask of every step of random walks equals trying every token of the vocabulary byte by byte.
void check_masks_against_brute_force(const Grammar& grammar, uint32_t seed) {
  const std::vector<std::string> bytes = o200k_sample_bytes();
  auto vocab = std::make_shared<const TokenVocabulary>(bytes);
  auto compiled = CompiledGrammar::create(grammar, vocab);
  ASSERT_TRUE(compiled.is_ok()) << compiled.status().to_string();
  std::mt19937 rng(seed);
  for (int walk = 0; walk < 3; ++walk) {
    GrammarMatcher m(*compiled);
    std::vector<uint32_t> mask(vocab->mask_words());
    for (int step = 0; step < 24 && !m.must_end(); ++step) {
      m.fill_mask(mask.data());
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < vocab->size(); ++id) {
        const bool in_mask = (mask[id >> 5] >> (id & 31)) & 1;
        const bool brute = !bytes[id].empty() && m.accept_token(id);
        if (brute) m.rollback(1);
        ASSERT_EQ(in_mask, brute) << "token " << id << " '" << bytes[id] << "' at step " << step;
        if (brute) allowed.push_back(id);
      }
      ASSERT_FALSE(allowed.empty());
      ASSERT_TRUE(m.accept_token(allowed[rng() % allowed.size()]));
    }
  }
}

TEST(GrammarMask, EqualsBruteForceOnSchemas) {
  check_masks_against_brute_force(*json_schema_grammar(json::parse(R"({
    "type": "object",
    "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 150},
                   "name": {"type": "string", "maxLength": 12},
                   "kind": {"enum": ["alpha", "beta"]},
                   "list": {"type": "array", "items": {"type": "number"}, "maxItems": 3}},
    "required": ["id", "name", "kind"]})")), 1);
  check_masks_against_brute_force(any_json_grammar(false), 2);
  check_masks_against_brute_force(*parse_ebnf("root ::= (\"ab\" | [0-9]+ \" \")* \"end\""), 3);
}

// Node masks built ahead on background threads equal those a matcher builds on demand, and once every node
// is built a matcher builds none itself.
TEST(GrammarMask, PrecomputedMasksEqualOnDemandOnes) {
  auto vocab = std::make_shared<const TokenVocabulary>(o200k_sample_bytes());
  const Result<Grammar> g = json_schema_grammar(json::parse(R"({
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": -5, "maximum": 1200},
                   "tags": {"type": "array", "items": {"enum": ["x", "yz"]}, "minItems": 1, "maxItems": 4},
                   "note": {"type": "string", "maxLength": 6},
                   "child": {"$ref": "#"}},
    "required": ["n"]})"));
  ASSERT_TRUE(g.is_ok()) << g.status().to_string();
  auto lazy = CompiledGrammar::create(*g, vocab), ahead = CompiledGrammar::create(*g, vocab);
  ASSERT_TRUE(lazy.is_ok() && ahead.is_ok());
  {
    MaskPrecompute precompute(2, int64_t{1} << 40);
    precompute.add(*ahead);
    precompute.wait_idle();
  }
  EXPECT_GT((*ahead)->num_mask_nodes(), 20);
  std::mt19937 rng(5);
  for (int walk = 0; walk < 6; ++walk) {
    GrammarMatcher a(*lazy), b(*ahead);
    std::vector<uint32_t> ma(vocab->mask_words()), mb(vocab->mask_words());
    for (int step = 0; step < 40 && !a.must_end(); ++step) {
      a.fill_mask(ma.data());
      b.fill_mask(mb.data());
      ASSERT_EQ(ma, mb) << "walk " << walk << " step " << step;
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < vocab->size(); ++id)
        if ((ma[id >> 5] >> (id & 31)) & 1) allowed.push_back(id);
      ASSERT_FALSE(allowed.empty());
      const int32_t id = allowed[rng() % allowed.size()];
      ASSERT_TRUE(a.accept_token(id) && b.accept_token(id));
    }
  }
  EXPECT_GT((*lazy)->masks_built_on_demand(), 0);
  EXPECT_EQ((*ahead)->masks_built_on_demand(), 0);
  // A budget stops the precomputation early: what is left is built on demand, with equal results.
  auto capped = CompiledGrammar::create(*g, vocab);
  ASSERT_TRUE(capped.is_ok());
  const std::atomic<bool> stop{false};
  EXPECT_GT((*capped)->precompute_masks(stop, 1), 0);
  EXPECT_LT((*capped)->cache_bytes(), (*ahead)->cache_bytes());
}

}  // namespace
}  // namespace mx::grammar
