// RoPE frequencies with YaRN "NTK-by-parts" scaling, computed in double and stored as f32.
// gpt-oss keeps the correction range fractional (truncate = false) and multiplies cos and sin by the
// concentration m = 0.1 ln(factor) + 1 on both q and k (ref-gpt-oss-model.md 1.3, pitfall 4).
#pragma once

#include <vector>

#include <cstdint>

namespace mx {

struct YarnRope {
  double theta = 150000.0;
  double factor = 1.0;                     // 1 means plain RoPE (no YaRN)
  int64_t original_max_position = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = false;                   // gpt-oss: false (keep the fractional correction range)
  double attention_factor = 0.0;           // 0 = derived: 0.1 * ln(factor) + 1 when factor > 1
};

struct RopeTables {
  std::vector<float> inv_freq;  // [head_dim / 2]
  float attention_scale = 1.0f; // m
  double correction_low = 0;    // for tests and logs
  double correction_high = 0;
};

RopeTables compute_yarn_rope(const YarnRope& rope, int64_t head_dim);

}  // namespace mx
