// The demo model `mxserve serve` runs without --model: the synthetic "demo" preset (the real 201,088-token
// vocabulary, tiny widths, random weights: it speaks gibberish) plus the embedded o200k tokenizer file, so
// the directory loads like a downloaded checkpoint. Made once per machine in a cache directory.
#pragma once

#include <string>

#include "core/status.h"
#include "model/synthetic_model.h"

namespace mx {

// Bump when the demo's bytes change, so an old cache is not mistaken for the new model.
inline constexpr char kDemoModelName[] = "demo-v1";

// Writes the demo checkpoint and its tokenizer into `dir` (what `make-model --preset demo` does).
Status write_demo_model(const std::string& dir, const SyntheticOptions& options = {});

// $XDG_CACHE_HOME/mxserve/demo-v1, else $HOME/.cache/mxserve/demo-v1; an error when neither is set.
Result<std::string> default_demo_model_dir();

// Returns `dir` once it holds the demo model, writing it first if it does not exist yet. The model is
// written into a temporary sibling directory and renamed into place, so a crash or a concurrent
// process never leaves a half-written model under `dir`.
Result<std::string> ensure_demo_model(const std::string& dir);

}  // namespace mx
