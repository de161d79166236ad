// `mxserve make-model`: writes a synthetic checkpoint in its family's released layout (see
// model/synthetic_model.h) for benchmarks, tests and the demo model.
#include <chrono>
#include <cstdio>

#include "model/demo_model.h"
#include "tools/cli_args.h"
#include "tools/commands.h"

namespace mx {
namespace {

const std::vector<CliOption> kOptions = {
    {"preset", true, "gpt-oss-20b, gpt-oss-120b, demo, tiny, gemma-4-26b-a4b or gemma-demo"},
    {"out", true, "output directory"},
    {"seed", true, "random seed (default 0)"},
    {"threads", true, "generator threads (default: all cores)"},
    {"max-shard-mb", true, "shard size cap in MiB (default 4096)"},
    {"help", false, "show this help"},
};

Status run(const CliArgs& args) {
  if (!args.has("preset") || !args.has("out")) return invalid_argument("--preset and --out are required");
  SyntheticOptions options;
  MX_ASSIGN_OR_RETURN(int64_t seed, args.get_int("seed", 0));
  MX_ASSIGN_OR_RETURN(int64_t threads, args.get_int("threads", 0));
  MX_ASSIGN_OR_RETURN(int64_t shard_mb, args.get_int("max-shard-mb", 4096));
  if (threads < 0 || threads > 1024) return invalid_argument("--threads must be in [0, 1024]");
  if (shard_mb < 1) return invalid_argument("--max-shard-mb must be >= 1");
  options.seed = static_cast<uint64_t>(seed);
  options.threads = static_cast<int>(threads);
  options.max_shard_bytes = shard_mb << 20;
  const auto start = std::chrono::steady_clock::now();
  // The demo also gets its tokenizer, so that `serve --model` takes the directory as it is (the Gemma presets
  // write theirs with the checkpoint).
  if (args.get("preset") == "demo") {
    MX_RETURN_IF_ERROR(write_demo_model(args.get("out"), options));
  } else {
    MX_RETURN_IF_ERROR(write_synthetic_model(args.get("preset"), args.get("out"), options));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "wrote %s (%s, seed %lld) in %.1f s\n", args.get("out").c_str(), args.get("preset").c_str(),
               static_cast<long long>(seed), seconds);
  return Status::ok();
}

}  // namespace

int run_make_model_command(int argc, char** argv) {
  return run_cli_command(argc, argv, "make-model", kOptions, run);
}

}  // namespace mx
