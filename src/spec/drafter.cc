// Speculative config parsing and the drafter factory.
#include "spec/drafter.h"

#include "spec/ngram_drafter.h"

namespace mx {

bool uses_draft_model(SpeculativeAlgorithm algorithm) {
  return algorithm == SpeculativeAlgorithm::kMtp || algorithm == SpeculativeAlgorithm::kEagle3;
}

Result<SpeculativeAlgorithm> parse_speculative_algorithm(const std::string& name) {
  if (name == "ngram") return SpeculativeAlgorithm::kNgram;
  if (name == "mtp") return SpeculativeAlgorithm::kMtp;
  if (name == "eagle3") return SpeculativeAlgorithm::kEagle3;
  return invalid_argument("unknown speculative algorithm '" + name + "' (known: ngram, mtp, eagle3)");
}

const char* speculative_algorithm_name(SpeculativeAlgorithm algorithm) {
  switch (algorithm) {
    case SpeculativeAlgorithm::kNone: return "none";
    case SpeculativeAlgorithm::kNgram: return "ngram";
    case SpeculativeAlgorithm::kExternal: return "external";
    case SpeculativeAlgorithm::kMtp: return "mtp";
    case SpeculativeAlgorithm::kEagle3: return "eagle3";
  }
  return "none";
}

Status validate_speculative_config(const SpeculativeConfig& c) {
  if (c.algorithm == SpeculativeAlgorithm::kNone) {
    if (c.num_draft_tokens != 0) return invalid_argument("speculative draft tokens need a speculative algorithm");
    if (!c.draft_model.empty()) return invalid_argument("a speculative draft model needs a speculative algorithm (mtp or eagle3)");
    return Status::ok();
  }
  if (c.num_draft_tokens < 1 || c.num_draft_tokens > 16)
    return invalid_argument("speculative-num-draft-tokens must be in [1, 16]");
  if (c.ngram_min < 1) return invalid_argument("speculative-ngram-min must be at least 1");
  if (c.ngram_max < c.ngram_min) return invalid_argument("speculative-ngram-max must be at least speculative-ngram-min");
  if (c.ngram_max > 64) return invalid_argument("speculative-ngram-max must be at most 64");
  if ((c.algorithm == SpeculativeAlgorithm::kExternal) != (c.external != nullptr))
    return invalid_argument("an external drafter and the external speculative algorithm go together");
  if (uses_draft_model(c.algorithm) && c.draft_model.empty())
    return invalid_argument(std::string("speculative algorithm ") + speculative_algorithm_name(c.algorithm) +
                            " needs a draft model (speculative-draft-model DIR)");
  if (!uses_draft_model(c.algorithm) && !c.draft_model.empty())
    return invalid_argument(std::string("a speculative draft model is not used by the ") +
                            speculative_algorithm_name(c.algorithm) + " algorithm (mtp and eagle3 take one)");
  if (c.accept_all && c.algorithm != SpeculativeAlgorithm::kExternal)
    return invalid_argument("accepting every draft is for external (benchmark) drafters only");
  return Status::ok();
}

std::shared_ptr<const Drafter> make_drafter(const SpeculativeConfig& c) {
  if (!c.enabled()) return nullptr;
  switch (c.algorithm) {
    case SpeculativeAlgorithm::kNgram: return std::make_shared<NgramDrafter>(c.ngram_min, c.ngram_max);
    case SpeculativeAlgorithm::kExternal: return c.external;
    case SpeculativeAlgorithm::kMtp:  // drafts from the engine's draft model (model/draft_model.h)
    case SpeculativeAlgorithm::kEagle3:
    case SpeculativeAlgorithm::kNone: break;
  }
  return nullptr;
}

}  // namespace mx
