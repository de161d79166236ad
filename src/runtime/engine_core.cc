// EngineCore: request validation at the door, the step, and turning request state into output deltas.
#include "runtime/engine_core.h"

#include <algorithm>

#include "core/log.h"

namespace mx {

Result<std::unique_ptr<EngineCore>> EngineCore::create(const Model& model, const EngineConfig& config,
                                                       DetokenizeFn detokenize) {
  // A draft model first: the window pools keep the keys it reads below the windows.
  std::unique_ptr<DraftModel> draft_model;
  EngineConfig wanted = config;
  if (uses_draft_model(config.speculative.algorithm) && config.speculative.enabled()) {
    MX_RETURN_IF_ERROR(validate_speculative_config(config.speculative));
    MX_ASSIGN_OR_RETURN(draft_model, load_draft_model(config.speculative.draft_model, model));
    const bool eagle3 = config.speculative.algorithm == SpeculativeAlgorithm::kEagle3;
    if (eagle3 != (draft_model->name() == "eagle3"))
      return invalid_argument(std::string("speculative algorithm ") + speculative_algorithm_name(config.speculative.algorithm) +
                              " cannot use the " + draft_model->name() + " draft model in " + config.speculative.draft_model);
    wanted.kv_window_slack = std::max(wanted.kv_window_slack, draft_model->window_slack());
  }
  MX_ASSIGN_OR_RETURN(EngineConfig resolved, resolve_engine_config(wanted, model));
  // The runner next: on a device it sizes the KV pool, which the scheduler's page pool then mirrors.
  MX_ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> runner, ModelRunner::create(model, &resolved, std::move(draft_model)));
  std::unique_ptr<EngineCore> core(new EngineCore(model, std::move(resolved), std::move(detokenize)));
  core->runner_ = std::move(runner);
  MX_LOG(Info) << describe_engine_config(core->config_);
  return core;
}

EngineCore::EngineCore(const Model& model, EngineConfig config, DetokenizeFn detokenize)
    : model_(model), config_(std::move(config)), detokenize_(std::move(detokenize)), scheduler_(config_),
      overlap_(config_.overlap_steps) {}

Status EngineCore::set_step_token_budget(int64_t tokens) {
  if (tokens < 1 || tokens > config_.max_num_batched_tokens)
    return invalid_argument("step token budget " + std::to_string(tokens) + " is outside [1, " +
                            std::to_string(config_.max_num_batched_tokens) + "] (max-num-batched-tokens)");
  scheduler_.set_token_budget(tokens);
  return Status::ok();
}

