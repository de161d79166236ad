// The engine flags shared by the subcommands that run an Engine (generate, serve, bench latency): one list
// of options and one reader, so the flags mean the same everywhere.
#pragma once

#include <vector>

#include "model/load_options.h"
#include "runtime/engine_config.h"
#include "tools/cli_args.h"

namespace mx {

std::vector<CliOption> engine_cli_options();

// Overwrites the fields of `config` whose flags were given; the others keep their values (a command's own
// defaults). Ranges are checked later by resolve_engine_config, with one message per bad field.
Status read_engine_flags(const CliArgs& args, EngineConfig* config);

// --speculative-algorithm and its knobs (read by read_engine_flags); the knobs without an algorithm, an
// unknown or not yet available algorithm are errors.
Status read_speculative_flags(const CliArgs& args, SpeculativeConfig* config);

// --tensor-parallel-size (--tp): 1 when absent; the commands that load a model for serving list the flag
// themselves (generate, serve).
Result<int> tensor_parallel_size(const CliArgs& args);

// --dense-dtype (bf16 when absent): how the model's dense projections are kept on the device; the MoE split
// of tensor parallel (--enable-expert-parallel, --no-enable-expert-parallel, --expert-parallel-size).
Result<ModelLoadOptions> model_load_options(const CliArgs& args);

}  // namespace mx
