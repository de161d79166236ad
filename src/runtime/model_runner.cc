// One step on the device: stage -> forward -> sample on the device (ids back) or logits to host -> sample
// per request.
#include "runtime/model_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace mx {
namespace {

// Test-only forced output: the id replaces the sampled one; its logprob is the model's (log-softmax of the
// raw logits, as the sampler reports logprobs), the alternatives stay the model's top ones.
void force_token(const float* logits, int64_t vocab, int32_t id, bool logprobs, SampledToken* out) {
  out->token = id;
  if (!logprobs) return;
  float max_logit = logits[0];
  for (int64_t i = 1; i < vocab; ++i) max_logit = std::max(max_logit, logits[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i] - max_logit));
  out->logprob = static_cast<float>(static_cast<double>(logits[id] - max_logit) - std::log(sum));
}

}  // namespace

Result<std::unique_ptr<ModelRunner>> ModelRunner::create(const GptOssModel& model, const EngineConfig& config) {
  Backend& backend = model.backend();
  const int64_t vocab = model.config().vocab_size;
  // Logits rows: one sampled row per running request, plus the prompt-logits rows a step may carry.
  const int64_t rows = config.max_running_requests + config.max_prompt_logit_rows;
  const int64_t max_tokens = config.max_num_batched_tokens;
  const BatchLimits limits{max_tokens, config.max_running_requests,
                           (config.max_model_len + config.page_size - 1) / config.page_size, rows};
  MX_ASSIGN_OR_RETURN(KvCache kv, KvCache::allocate(backend, model.kv_cache_shape(config.num_kv_pages, config.page_size)));
  MX_ASSIGN_OR_RETURN(BatchStaging staging, BatchStaging::create(backend, limits));
  MX_ASSIGN_OR_RETURN(ForwardWorkspace ws, model.make_workspace(max_tokens, rows));
  MX_ASSIGN_OR_RETURN(Buffer logits, backend.allocate(rows * vocab * static_cast<int64_t>(sizeof(float))));
  std::unique_ptr<ModelRunner> runner(
      new ModelRunner(model, config, std::move(kv), std::move(staging), std::move(ws), std::move(logits)));
  runner->max_logit_rows_ = rows;
  MX_ASSIGN_OR_RETURN(runner->sample_params_device_,
                      backend.allocate(rows * static_cast<int64_t>(sizeof(SampleRowParams))));
  MX_ASSIGN_OR_RETURN(runner->sample_out_device_, backend.allocate(2 * rows * 4));
  runner->sample_params_host_.resize(static_cast<size_t>(rows));
  runner->sample_out_host_.resize(static_cast<size_t>(2 * rows));
  runner->logits_host_.assign(static_cast<size_t>(rows * vocab), 0.0f);
  runner->seqs_.reserve(static_cast<size_t>(config.max_running_requests));
  return runner;
}

bool ModelRunner::can_use_sample_op(const ScheduledBatch& batch) {
  for (const ScheduledEntry& e : batch.entries) {
    const SamplingParams& p = e.request->input.sampling;
    const bool host_only = p.has_penalties() || p.top_logprobs > 0 || !e.request->input.forced_tokens.empty();
    if (e.all_logits || (e.sample && host_only)) return false;
  }
  return true;
}

