#include "runtime/static_generator.h"

#include <algorithm>
#include <numeric>

#include "runtime/batch_staging.h"

namespace mx {

Result<std::vector<GenerateResult>> generate_static(const Model& model, const std::vector<GenerateRequest>& requests,
                                                    const StaticGeneratorOptions& options) {
  const ModelDims& c = model.dims();
  Backend& backend = model.backend();
  const int64_t n = static_cast<int64_t>(requests.size());
  if (n == 0) return std::vector<GenerateResult>{};
  int64_t prompt_tokens = 0, prompt_logit_rows = 0, max_len = 0;
  for (int64_t i = 0; i < n; ++i) {
    const auto& r = requests[static_cast<size_t>(i)];
    const std::string which = "prompt " + std::to_string(i);
    if (r.prompt.empty()) return invalid_argument(which + " is empty");
    if (r.max_new_tokens < 0) return invalid_argument(which + ": max_new_tokens must be >= 0");
    for (int32_t id : r.prompt)
      if (id < 0 || id >= c.vocab_size)
        return invalid_argument(which + ": token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                std::to_string(c.vocab_size) + ")");
    const int64_t total = static_cast<int64_t>(r.prompt.size()) + r.max_new_tokens;
    if (total > c.context_len)
      return invalid_argument(which + ": " + std::to_string(r.prompt.size()) + " prompt tokens + " +
                              std::to_string(r.max_new_tokens) + " new tokens exceed the context length " +
                              std::to_string(c.context_len));
    prompt_tokens += static_cast<int64_t>(r.prompt.size());
    prompt_logit_rows += r.want_prompt_logits ? static_cast<int64_t>(r.prompt.size()) : 1;
    max_len = std::max(max_len, total);
  }

  // Each sequence owns a fixed run of pages large enough for its whole prompt and output.
  const int64_t page_size = options.page_size;
  const int64_t pages_per_seq = (max_len + page_size - 1) / page_size;
  MX_ASSIGN_OR_RETURN(KvCache kv, KvCache::allocate(backend, KvCacheShape::uniform(model.kv_layout(), pages_per_seq * n, page_size)));
  std::vector<std::vector<int32_t>> page_rows(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    page_rows[static_cast<size_t>(i)].resize(static_cast<size_t>(pages_per_seq));
    std::iota(page_rows[static_cast<size_t>(i)].begin(), page_rows[static_cast<size_t>(i)].end(),
              static_cast<int32_t>(i * pages_per_seq));
  }
  const int64_t max_rows = std::max(prompt_logit_rows, n);
  const BatchLimits limits{std::max(prompt_tokens, n), n, pages_per_seq, max_rows};
  MX_ASSIGN_OR_RETURN(BatchStaging staging, BatchStaging::create(backend, limits));
  MX_ASSIGN_OR_RETURN(std::unique_ptr<ModelWorkspace> ws, model.make_workspace(limits.max_tokens, max_rows));
  MX_ASSIGN_OR_RETURN(Buffer logits_buffer, backend.allocate(max_rows * c.vocab_size * 4));
  std::vector<float> logits(static_cast<size_t>(max_rows * c.vocab_size));

  std::vector<GenerateResult> results(static_cast<size_t>(n));
  std::vector<Rng> rngs;
  for (const auto& r : requests) rngs.emplace_back(r.sampling.seed);
  std::vector<bool> done(static_cast<size_t>(n), false);
  std::vector<int32_t> last_token(static_cast<size_t>(n));

  // Samples each listed sequence's next token from its logits row; marks it done at a stop id or the limit.
  auto sample_rows = [&](const std::vector<int64_t>& seqs, const std::vector<int64_t>& rows) {
    for (size_t j = 0; j < seqs.size(); ++j) {
      const auto i = static_cast<size_t>(seqs[j]);
      const auto& req = requests[i];
      auto& out = results[i].output_ids;
      if (static_cast<int64_t>(out.size()) >= req.max_new_tokens) {
        done[i] = true;
        continue;
      }
      const int32_t token = sample_token(logits.data() + rows[j] * c.vocab_size, c.vocab_size, req.sampling, rngs[i]);
      out.push_back(token);
      last_token[i] = token;
      const bool stop = std::find(options.stop_ids.begin(), options.stop_ids.end(), token) != options.stop_ids.end();
      if (stop || static_cast<int64_t>(out.size()) >= req.max_new_tokens) done[i] = true;
    }
  };

  // Prefill: every prompt in one pass.
  std::vector<BatchSequence> seqs;
  std::vector<int64_t> order, rows;
  int64_t row = 0;
  for (int64_t i = 0; i < n; ++i) {
    const auto& r = requests[static_cast<size_t>(i)];
    seqs.push_back({r.prompt, 0, page_rows[static_cast<size_t>(i)], r.want_prompt_logits, false});
    order.push_back(i);
    row += r.want_prompt_logits ? static_cast<int64_t>(r.prompt.size()) : 1;
    rows.push_back(row - 1);  // the last prompt position predicts the first new token
  }
  MX_ASSIGN_OR_RETURN(BatchView batch, staging.stage(seqs));
  TensorView logits_view = logits_buffer.view(DType::kF32, {batch.num_logit_rows, c.vocab_size});
  MX_RETURN_IF_ERROR(model.forward(batch, kv, *ws, logits_view).status());
  MX_RETURN_IF_ERROR(backend.copy_to_host(logits.data(), logits_view));
  row = 0;
  for (int64_t i = 0; i < n; ++i) {
    const auto& r = requests[static_cast<size_t>(i)];
    if (!r.want_prompt_logits) {
      ++row;
      continue;
    }
    const int64_t len = static_cast<int64_t>(r.prompt.size());
    results[static_cast<size_t>(i)].prompt_logits.assign(logits.begin() + row * c.vocab_size,
                                                         logits.begin() + (row + len) * c.vocab_size);
    row += len;
  }
  sample_rows(order, rows);

  // Decode: one token per unfinished sequence per step.
  while (true) {
    seqs.clear();
    order.clear();
    rows.clear();
    for (int64_t i = 0; i < n; ++i) {
      if (done[static_cast<size_t>(i)]) continue;
      const auto& r = requests[static_cast<size_t>(i)];
      const int64_t position = static_cast<int64_t>(r.prompt.size() + results[static_cast<size_t>(i)].output_ids.size()) - 1;
      seqs.push_back({std::span<const int32_t>(&last_token[static_cast<size_t>(i)], 1), position,
                      page_rows[static_cast<size_t>(i)], false, false});
      rows.push_back(static_cast<int64_t>(order.size()));
      order.push_back(i);
    }
    if (seqs.empty()) break;
    MX_ASSIGN_OR_RETURN(batch, staging.stage(seqs));
    logits_view = logits_buffer.view(DType::kF32, {batch.num_logit_rows, c.vocab_size});
    MX_RETURN_IF_ERROR(model.forward(batch, kv, *ws, logits_view).status());
    MX_RETURN_IF_ERROR(backend.copy_to_host(logits.data(), logits_view));
    sample_rows(order, rows);
  }
  return results;
}

}  // namespace mx
