// Speculative decoding's drafters: each proposes up to k next tokens of a sequence, which the target model
// then verifies in one step (k + 1 query rows: the last accepted token and the drafts) and accepts by
// sampling every row and keeping the longest prefix the samples agree with (runtime/scheduler.cc).
//
// A drafter here proposes a point mass per position (a token, not a distribution): sampling the target at
// a position and accepting the draft when the sample equals it is then exactly speculative rejection
// sampling (accept with probability p(draft); on rejection the sample is a draw from p without the draft,
// renormalised: the residual max(0, p - q) for a point-mass q). Drafters with a proposal distribution
// (EAGLE-3, MTP) will have to carry it beside the tokens for the general rule (accept with min(1, p/q),
// else draw from the normalised max(0, p - q)); not built yet.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace mx {

class Drafter;

// kExternal: a drafter made by code and handed in (SpeculativeConfig::external): tests and benchmarks
// (reference_drafter.h); no flag names it. kMtp: a draft model (model/draft_model.h) loaded from
// SpeculativeConfig::draft_model drafts on the device after each target step (Gemma-4's MTP assistant);
// the scheduler takes its drafts from the request (Request::draft_tokens) instead of a Drafter. kEagle3: the
// same with an EAGLE-3 draft for a gpt-oss target (model/eagle3).
enum class SpeculativeAlgorithm : uint8_t { kNone = 0, kNgram, kExternal, kMtp, kEagle3 };

struct SpeculativeConfig {
  SpeculativeAlgorithm algorithm = SpeculativeAlgorithm::kNone;
  int64_t num_draft_tokens = 0;  // k: tokens proposed per sequence and step
  int64_t ngram_min = 1;         // n-gram: shortest suffix matched (vLLM's prompt_lookup_min)
  int64_t ngram_max = 4;         // n-gram: longest suffix matched (vLLM's prompt_lookup_max)
  std::shared_ptr<const Drafter> external;  // kExternal: the drafter (shared: configs are copied)
  std::string draft_model;                  // kMtp, kEagle3: the draft model's checkpoint folder
  // Benchmarks only (kExternal): every draft counts as accepted and is appended whatever the target
  // sampled, so each verify step yields k + 1 tokens: the all-accepted cost where a backend's numerics part
  // from the recorded drafts (bf16 near ties of random weights). The tokens are then the drafts'.
  bool accept_all = false;
  // A draft model with graphs of its own replays them (EAGLE-3: its chain passes, per decode graph bucket
  // and k; needs the engine's graphs). On by default (H100, docs/PERF.md: the verify step 1-2% faster);
  // --no-speculative-draft-graphs runs them eagerly (profiling every op).
  bool draft_graphs = true;
  bool enabled() const { return algorithm != SpeculativeAlgorithm::kNone && num_draft_tokens > 0; }
};

// True for the algorithms whose drafts come from a draft model run by the engine (not from a Drafter).
bool uses_draft_model(SpeculativeAlgorithm algorithm);

// "ngram" -> kNgram, "mtp" -> kMtp, "eagle3" -> kEagle3; anything else is unknown.
Result<SpeculativeAlgorithm> parse_speculative_algorithm(const std::string& name);
const char* speculative_algorithm_name(SpeculativeAlgorithm algorithm);
// Range checks with one clear message per bad field (the door: flags and configs).
Status validate_speculative_config(const SpeculativeConfig& config);

class Drafter {
 public:
  virtual ~Drafter() = default;
  // Appends to `out` (cleared first) at most `max_tokens` proposed continuations of `tokens` (prompt and
  // generated ids so far). May propose none. Allocates nothing once `out` has capacity.
  virtual void propose(std::span<const int32_t> tokens, int64_t max_tokens, std::vector<int32_t>* out) const = 0;
};

// The drafter the config names (null when speculation is off or drafts come from a draft model).
std::shared_ptr<const Drafter> make_drafter(const SpeculativeConfig& config);

}  // namespace mx