// Without prompt logits, the logits rows are the sampling entries in order (then any padding rows, which
// are sampled greedily and ignored).
Status ModelRunner::sample_with_op(const ScheduledBatch& batch, const TensorView& logits,
                                   std::vector<SampledToken>* sampled) {
  Backend& b = model_.backend();
  const int64_t rows = logits.dim(0);
  if (rows < batch.num_samples) return internal_error("fewer logits rows than sampled entries");
  std::fill(sample_params_host_.begin(), sample_params_host_.begin() + rows, SampleRowParams{});
  int64_t k = 0;
  for (const ScheduledEntry& e : batch.entries)
    if (e.sample) sample_params_host_[static_cast<size_t>(k++)] = sample_row_params(e.request->input.sampling, e.request->rng);
  const TensorView params = sample_params_device_.view(DType::kU8, {rows, static_cast<int64_t>(sizeof(SampleRowParams))});
  const TensorView out = sample_out_device_.view(DType::kI32, {2 * rows});
  const TensorView tokens = out.rows(0, rows);
  const TensorView logprobs(out.rows(rows, 2 * rows).data(), DType::kF32, {rows}, out.device());
  MX_RETURN_IF_ERROR(b.copy_from_host(params, sample_params_host_.data()));
  bool want_logprobs = false;
  for (const ScheduledEntry& e : batch.entries) want_logprobs |= e.sample && e.request->input.sampling.logprobs;
  MX_RETURN_IF_ERROR(b.sample({logits, params, tokens, want_logprobs ? logprobs : TensorView()}));
  MX_RETURN_IF_ERROR(b.copy_to_host(sample_out_host_.data(), out));
  sampled->resize(static_cast<size_t>(batch.num_samples));
  k = 0;
  for (const ScheduledEntry& e : batch.entries) {
    if (!e.sample) continue;
    SampledToken& t = (*sampled)[static_cast<size_t>(k)];
    t.token = sample_out_host_[static_cast<size_t>(k)];
    std::memcpy(&t.logprob, &sample_out_host_[static_cast<size_t>(rows + k)], sizeof(float));
    t.top.clear();
    e.request->rng.advance();
    ++k;
  }
  ++sample_op_steps_;
  return Status::ok();
}

Status ModelRunner::execute(const ScheduledBatch& batch, std::vector<SampledToken>* sampled) {
  const int64_t vocab = model_.config().vocab_size;
  seqs_.clear();
  for (const ScheduledEntry& e : batch.entries) {
    const Request& r = *e.request;
    BatchSequence s;
    s.tokens = std::span<const int32_t>(r.tokens).subspan(static_cast<size_t>(e.start), static_cast<size_t>(e.num_tokens));
    s.start_position = e.start;
    s.pages = r.pages;
    s.all_logits = e.all_logits;
    s.no_logits = !e.all_logits && !e.sample;
    seqs_.push_back(s);
  }
  MX_ASSIGN_OR_RETURN(BatchView view, staging_.stage(seqs_));
  if (view.num_logit_rows > max_logit_rows_) return internal_error("step needs more logits rows than allocated");
  TensorView logits = logits_device_.view(DType::kF32, {view.num_logit_rows, vocab});
  MX_RETURN_IF_ERROR(model_.forward(view, kv_, ws_, logits));
  if (view.num_logit_rows > 0 && can_use_sample_op(batch)) return sample_with_op(batch, logits, sampled);
  if (view.num_logit_rows > 0) MX_RETURN_IF_ERROR(model_.backend().copy_to_host(logits_host_.data(), logits));

  sampled->resize(static_cast<size_t>(batch.num_samples));
  int64_t row = 0, k = 0;
  for (const ScheduledEntry& e : batch.entries) {
    Request& r = *e.request;
    int64_t sample_row = row;
    if (e.all_logits) {
      // Rows are positions start .. start + n - 1; keep the prompt's, once (recomputation repeats them).
      const int64_t first = std::max(e.start, r.prompt_logits_filled);
      const int64_t last = std::min(e.start + e.num_tokens, r.prompt_len);
      for (int64_t pos = first; pos < last; ++pos) {
        const float* src = logits_host_.data() + (row + pos - e.start) * vocab;
        std::copy(src, src + vocab, r.prompt_logits.begin() + pos * vocab);
      }
      r.prompt_logits_filled = std::max(r.prompt_logits_filled, last);
      row += e.num_tokens;
      sample_row = row - 1;
    } else if (e.sample) {
      ++row;
    }
    if (!e.sample) continue;
    const PenaltyContext penalties{std::span<const int32_t>(r.tokens).first(static_cast<size_t>(r.prompt_len)),
                                   r.generated()};
    const float* row_logits = logits_host_.data() + sample_row * vocab;
    SampledToken& out = (*sampled)[static_cast<size_t>(k++)];
    sampler_.sample(row_logits, r.input.sampling, penalties, r.rng, &out);
    const size_t g = static_cast<size_t>(r.num_generated());
    if (g < r.input.forced_tokens.size()) force_token(row_logits, vocab, r.input.forced_tokens[g], r.input.sampling.logprobs, &out);
  }
  return Status::ok();
}

}  // namespace mx
