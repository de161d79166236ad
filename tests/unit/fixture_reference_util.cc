// See fixture_reference_util.h.
#include "fixture_reference_util.h"

#include <algorithm>
#include <cmath>

#include "runtime/batch_staging.h"

namespace mx::test {

double rel_l2(const float* got, const float* want, int64_t n) {
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    diff += std::isfinite(got[i]) ? d * d : 1e30;
    norm += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

namespace {

Result<std::vector<int32_t>> read_ids(const Checkpoint& file, const std::string& name) {
  MX_ASSIGN_OR_RETURN(TensorView t, file.get(name));
  if (t.dtype() != DType::kI32) return invalid_argument(name + " is " + dtype_name(t.dtype()) + ", not i32");
  return ids_of(t);
}

}  // namespace

namespace {

// gtest allows no '-' (nor spaces) in test names.
std::string test_name(std::string name) {
  std::replace(name.begin(), name.end(), '-', '_');
  std::replace(name.begin(), name.end(), ' ', '_');
  return name;
}

}  // namespace

std::string FixtureParamName::operator()(const ::testing::TestParamInfo<std::string>& info) const {
  return test_name(info.param);
}

std::string TensorParallelCaseName::operator()(const ::testing::TestParamInfo<TensorParallelCase>& info) const {
  const TensorParallelCase& c = info.param;
  return test_name(c.fixture + "_tp" + std::to_string(c.tp) +
                   (c.moe_split == MoeSplit::kAuto ? "" : std::string("_") + moe_split_name(c.moe_split)));
}

std::string moe_split_flag(MoeSplit split) {
  switch (split) {
    case MoeSplit::kAuto: return "";
    case MoeSplit::kByIntermediate: return "--no-enable-expert-parallel";
    case MoeSplit::kByExpert: return "--enable-expert-parallel";
  }
  return "";
}

std::vector<int32_t> ids_of(const TensorView& t) {
  return std::vector<int32_t>(t.ptr<const int32_t>(), t.ptr<const int32_t>() + t.numel());
}

Result<FixtureReference> load_fixture_reference(const std::string& fixture_dir) {
  MX_ASSIGN_OR_RETURN(Checkpoint file, Checkpoint::open_file(fixture_dir + "/reference.safetensors"));
  FixtureReference ref;
  ref.file = std::make_unique<Checkpoint>(std::move(file));
  for (int i = 0; ref.file->has("prompt_" + std::to_string(i) + "_ids"); ++i) {
    const std::string p = "prompt_" + std::to_string(i);
    MX_ASSIGN_OR_RETURN(std::vector<int32_t> prompt, read_ids(*ref.file, p + "_ids"));
    MX_ASSIGN_OR_RETURN(std::vector<int32_t> greedy, read_ids(*ref.file, p + "_greedy"));
    ref.prompts.push_back(std::move(prompt));
    ref.greedy.push_back(std::move(greedy));
  }
  if (ref.prompts.empty()) return invalid_argument(fixture_dir + "/reference.safetensors has no prompt_0_ids");
  return ref;
}

std::vector<GenerateRequest> reference_greedy_requests(const FixtureReference& ref) {
  std::vector<GenerateRequest> requests;
  for (size_t i = 0; i < ref.prompts.size(); ++i) {
    GenerateRequest r;
    r.prompt = ref.prompts[i];
    r.max_new_tokens = static_cast<int64_t>(ref.greedy[i].size());
    requests.push_back(r);
  }
  return requests;
}

Result<std::vector<float>> prefill_logits(const Model& model, const std::vector<std::vector<int32_t>>& prompts,
                                          const HiddenObserver* observer) {
  Backend& b = model.backend();
  const int64_t page_size = 16, n = static_cast<int64_t>(prompts.size()), vocab = model.dims().vocab_size;
  int64_t total = 0, max_pages = 0;
  for (const auto& p : prompts) {
    total += static_cast<int64_t>(p.size());
    max_pages = std::max<int64_t>(max_pages, (static_cast<int64_t>(p.size()) + page_size - 1) / page_size);
  }
  MX_ASSIGN_OR_RETURN(KvCache kv, KvCache::allocate(b, KvCacheShape::uniform(model.kv_layout(), n * max_pages, page_size)));
  // Pages handed out from the end, so a kernel that ignored the page table would read the wrong page.
  std::vector<std::vector<int32_t>> pages(prompts.size());
  int32_t next_page = static_cast<int32_t>(n * max_pages) - 1;
  std::vector<BatchSequence> seqs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    for (int64_t j = 0; j < max_pages; ++j) pages[i].push_back(next_page--);
    seqs.push_back({prompts[i], 0, pages[i], /*all_logits=*/true, false});
  }
  MX_ASSIGN_OR_RETURN(BatchStaging staging, BatchStaging::create(b, {total, n, max_pages, total}));
  MX_ASSIGN_OR_RETURN(BatchView batch, staging.stage(seqs));
  MX_ASSIGN_OR_RETURN(std::unique_ptr<ModelWorkspace> ws, model.make_workspace(total, total));
  MX_ASSIGN_OR_RETURN(Buffer logits_buf, b.allocate(total * vocab * 4));
  const TensorView logits = logits_buf.view(DType::kF32, {total, vocab});
  MX_RETURN_IF_ERROR(model.forward(batch, kv, *ws, logits, observer).status());
  std::vector<float> host(static_cast<size_t>(total * vocab));
  MX_RETURN_IF_ERROR(b.copy_to_host(host.data(), logits));
  return host;
}

}  // namespace mx::test
