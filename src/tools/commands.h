// Entry points of the mxserve subcommands. Each returns the process exit code; argv[0] is "mxserve" and
// argv[1] the subcommand name. One file per subcommand: <name>_cmd.cc.
#pragma once

namespace mx {

int run_generate_command(int argc, char** argv);
int run_make_model_command(int argc, char** argv);
int run_tokenize_command(int argc, char** argv);
int run_serve_command(int argc, char** argv);
int run_bench_command(int argc, char** argv);

// `mxserve bench <kind>` entries (see bench_cmd.cc): argv[0] is "bench", argv[1] the kind.
int run_bench_latency_command(int argc, char** argv);
int run_bench_serve_command(int argc, char** argv);

}  // namespace mx
