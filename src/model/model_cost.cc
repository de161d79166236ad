#include "model/model_cost.h"

#include <cmath>

namespace mx {

double expected_distinct_experts(int64_t experts, int64_t top_k, int64_t tokens) {
  if (experts <= 0) return 0;
  const double e = static_cast<double>(experts);
  return e * (1.0 - std::pow(1.0 - static_cast<double>(top_k) / e, static_cast<double>(tokens)));
}

double ModelCost::expected_distinct_experts(int64_t tokens) const {
  return mx::expected_distinct_experts(num_experts(), experts_per_token(), tokens);
}

}  // namespace mx
