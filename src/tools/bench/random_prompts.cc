#include "tools/bench/random_prompts.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <unordered_set>

#include "tokenizer/utf8.h"

namespace mx::bench {
namespace {

// Ordinary tokens whose bytes are whole UTF-8 text on their own: decoding a sequence of them needs no U+FFFD.
std::vector<int32_t> text_token_pool(const Tokenizer& tokenizer) {
  std::vector<int32_t> pool;
  std::string bytes;
  for (int32_t id = 0; id < tokenizer.num_ranks(); ++id) {
    bytes.clear();
    if (tokenizer.is_special(id) || !tokenizer.append_token_bytes(id, &bytes)) continue;
    if (!bytes.empty() && utf8_is_valid(bytes)) pool.push_back(id);
  }
  return pool;
}

int64_t draw_length(int64_t len, double ratio, std::mt19937_64& rng) {
  const int64_t low = std::max<int64_t>(1, static_cast<int64_t>(std::floor(static_cast<double>(len) * ratio)));
  if (low >= len) return len;
  return std::uniform_int_distribution<int64_t>(low, len)(rng);
}

// Random text that encodes to `target` tokens (or as close as a few rounds of fixing get).
Result<BenchPrompt> make_prompt(const Tokenizer& tokenizer, const std::vector<int32_t>& pool, int64_t target,
                                std::mt19937_64& rng) {
  std::uniform_int_distribution<size_t> pick(0, pool.size() - 1);
  std::vector<int32_t> ids;
  BenchPrompt prompt;
  for (int round = 0; round < 16; ++round) {
    while (static_cast<int64_t>(ids.size()) < target) ids.push_back(pool[pick(rng)]);
    ids.resize(target);
    MX_ASSIGN_OR_RETURN(prompt.text, tokenizer.decode(ids));
    ids = tokenizer.encode(prompt.text);
    if (static_cast<int64_t>(ids.size()) == target) break;
  }
  prompt.prompt_tokens = static_cast<int64_t>(ids.size());
  return prompt;
}

}  // namespace

Result<std::vector<BenchPrompt>> make_warmup_prompts(const Tokenizer& tokenizer, const RandomPromptOptions& measured_options,
                                                     const std::vector<BenchPrompt>& measured, int64_t count) {
  std::unordered_set<std::string> taken;
  for (const BenchPrompt& p : measured) taken.insert(p.text.substr(0, 16));
  RandomPromptOptions options = measured_options;
  options.num_prompts = count;
  for (int attempt = 0; attempt < 8; ++attempt) {
    options.seed = measured_options.seed ^ (0x9e3779b97f4a7c15ull * static_cast<uint64_t>(attempt + 1));
    MX_ASSIGN_OR_RETURN(std::vector<BenchPrompt> warmup, make_random_prompts(tokenizer, options));
    const bool disjoint = std::none_of(warmup.begin(), warmup.end(),
                                       [&](const BenchPrompt& w) { return taken.count(w.text.substr(0, 16)) != 0; });
    if (disjoint) return warmup;
  }
  return invalid_argument("cannot draw warm-up prompts that differ from the measured ones (prompts too short?)");
}

Result<std::vector<BenchPrompt>> make_random_prompts(const Tokenizer& tokenizer, const RandomPromptOptions& options) {
  if (options.num_prompts < 1) return invalid_argument("the number of prompts must be at least 1");
  if (options.input_len < 1) return invalid_argument("the random input length must be at least 1");
  if (options.output_len < 1) return invalid_argument("the random output length must be at least 1");
  if (!(options.range_ratio >= 0.0 && options.range_ratio <= 1.0))
    return invalid_argument("the random range ratio must be in [0, 1]");
  const std::vector<int32_t> pool = text_token_pool(tokenizer);
  if (pool.empty()) return invalid_argument("the tokenizer has no ordinary text tokens");
  std::mt19937_64 rng(options.seed);
  std::vector<BenchPrompt> prompts;
  prompts.reserve(options.num_prompts);
  for (int64_t i = 0; i < options.num_prompts; ++i) {
    const int64_t input_len = draw_length(options.input_len, options.range_ratio, rng);
    const int64_t output_len = draw_length(options.output_len, options.range_ratio, rng);
    MX_ASSIGN_OR_RETURN(BenchPrompt prompt, make_prompt(tokenizer, pool, input_len, rng));
    prompt.output_len = output_len;
    prompts.push_back(std::move(prompt));
  }
  return prompts;
}

}  // namespace mx::bench
