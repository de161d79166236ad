// Encode throughput of one thread on a text file, for docs/PERF.md (driven by bench.mjs, which times
// js-tiktoken on the same file). Prints one JSON line: bytes, tokens, seconds for a cold and a warm pass.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: mx_tokenizer_bench TOKENIZER TEXT_FILE\n");
    return 2;
  }
  auto tok = mx::Tokenizer::load(argv[1]);
  if (!tok.is_ok()) {
    std::fprintf(stderr, "error: %s\n", tok.status().to_string().c_str());
    return 1;
  }
  std::ifstream in(argv[2], std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "error: cannot open %s\n", argv[2]);
    return 1;
  }
  std::stringstream buf;
  buf << in.rdbuf();
  const std::string text = buf.str();
  double seconds[2] = {0, 0};
  size_t tokens = 0;
  for (int pass = 0; pass < 2; ++pass) {  // pass 0 starts with an empty pre-token cache
    const auto t0 = std::chrono::steady_clock::now();
    tokens = (*tok)->encode(text).size();
    seconds[pass] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  std::printf("{\"bytes\": %zu, \"tokens\": %zu, \"cold_s\": %.4f, \"warm_s\": %.4f}\n", text.size(), tokens,
              seconds[0], seconds[1]);
  return 0;
}
