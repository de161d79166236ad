// mxserve: dispatch to a subcommand. Errors from user input print one line and exit non-zero.
#include <cstdio>
#include <cstring>

#include "core/version.h"
#include "tools/commands.h"

namespace {

struct Command {
  const char* name;
  int (*run)(int argc, char** argv);
  const char* summary;
};

constexpr Command kCommands[] = {
    {"generate", mx::run_generate_command, "run prompts (token ids) through a model and print the output ids"},
    {"make-model", mx::run_make_model_command, "write a synthetic gpt-oss checkpoint (random weights, real layout)"},
    {"tokenize", mx::run_tokenize_command, "text <-> token ids, one JSON value per line (stdin -> stdout)"},
    {"serve", mx::run_serve_command, "OpenAI-compatible HTTP server on the continuous-batching engine"},
    {"bench", mx::run_bench_command, "benchmarks: `bench latency` (in-process, vs floors), `bench serve` (load on a server)"},
};

void print_usage() {
  std::fprintf(stderr, "usage: mxserve <command> [options]\n\ncommands:\n");
  for (const auto& c : kCommands) std::fprintf(stderr, "  %-12s %s\n", c.name, c.summary);
  std::fprintf(stderr, "\n`mxserve <command> --help` lists a command's options; `mxserve --version` the version.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    print_usage();
    return argc < 2 ? 2 : 0;
  }
  if (!std::strcmp(argv[1], "--version") || !std::strcmp(argv[1], "version")) {
    std::printf("mxserve %s\n", mx::kMxserveVersion);
    return 0;
  }
  for (const auto& c : kCommands) {
    if (!std::strcmp(argv[1], c.name)) return c.run(argc, argv);
  }
  std::fprintf(stderr, "error: unknown command '%s'\n", argv[1]);
  print_usage();
  return 2;
}
