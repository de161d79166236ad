// The tiny fixtures' transformers reference (tests/fixtures/<name>/reference.safetensors: prompts, greedy
// continuations, logits and hidden states) and what the tests run from it: greedy requests and one batched
// prefill; also the fixtures' names as a test parameter. Compiled into the unit, golden and GPU test
// binaries, which check CPU and CUDA against it.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/load_options.h"
#include "model/model.h"
#include "runtime/static_generator.h"

namespace mx::test {

// The fixtures (tests/fixtures/<name>) that tests parameterized by fixture run on: ValuesIn(kTinyFixtures),
// with FixtureParamName() naming the instances (gtest allows no '-' in names).
inline const std::vector<std::string> kTinyFixtures = {"tiny-gpt-oss", "tiny-gpt-oss-b"};
// The Gemma-4 fixtures (multimodal layout with hd 64/128, text-only in the released config spelling with hd 32/64).
inline const std::vector<std::string> kTinyGemma4Fixtures = {"tiny-gemma4", "tiny-gemma4-text"};
inline std::vector<std::string> all_tiny_fixtures() {
  std::vector<std::string> all = kTinyFixtures;
  all.insert(all.end(), kTinyGemma4Fixtures.begin(), kTinyGemma4Fixtures.end());
  return all;
}
struct FixtureParamName {
  std::string operator()(const ::testing::TestParamInfo<std::string>& info) const;
};

// The tensor-parallel splits every TP test runs (CPU against one rank, CUDA against transformers and graph
// replay): each fixture at the sizes its shapes allow, gpt-oss's in both MoE splits. tiny-gpt-oss-b's 3 KV
// heads split only 3 ways (its 192 expert channels are 3 slices of 64: one per rank); the others' 2 KV heads
// are replicated at 4 (a GQA group never straddles ranks), and 4 query heads allow no 3. Gemma-4's experts
// split by intermediate dimension only (kAuto: the family's default). `not_on_cuda` says why CUDA refuses a
// split the CPU runs (the GPU tests skip it saying so).
struct TensorParallelCase {
  std::string fixture;
  int tp = 1;
  MoeSplit moe_split = MoeSplit::kAuto;
  const char* not_on_cuda = nullptr;
};
inline const std::vector<TensorParallelCase> kTensorParallelCases = {
    {"tiny-gpt-oss", 2, MoeSplit::kByIntermediate},
    {"tiny-gpt-oss", 2, MoeSplit::kByExpert},
    {"tiny-gpt-oss", 4, MoeSplit::kByIntermediate},
    {"tiny-gpt-oss", 4, MoeSplit::kByExpert},
    {"tiny-gpt-oss-b", 3, MoeSplit::kByIntermediate},
    {"tiny-gpt-oss-b", 3, MoeSplit::kByExpert},
    {"tiny-gemma4", 2},
    {"tiny-gemma4", 4},
    {"tiny-gemma4-text", 2},
    {"tiny-gemma4-text", 4, MoeSplit::kAuto,
     "its 24-wide experts split 6 columns per rank at TP 4, and CUDA's bf16 experts take inner widths in "
     "multiples of 8 (the model refuses with that error when the engine makes its workspace)"}};
// "tiny_gpt_oss_tp2_by_expert": names the instances of a test parameterized by TensorParallelCase.
struct TensorParallelCaseName {
  std::string operator()(const ::testing::TestParamInfo<TensorParallelCase>& info) const;
};
// The command-line flag that asks for the case's MoE split ("" for kAuto).
std::string moe_split_flag(MoeSplit split);

// Relative L2 error of `got` against `want` (n values each); a non-finite value in `got` counts as a huge
// error, so NaN or inf output can never pass a tolerance.
double rel_l2(const float* got, const float* want, int64_t n);

// The values of an i32 tensor.
std::vector<int32_t> ids_of(const TensorView& t);

struct FixtureReference {
  std::unique_ptr<Checkpoint> file;           // everything by name: "prompt_<i>_logits", "prompt_<i>_hidden_<l>", ...
  std::vector<std::vector<int32_t>> prompts;  // "prompt_<i>_ids", i = 0, 1, ... while present
  std::vector<std::vector<int32_t>> greedy;   // "prompt_<i>_greedy": transformers' greedy continuation
};

// Reads reference.safetensors in `fixture_dir`; an error when it is missing, has no prompts, or a prompt
// lacks its greedy continuation.
Result<FixtureReference> load_fixture_reference(const std::string& fixture_dir);

// One greedy request per reference prompt, asking for as many tokens as transformers' continuation has.
std::vector<GenerateRequest> reference_greedy_requests(const FixtureReference& ref);

// One batched prefill of `prompts` on the model's backend: f32 logits of every prompt position, prompts in order.
// `observer` (optional) sees the hidden states as GptOssModel::forward reports them.
Result<std::vector<float>> prefill_logits(const Model& model, const std::vector<std::vector<int32_t>>& prompts,
                                          const HiddenObserver* observer = nullptr);

}  // namespace mx::test
