// Requests -> prompt ids -> context check -> engine requests (one per choice), on the io thread.
#include "server/engine_completion_service.h"

#include <algorithm>
#include <functional>
#include <random>

#include "server/chat_prompt.h"
#include "server/generation_job.h"

namespace mx::server {
namespace {

struct Prompt {
  std::vector<int32_t> ids;
  std::string match_text;  // what a forced transcript (test only) is chosen by
  std::string echo;        // completions with echo
};

// OpenAI's wording: clients (litellm, agent frameworks) parse these numbers to shrink the request.
std::optional<ApiError> check_context(int64_t context, int64_t prompt, const std::optional<int64_t>& max_tokens,
                                      int64_t* resolved) {
  if (max_tokens) {
    if (prompt + *max_tokens <= context) {
      *resolved = *max_tokens;
      return std::nullopt;
    }
    return ApiError::invalid_request("This model's maximum context length is " + std::to_string(context) +
                                         " tokens. However, you requested " + std::to_string(prompt + *max_tokens) +
                                         " tokens (" + std::to_string(prompt) + " in the messages, " +
                                         std::to_string(*max_tokens) +
                                         " in the completion). Please reduce the length of the messages or completion.",
                                     "messages", "context_length_exceeded");
  }
  if (prompt < context) {
    *resolved = context - prompt;
    return std::nullopt;
  }
  return ApiError::invalid_request("This model's maximum context length is " + std::to_string(context) +
                                       " tokens. However, your messages resulted in " + std::to_string(prompt) +
                                       " tokens. Please reduce the length of the messages.",
                                   "messages", "context_length_exceeded");
}

// `chat_stop_ids`: the format's end-of-turn ids (chat only; completions stop at the engine's eos ids).
RequestInput engine_input(const SamplingOptions& s, const std::vector<int32_t>* chat_stop_ids, int64_t max_tokens,
                          uint64_t seed) {
  const bool chat = chat_stop_ids != nullptr;
  RequestInput in;
  in.max_tokens = max_tokens;
  in.sampling.temperature = static_cast<float>(s.temperature);
  in.sampling.top_p = static_cast<float>(s.top_p);
  in.sampling.top_k = std::max<int64_t>(s.top_k, 0);
  in.sampling.min_p = static_cast<float>(s.min_p);
  in.sampling.presence_penalty = static_cast<float>(s.presence_penalty);
  in.sampling.frequency_penalty = static_cast<float>(s.frequency_penalty);
  in.sampling.logprobs = s.logprobs;
  in.sampling.top_logprobs = s.top_logprobs;
  in.sampling.seed = seed;
  if (!chat) in.stop = s.stop;  // chat: matched on content by the job (content_stop.h)
  in.ignore_eos = s.ignore_eos;
  // The format's end-of-turn ids (Harmony: <|return|>, <|call|>, never <|end|>), whatever the checkpoint's
  // generation_config lists.
  if (chat && !s.ignore_eos) in.stop_token_ids = *chat_stop_ids;
  if (!chat) in.return_text = true;
  return in;
}

uint64_t random_seed() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

// splitmix64: spreads consecutive counters over the seed space.
uint64_t mix_seed(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t EngineCompletionService::next_seed() {
  if (!options_.seed) return random_seed();
  return mix_seed(*options_.seed + seed_counter_.fetch_add(1, std::memory_order_relaxed));
}

EngineCompletionService::EngineCompletionService(Engine& engine, std::shared_ptr<const ChatFormat> format,
                                                 EngineServiceOptions options)
    : engine_(engine), format_(std::move(format)), tokenizer_(format_, &format_->tokenizer()), structured_(format_),
      options_(options),
      context_length_(options.context_length > 0 ? std::min(options.context_length, engine.config().max_model_len)
                                                  : engine.config().max_model_len) {}

EngineCompletionService::~EngineCompletionService() {
  std::unordered_map<const GenerationJob*, std::shared_ptr<GenerationJob>> jobs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs.swap(jobs_);
  }
}

void EngineCompletionService::adopt(const std::shared_ptr<GenerationJob>& job) {
  std::lock_guard<std::mutex> lock(mu_);
  jobs_.emplace(job.get(), job);
}

void EngineCompletionService::release(const GenerationJob* job) {
  std::shared_ptr<GenerationJob> keep;  // destroyed outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return;
  keep = std::move(it->second);
  jobs_.erase(it);
}

int64_t EngineCompletionService::live_jobs() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(jobs_.size());
}

std::optional<ApiError> EngineCompletionService::tokenize(const std::optional<ChatRequest>& chat, const std::string& prompt,
                                                          std::vector<int32_t>* ids) const {
  if (chat) return render_chat_prompt(*format_, *chat, ids);
  *ids = tokenizer_->encode(prompt, SpecialTokens::kAllow);  // as completions encode raw model text
  return std::nullopt;
}

std::optional<ApiError> EngineCompletionService::detokenize(const std::vector<int64_t>& ids, std::string* text) const {
  std::vector<int32_t> narrow;
  const int64_t vocab = tokenizer_->vocab_size();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      return ApiError::invalid_request("Token id " + std::to_string(ids[i]) + " is outside the vocabulary [0, " +
                                           std::to_string(vocab) + ").",
                                       "tokens[" + std::to_string(i) + "]");
    }
    narrow.push_back(static_cast<int32_t>(ids[i]));
  }
  auto decoded = tokenizer_->decode(narrow);
  if (!decoded.is_ok()) return ApiError::invalid_request(decoded.status().message(), "tokens");
  *text = std::move(decoded).value();
  return std::nullopt;
}

