#include "chat/chat_format.h"

#include "chat/chat_constraint.h"

namespace mx {

const char* reasoning_effort_name(ReasoningEffort effort) {
  switch (effort) {
    case ReasoningEffort::kLow: return "low";
    case ReasoningEffort::kMedium: return "medium";
    case ReasoningEffort::kHigh: return "high";
  }
  return "medium";
}

Result<std::shared_ptr<const TurnConstraintPlan>> ChatFormat::plan_constraint(const TurnConstraintSpec&, GrammarCompiler&) const {
  return unimplemented("the " + name() + " chat format cannot enforce structured outputs or tool_choice");
}

}  // namespace mx
