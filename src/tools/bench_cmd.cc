// `mxserve bench <kind>`: the benchmark drivers, dispatched on the second word. Adding one is a row in
// kBenchCommands plus its run_bench_<kind>_command in bench_<kind>_cmd.cc (declared in commands.h). Each gets
// argv shifted by one: argv[0] is "bench", argv[1] its kind, options from argv[2].
#include <cstdio>
#include <cstring>

#include "tools/commands.h"

namespace mx {
namespace {

struct BenchCommand {
  const char* name;
  int (*run)(int argc, char** argv);
  const char* summary;
};

constexpr BenchCommand kBenchCommands[] = {
    {"latency", run_bench_latency_command, "in-process prefill and decode latency per batch size beside their floors"},
    {"serve", run_bench_serve_command, "streaming load against an OpenAI-compatible server (TTFT, ITL, throughput)"},
};

void print_bench_usage() {
  std::fprintf(stderr, "usage: mxserve bench <kind> [options]\n\nkinds:\n");
  for (const auto& c : kBenchCommands) std::fprintf(stderr, "  %-10s %s\n", c.name, c.summary);
  std::fprintf(stderr, "\n`mxserve bench <kind> --help` lists its options.\n");
}

}  // namespace

int run_bench_command(int argc, char** argv) {
  if (argc < 3 || !std::strcmp(argv[2], "--help") || !std::strcmp(argv[2], "-h")) {
    print_bench_usage();
    return argc < 3 ? 2 : 0;
  }
  for (const auto& c : kBenchCommands) {
    if (!std::strcmp(argv[2], c.name)) return c.run(argc - 1, argv + 1);
  }
  std::fprintf(stderr, "error: unknown bench kind '%s'\n", argv[2]);
  print_bench_usage();
  return 2;
}

}  // namespace mx
