// Static batching: all prompts are prefilled together in one forward pass, then decoded together one
// token per step with the KV cache until each stops. This is what `mxserve generate` uses until the
// continuous-batching engine lands; it is also the reference the engine's outputs are compared with.
#pragma once

#include <vector>

#include "model/model.h"
#include "runtime/sampler.h"

namespace mx {

struct GenerateRequest {
  std::vector<int32_t> prompt;
  int64_t max_new_tokens = 16;
  SamplingParams sampling;
  bool want_prompt_logits = false;  // logits at every prompt position (f32 [T, vocab])
};

struct GenerateResult {
  std::vector<int32_t> output_ids;
  std::vector<float> prompt_logits;  // [prompt length, vocab] when asked for
};

struct StaticGeneratorOptions {
  int64_t page_size = 16;
  std::vector<int64_t> stop_ids;  // generation stops after emitting one of these (it is kept in the output)
};

// Validates every request (ids inside the vocabulary, context length) before running anything.
Result<std::vector<GenerateResult>> generate_static(const Model& model, const std::vector<GenerateRequest>& requests,
                                                    const StaticGeneratorOptions& options);

}  // namespace mx