Status EngineCore::validate(const RequestInput& in) const {
  const int64_t len = static_cast<int64_t>(in.prompt.size());
  const int64_t vocab = config_.vocab_size;
  if (len == 0) return invalid_argument("the prompt is empty");
  for (int32_t id : in.prompt)
    if (id < 0 || id >= vocab)
      return invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
  for (int32_t id : in.stop_token_ids)
    if (id < 0) return invalid_argument("stop token id " + std::to_string(id) + " is negative");
  if (in.max_tokens && *in.max_tokens < 0) return invalid_argument("max_tokens must be >= 0");
  // Context first (the limit users know), then what this engine's KV pool can hold.
  const int64_t new_tokens = in.max_tokens.value_or(1);
  if (len + new_tokens > config_.model_context_len)
    return invalid_argument(std::to_string(len) + " prompt tokens + " + std::to_string(new_tokens) +
                            " new tokens exceed the context length " + std::to_string(config_.model_context_len));
  if (len + new_tokens > config_.max_model_len)
    return invalid_argument(std::to_string(len) + " prompt tokens + " + std::to_string(new_tokens) +
                            " new tokens exceed this engine's limit of " + std::to_string(config_.max_model_len) +
                            " tokens per request (max-model-len / KV pool size)");
  const SamplingParams& s = in.sampling;
  if (!(s.temperature >= 0.0f && s.temperature <= 100.0f)) return invalid_argument("temperature must be in [0, 100]");
  if (s.top_k < 0) return invalid_argument("top_k must be >= 0");
  if (!(s.top_p > 0.0f && s.top_p <= 1.0f)) return invalid_argument("top_p must be in (0, 1]");
  if (!(s.min_p >= 0.0f && s.min_p <= 1.0f)) return invalid_argument("min_p must be in [0, 1]");
  if (!(s.presence_penalty >= -2.0f && s.presence_penalty <= 2.0f)) return invalid_argument("presence_penalty must be in [-2, 2]");
  if (!(s.frequency_penalty >= -2.0f && s.frequency_penalty <= 2.0f)) return invalid_argument("frequency_penalty must be in [-2, 2]");
  if (!(s.repetition_penalty > 0.0f && s.repetition_penalty <= 10.0f)) return invalid_argument("repetition_penalty must be in (0, 10]");
  if (s.top_logprobs < 0 || s.top_logprobs > config_.max_top_logprobs)
    return invalid_argument("top_logprobs must be in [0, " + std::to_string(config_.max_top_logprobs) + "]");
  if (s.top_logprobs > 0 && !s.logprobs) return invalid_argument("top_logprobs needs logprobs");
  if ((!in.stop.empty() || in.return_text) && !detokenize_)
    return invalid_argument("stop strings and text output need a tokenizer, and this engine has none");
  for (const auto& stop : in.stop)
    if (stop.empty()) return invalid_argument("stop strings must not be empty");
  for (int32_t id : in.forced_tokens)
    if (id < 0 || id >= vocab)
      return invalid_argument("forced token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
  if (in.want_prompt_logits && config_.max_prompt_logit_rows == 0)
    return invalid_argument("prompt logits are not enabled on this engine");
  return Status::ok();
}

Status EngineCore::add_request(RequestId id, RequestInput input) {
  MX_RETURN_IF_ERROR(validate(input));
  if (requests_.count(id)) return invalid_argument("request id " + std::to_string(id) + " is already live");
  auto r = std::make_unique<Request>();
  r->id = id;
  r->arrival = next_arrival_++;
  r->prompt_len = static_cast<int64_t>(input.prompt.size());
  r->max_new_tokens = input.max_tokens.value_or(config_.max_model_len - r->prompt_len);
  if (!input.forced_tokens.empty())
    r->max_new_tokens = std::min(r->max_new_tokens, static_cast<int64_t>(input.forced_tokens.size()));
  const int64_t max_len = r->prompt_len + r->max_new_tokens;
  r->tokens.reserve(static_cast<size_t>(max_len));
  r->tokens = input.prompt;
  if (config_.speculative.enabled()) {
    r->verify_tokens.reserve(static_cast<size_t>(config_.speculative.num_draft_tokens + 1));
    r->draft_tokens.reserve(static_cast<size_t>(config_.speculative.num_draft_tokens));
  }
  scheduler_.pools().init_rows((max_len + config_.page_size - 1) / config_.page_size, &r->pages);
  r->rng = Rng(input.sampling.seed);
  if (input.sampling.logprobs) r->logprobs.reserve(static_cast<size_t>(r->max_new_tokens));
  if (input.want_prompt_logits) r->prompt_logits.assign(static_cast<size_t>(r->prompt_len * config_.vocab_size), 0.0f);
  if (!input.stop.empty() || input.return_text) {
    r->stop_matcher = StopStringMatcher(&detokenize_, input.stop, r->max_new_tokens);
    r->has_matcher = true;
  }
  r->usage.prompt_tokens = r->prompt_len;
  r->input = std::move(input);
  Request* raw = r.get();
  requests_.emplace(id, std::move(r));
  if (raw->max_new_tokens == 0 && !raw->input.want_prompt_logits) {
    raw->finish = FinishReason::kLength;  // nothing to compute
    raw->touched = true;
    touched_.push_back(raw);
    return Status::ok();
  }
  scheduler_.add(raw);
  return Status::ok();
}

void EngineCore::abort(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  scheduler_.abort(it->second.get());
  scheduler_.take_touched(&touched_);
}

void EngineCore::step(std::vector<RequestOutput>* outputs) {
  begin_step();
  finish_step(outputs);
}

void EngineCore::begin_step() {
  if (launched_) return;  // the previous finish_step launched it (overlapped steps)
  const ScheduledBatch& batch = scheduler_.schedule();
  launched_ = batch.empty() ? nullptr : &batch;
  launch_status_ = launched_ ? runner_->launch(batch) : Status::ok();
}

void EngineCore::finish_step(std::vector<RequestOutput>* outputs) {
  outputs->clear();
  if (launched_) {
    const ScheduledBatch& batch = *launched_;
    launched_ = nullptr;
    Status status = launch_status_;
    // Overlapped steps: the next decode step is scheduled and packed while this one runs, and launched as
    // soon as this one's samples are read (its tokens copied on the device), before the host applies them:
    // the device does not idle through the update, the outputs and the next step's scheduling and staging.
    const ScheduledBatch* next = nullptr;
    if (status.is_ok() && overlap_ && runner_->samples_on_device() && !runner_->profile_capture())
      next = scheduler_.schedule_ahead(batch);
    const Status prepared = next ? runner_->prepare(*next) : Status::ok();
    if (status.is_ok()) status = runner_->complete(batch, &sampled_);
    if (next && status.is_ok()) {
      launched_ = next;  // a failed prepare or launch fails its requests at the next finish_step
      launch_status_ = prepared.is_ok() ? runner_->launch_prepared(*next) : prepared;
    } else if (next) {
      scheduler_.drop_ahead(*next);
    }
    if (status.is_ok()) {
      scheduler_.update(batch, sampled_);
      if (runner_->has_draft_model()) {
        const Status drafted = runner_->draft(batch, [this](const Request& r) { return scheduler_.may_speculate(r); });
        if (!drafted.is_ok()) {
          MX_LOG(Warning) << "drafting failed; the requests decode without drafts: " << drafted.to_string();
        }
      }
    } else {
      MX_LOG(Error) << "forward pass failed, failing its " << batch.entries.size() << " requests: " << status.to_string();
      scheduler_.fail(batch, status.to_string());
    }
  }
  collect_outputs(outputs);
}

void EngineCore::collect_outputs(std::vector<RequestOutput>* outputs) {
  scheduler_.take_touched(&touched_);
  for (Request* r : touched_) {
    if (!r->touched) continue;  // listed twice
    r->touched = false;
    const bool done = r->finish != FinishReason::kNone;
    RequestOutput out;
    out.id = r->id;
    const int64_t generated = r->num_generated();
    const int64_t safe = done ? generated : (r->has_matcher ? r->stop_matcher.safe_tokens() : generated);
    if (safe > r->released_tokens) {
      auto gen = r->generated();
      out.token_ids.assign(gen.begin() + r->released_tokens, gen.begin() + safe);
      if (r->input.sampling.logprobs)
        out.logprobs.assign(r->logprobs.begin() + r->released_tokens, r->logprobs.begin() + safe);
      r->released_tokens = safe;
    }
    if (r->has_matcher) {
      const int64_t end = r->stop_matcher.safe_text_end();
      if (end > r->released_text) {
        out.text = r->stop_matcher.text().substr(static_cast<size_t>(r->released_text), static_cast<size_t>(end - r->released_text));
        r->released_text = end;
      }
    }
    out.finish = r->finish;
    out.stop_token = r->stop_token;
    if (r->has_matcher && r->stop_matcher.matched()) out.stop_string = r->stop_matcher.matched_stop();
    out.error = r->error;
    out.usage = r->usage;
    out.num_preemptions = r->num_preemptions;
    out.first_scheduled = r->first_scheduled;
    if (done) out.prompt_logits = std::move(r->prompt_logits);
    if (done || !out.token_ids.empty() || !out.text.empty()) outputs->push_back(std::move(out));
    if (done) finished_ids_.push_back(r->id);
  }
  // Finished requests are forgotten only now, so a request listed twice above is never read after free, and
  // not before an overlapped step in flight that may list them has been applied.
  for (RequestId id : retired_ids_) requests_.erase(id);
  retired_ids_.clear();
  if (launched_) retired_ids_.swap(finished_ids_);
  for (RequestId id : finished_ids_) requests_.erase(id);
  finished_ids_.clear();
  touched_.clear();
}

EngineStats EngineCore::stats() const {
  EngineStats s;
  s.num_running = static_cast<int64_t>(scheduler_.running().size());
  s.num_waiting = static_cast<int64_t>(scheduler_.waiting().size());
  const KvPools& pools = scheduler_.pools();
  const PagePool& context = pools.context_pool();
  s.num_pages = context.num_pages();
  s.pages_used = context.num_used();
  s.pages_free = context.num_free();
  s.pages_cached = context.num_cached();
  for (int64_t g = 0; g < pools.num_groups(); ++g) s.group_pages_used.push_back(pools.pool(g).num_used());
  s.scheduler = scheduler_.stats();
  return s;
}

}  // namespace mx
