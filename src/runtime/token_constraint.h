// A request's constraint on what it may generate (structured outputs: a JSON schema, a regex, a grammar, a
// forced tool call). The engine asks for the step's mask before sampling and tells the constraint every
// token appended; what the mask means (which part of the output a grammar covers) is the constraint's
// business. One instance per request (n > 1 gets one each); used only on the engine thread.
#pragma once

#include <cstdint>

namespace mx {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Whether the next token is constrained; when it is, writes the allowed tokens into `words`
  // (bit id % 32 of words[id / 32], (vocab + 31) / 32 words; sampling_math.h token_allowed).
  virtual bool fill_mask(uint32_t* words, int64_t vocab) = 0;
  // The token the engine appended (sampled or forced).
  virtual void accept(int32_t token) = 0;
};

}  // namespace mx
