// A deterministic grammar-mask stand-in for the engine tests that run masked decode steps (eager, and inside the
// step graphs on the CPU and on CUDA): token t is allowed at step s when (t * 7 + s * 13 + salt) % 5 == 0; it
// counts the tokens sampled outside its mask.
#pragma once

#include <algorithm>
#include <cstdint>

#include "runtime/token_constraint.h"

namespace mx::test {

class StripedConstraint final : public TokenConstraint {
 public:
  explicit StripedConstraint(uint32_t salt) : salt_(salt) {}
  bool fill_mask(uint32_t* words, int64_t vocab) override {
    std::fill(words, words + (vocab + 31) / 32, 0u);
    for (int64_t t = 0; t < vocab; ++t)
      if (allowed(t)) words[t >> 5] |= 1u << (t & 31);
    return true;
  }
  void accept(int32_t token) override {
    violations += allowed(token) ? 0 : 1;
    ++step_;
  }
  int64_t violations = 0;

 private:
  bool allowed(int64_t t) const { return (t * 7 + step_ * 13 + salt_) % 5 == 0; }
  uint32_t salt_;
  int64_t step_ = 0;
};

}  // namespace mx::test
