// The "random" dataset of serving benchmarks: prompts made of random tokens, decoded to text, so that the
// server sees about the requested number of prompt tokens, plus the output length to request for each.
// Lengths are exact as far as the tokenizer allows: text is re-encoded and topped up or trimmed until it
// encodes to the target (merges across token boundaries change the count otherwise).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

namespace mx::bench {

struct RandomPromptOptions {
  int64_t num_prompts = 0;
  int64_t input_len = 0;
  int64_t output_len = 0;
  // Lengths are drawn uniformly from [max(1, len * ratio), len]; 1 makes every length exact (SGLang's meaning).
  double range_ratio = 1.0;
  uint64_t seed = 1;
};

struct BenchPrompt {
  std::string text;
  int64_t prompt_tokens = 0;  // the text's length in this tokenizer's tokens
  int64_t output_len = 0;     // max_tokens to request
};

Result<std::vector<BenchPrompt>> make_random_prompts(const Tokenizer& tokenizer, const RandomPromptOptions& options);

// `count` warm-up prompts of the measured prompts' shape, from another seed, none starting with the same
// 16 bytes as any measured prompt: a warm-up that shared a measured prompt's first page would turn its
// prefill into a prefix-cache hit and inflate the measured throughput. (Equal first 16 tokens would mean
// equal first 16 bytes, since every token is at least one byte.)
Result<std::vector<BenchPrompt>> make_warmup_prompts(const Tokenizer& tokenizer, const RandomPromptOptions& measured_options,
                                                     const std::vector<BenchPrompt>& measured, int64_t count);

}  // namespace mx::bench