ServiceStats EngineCompletionService::stats() const {
  const EngineStats s = engine_.stats();
  ServiceStats out;
  out.running = s.num_running;
  out.waiting = s.num_waiting;
  out.kv_cache_usage = s.num_pages > 0 ? static_cast<double>(s.pages_used) / static_cast<double>(s.num_pages) : 0.0;
  out.preemptions_total = s.scheduler.preemptions;
  out.prefix_query_tokens = s.scheduler.prefix_query_tokens;
  out.prefix_hit_tokens = s.scheduler.prefix_hit_tokens;
  out.spec_drafts = s.scheduler.spec_drafts;
  out.spec_draft_tokens = s.scheduler.spec_draft_tokens;
  out.spec_accepted_tokens = s.scheduler.spec_accepted_tokens;
  out.spec_accepted_per_pos = s.scheduler.spec_accepted_per_pos;
  const EngineConfig& config = engine_.config();
  out.page_size = config.page_size;
  out.num_pages = s.num_pages;
  out.prefix_caching = config.enable_prefix_cache;
  out.kv_cache_dtype = "auto";  // the backend's activation dtype (bf16 on CUDA, f32 on the CPU)
  out.mem_fraction = config.mem_fraction;
  return out;
}

namespace {

// Shared by both endpoints: one engine request per (prompt, sample), choice index prompt * n + sample.
std::optional<ApiError> build_choices(int64_t context_length, const std::vector<int32_t>* chat_stop_ids,
                                      const std::vector<Prompt>& prompts,
                                      const SamplingOptions& sampling, const ForcedTranscripts* forced,
                                      std::vector<JobChoice>* choices,
                                      const std::function<uint64_t()>& draw_seed) {
  const bool chat = chat_stop_ids != nullptr;
  for (size_t p = 0; p < prompts.size(); ++p) {
    int64_t max_tokens = 0;
    if (auto error = check_context(context_length, static_cast<int64_t>(prompts[p].ids.size()), sampling.max_tokens,
                                   &max_tokens)) {
      if (!chat) error->param = "prompt";
      return error;
    }
    const std::vector<int32_t>* forced_ids = forced ? forced->select(prompts[p].match_text) : nullptr;
    for (int64_t s = 0; s < sampling.n; ++s) {
      JobChoice c;
      const uint64_t seed = sampling.seed ? *sampling.seed + static_cast<uint64_t>(s) : draw_seed();
      c.input = engine_input(sampling, chat_stop_ids, max_tokens, seed);
      c.input.prompt = prompts[p].ids;
      if (forced_ids) c.input.forced_tokens = *forced_ids;
      c.index = static_cast<int64_t>(p) * sampling.n + s;
      c.counts_prompt = s == 0;
      c.echo = prompts[p].echo;
      if (chat) c.content_stops = sampling.stop;
      choices->push_back(std::move(c));
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> EngineCompletionService::start_chat(const ChatRequest& request,
                                                            std::shared_ptr<GenerationStream> stream) {
  Prompt prompt;
  if (auto error = render_chat_prompt(*format_, request, &prompt.ids)) return error;
  for (auto it = request.messages.rbegin(); it != request.messages.rend(); ++it)
    if (it->role == ChatRole::kUser) {
      prompt.match_text = it->content;
      break;
    }
  std::vector<JobChoice> choices;
  if (auto error = build_choices(context_length_, &format_->stop_ids(), {prompt}, request.sampling, options_.forced, &choices, [this] { return next_seed(); })) return error;
  std::shared_ptr<const TurnConstraintPlan> plan;
  if (auto error = structured_.plan_for(request, &plan)) return error;
  if (plan)
    for (JobChoice& c : choices) c.input.constraint = plan->make(StructuredOutputs::reasoning_budget(request, c.input.max_tokens.value_or(0)));
  return launch(GenerationJob::Kind::kChat, std::move(choices), std::move(stream));
}

std::optional<ApiError> EngineCompletionService::start_completion(const CompletionRequest& request,
                                                                  std::shared_ptr<GenerationStream> stream) {
  std::vector<Prompt> prompts;
  const int64_t vocab = tokenizer_->vocab_size();
  for (size_t i = 0; i < request.prompts.size(); ++i) {
    const CompletionPrompt& p = request.prompts[i];
    Prompt prompt;
    const std::string param = request.prompts.size() == 1 ? "prompt" : "prompt[" + std::to_string(i) + "]";
    if (p.is_tokens) {
      for (int64_t id : p.token_ids) {
        if (id < 0 || id >= vocab)
          return ApiError::invalid_request("Token id " + std::to_string(id) + " in '" + param +
                                               "' is outside the vocabulary [0, " + std::to_string(vocab) + ").",
                                           param);
        prompt.ids.push_back(static_cast<int32_t>(id));
      }
      if (request.echo) {
        auto text = tokenizer_->decode(prompt.ids);
        if (text.is_ok()) prompt.echo = std::move(text).value();
      }
    } else {
      // Completions take raw model text: the format's special tokens written out in it are recognised.
      prompt.ids = tokenizer_->encode(p.text, SpecialTokens::kAllow);
      prompt.match_text = p.text;
      if (request.echo) prompt.echo = p.text;
    }
    if (prompt.ids.empty()) return ApiError::invalid_request("'" + param + "' must not be empty.", param);
    prompts.push_back(std::move(prompt));
  }
  std::vector<JobChoice> choices;
  if (auto error = build_choices(context_length_, nullptr, prompts, request.sampling, options_.forced, &choices, [this] { return next_seed(); })) return error;
  std::shared_ptr<const TextPlan> plan;
  if (auto error = structured_.plan_for_text(request.output, engine_.config().eos_token_ids.value_or(std::vector<int32_t>{}), &plan))
    return error;
  if (plan)
    for (JobChoice& c : choices) c.input.constraint = StructuredOutputs::make_constraint(plan);
  return launch(GenerationJob::Kind::kCompletion, std::move(choices), std::move(stream));
}

std::optional<ApiError> EngineCompletionService::launch(GenerationJob::Kind kind, std::vector<JobChoice> choices,
                                                        std::shared_ptr<GenerationStream> stream) {
  auto job = std::make_shared<GenerationJob>(this, kind, std::move(stream));
  adopt(job);  // before start: the engine may finish it before start() returns
  auto error = job->start(std::move(choices));
  if (error) release(job.get());
  return error;
}

}  // namespace mx::server
