// Engine output -> GenerationStream events, on the connection's strand.
#include "server/generation_job.h"


#include "server/engine_completion_service.h"
#include "server/openai_response.h"

namespace mx::server {
namespace {

ApiError refusal(const Status& status) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument: return ApiError::invalid_request(status.message());
    case StatusCode::kResourceExhausted: return ApiError::unavailable("The engine is at capacity: " + status.message() + ".", "queue_full");
    default: return ApiError::unavailable("The engine cannot take requests: " + status.message() + ".");
  }
}

FinishReason finish_reason(mx::FinishReason reason) {
  switch (reason) {
    case mx::FinishReason::kLength: return FinishReason::kLength;
    case mx::FinishReason::kAbort: return FinishReason::kAbort;
    case mx::FinishReason::kError: return FinishReason::kError;
    default: return FinishReason::kStop;
  }
}

// What kind of text a delta carries: one kind per delta keeps the order of reasoning, content and tool
// calls as the model wrote them (the Responses formatter opens output items in delta order).
enum class DeltaKind { kNone, kReasoning, kContent, kTool };

}  // namespace

GenerationJob::GenerationJob(EngineCompletionService* service, Kind kind, std::shared_ptr<GenerationStream> stream)
    : service_(service), kind_(kind), stream_(std::move(stream)) {}

std::optional<ApiError> GenerationJob::start(std::vector<JobChoice> specs) {
  Engine& engine = service_->engine_;
  choices_.reserve(specs.size());
  for (JobChoice& spec : specs) {
    Choice c;
    c.logprobs = spec.input.sampling.logprobs;
    auto added = engine.add_request(std::move(spec.input));
    if (!added.is_ok()) {
      abort_all();
      return refusal(added.status());
    }
    c.stop = ContentStopMatcher(std::move(spec.content_stops));
    c.spec = std::move(spec);
    c.id = (*added)->id();
    c.stream = std::move(added).value();
    if (kind_ == Kind::kChat) c.parser = service_->format_->make_parser();
    choices_.push_back(std::move(c));
  }
  // Weak: the engine keeps its streams (and so their callbacks) until the requests finish.
  std::weak_ptr<GenerationJob> weak = weak_from_this();
  for (Choice& c : choices_)
    c.stream->set_notify([weak] {
      if (auto self = weak.lock()) self->schedule_drain();
    });
  stream_->on_cancel([weak] {
    if (auto self = weak.lock()) self->abort_all();
  });
  schedule_drain();  // output delivered before the callbacks were set
  return std::nullopt;
}

void GenerationJob::schedule_drain() {
  if (drain_pending_.exchange(true)) return;
  stream_->post([self = shared_from_this()] { self->drain(); });
}

void GenerationJob::drain() {
  drain_pending_.store(false);  // before polling: a delivery from now on posts another drain
  if (ended_) return;
  RequestOutput out;
  bool all_finished = true;
  for (Choice& c : choices_) {
    if (!c.finished && c.stream->poll(&out)) {
      process(c, out);
      if (ended_) return;
    }
    all_finished = all_finished && c.finished;
  }
  if (!all_finished) return;
  GenerationUsage usage;
  for (const Choice& c : choices_) {
    if (c.spec.counts_prompt) {
      usage.prompt_tokens += c.usage.prompt_tokens;
      usage.cached_tokens += c.usage.cached_prompt_tokens;
    }
    usage.completion_tokens += c.usage.completion_tokens;
    usage.reasoning_tokens += c.reasoning_tokens;
  }
  stream_->done(usage);
  end();
}

void GenerationJob::process(Choice& c, RequestOutput& out) {
  if (out.finish == mx::FinishReason::kError) return fail("Generation failed: " + out.error);
  c.usage = out.usage;
  if (out.first_scheduled != std::chrono::steady_clock::time_point{}) stream_->scheduled(out.first_scheduled);
  if (kind_ == Kind::kChat) {
    chat_tokens(c, out);
  } else {
    GenerationDelta d;
    d.choice = c.spec.index;
    d.num_tokens = static_cast<int64_t>(out.token_ids.size());
    d.content = std::move(c.spec.echo);
    c.spec.echo.clear();
    d.content += out.text;
    if (c.logprobs)
      for (const SampledToken& s : out.logprobs) d.logprobs.push_back(logprob_info(s));
    if (d.num_tokens > 0 || !d.content.empty()) stream_->delta(std::move(d));
  }
  if (out.finished()) {
    c.finished = true;
    stream_->finish_choice(c.spec.index, c.stopped_by_string ? FinishReason::kStop : finish_reason(out.finish));
  }
}

void GenerationJob::chat_tokens(Choice& c, const RequestOutput& out) {
  std::vector<GenerationDelta> deltas;
  DeltaKind kind = DeltaKind::kNone;
  auto delta_for = [&](DeltaKind k) -> GenerationDelta& {
    if (deltas.empty() || kind != k) {
      deltas.emplace_back();
      deltas.back().choice = c.spec.index;
      kind = k;
    }
    return deltas.back();
  };
  auto apply = [&](const ChatEvent& e, const SampledToken* logprob) {
    switch (e.type) {
      case ChatEventType::kReasoningDelta: delta_for(DeltaKind::kReasoning).reasoning += e.text; break;
      case ChatEventType::kContentDelta: {
        GenerationDelta& d = delta_for(DeltaKind::kContent);
        d.content += e.text;
        // Tokens that produced no text yet (the first bytes of a character) belong to this text.
        for (const SampledToken& held : c.held_logprobs) d.logprobs.push_back(logprob_info(held));
        c.held_logprobs.clear();
        if (logprob) d.logprobs.push_back(logprob_info(*logprob));
        break;
      }
      case ChatEventType::kToolCallStart:
        delta_for(DeltaKind::kTool).tool_calls.push_back({e.tool_index, random_id("call_"), e.text, ""});
        break;
      case ChatEventType::kToolCallArgumentsDelta: {
        GenerationDelta& d = delta_for(DeltaKind::kTool);
        if (d.tool_calls.empty() || d.tool_calls.back().index != e.tool_index) d.tool_calls.push_back({e.tool_index, "", "", ""});
        d.tool_calls.back().arguments += e.text;
        break;
      }
      case ChatEventType::kMessageEnd: break;
    }
  };
  const Tokenizer& tok = *service_->tokenizer_;
  for (size_t j = 0; j < out.token_ids.size() && !c.stop.matched(); ++j) {
    const int32_t id = out.token_ids[j];
    events_.clear();
    c.parser->push(id, &events_);
    const SampledToken* logprob = c.logprobs && j < out.logprobs.size() ? &out.logprobs[j] : nullptr;
    bool reasoning = false;
    for (const ChatEvent& e : events_) {
      reasoning = reasoning || e.type == ChatEventType::kReasoningDelta;
      if (e.type != ChatEventType::kContentDelta) c.held_logprobs.clear();
      apply(e, logprob);
      if (e.type == ChatEventType::kContentDelta) logprob = nullptr;  // once per token
    }
    if (reasoning) ++c.reasoning_tokens;
    // A text token without events is part of a character still incomplete, or text the format reads as
    // structure (a header; a special token always follows one, and clears what was held).
    if (tok.is_special(id)) c.held_logprobs.clear();
    else if (events_.empty() && logprob) c.held_logprobs.push_back(*logprob);
  }
  if (out.finished() && !c.stop.matched()) {
    events_.clear();
    c.parser->finish(&events_);
    for (const ChatEvent& e : events_) apply(e, nullptr);
  }
  if (c.stop.active()) apply_stop_strings(c, out.finished(), &deltas);
  const int64_t tokens = static_cast<int64_t>(out.token_ids.size());
  if (deltas.empty() && tokens > 0) delta_for(DeltaKind::kNone);  // header tokens: still counted for latency
  if (!deltas.empty()) deltas.front().num_tokens = tokens;
  for (GenerationDelta& d : deltas) stream_->delta(std::move(d));
}

// Content passes through the choice's stop matcher; text held back there comes out before any other kind
// of output, or at the end. A match ends the choice: its engine request is aborted (freed within one step)
// and it finishes with "stop".
void GenerationJob::apply_stop_strings(Choice& c, bool finished, std::vector<GenerationDelta>* deltas) {
  std::vector<GenerationDelta> kept;
  auto release_held = [&] {
    std::string held = c.stop.flush();
    if (held.empty()) return;
    GenerationDelta d;
    d.choice = c.spec.index;
    d.content = std::move(held);
    kept.push_back(std::move(d));
  };
  for (GenerationDelta& d : *deltas) {
    if (c.stop.matched()) break;
    if (!d.content.empty()) d.content = c.stop.feed(d.content);
    else if (!d.reasoning.empty() || !d.tool_calls.empty()) release_held();
    kept.push_back(std::move(d));
  }
  if (finished && !c.stop.matched()) release_held();
  if (!kept.empty() && !deltas->empty()) kept.front().num_tokens = deltas->front().num_tokens;
  *deltas = std::move(kept);
  if (c.stop.matched() && !c.stopped_by_string) {
    c.stopped_by_string = true;
    service_->engine_.abort(c.id);
  }
}

TokenLogprobInfo GenerationJob::logprob_info(const SampledToken& s) const {
  const Tokenizer& tok = *service_->tokenizer_;
  // The text replaces a partial UTF-8 sequence with U+FFFD; `bytes` keep the token's own bytes.
  auto fill = [&](int32_t id, double logprob, TokenLogprobInfo* out) {
    tok.append_token_bytes(id, &out->bytes);
    auto decoded = tok.decode(std::span<const int32_t>(&id, 1));
    if (decoded.is_ok()) out->token = std::move(decoded).value();
    out->logprob = logprob;
  };
  TokenLogprobInfo info;
  fill(s.token, s.logprob, &info);
  for (const TokenLogprob& t : s.top) fill(t.token, t.logprob, &info.top.emplace_back());
  return info;
}

void GenerationJob::fail(const std::string& message) {
  stream_->fail(ApiError::internal(message));
  abort_all();
  end();
}

void GenerationJob::abort_all() {
  for (const Choice& c : choices_)
    if (!c.finished) service_->engine_.abort(c.id);
}

void GenerationJob::end() {
  ended_ = true;
  for (Choice& c : choices_) {
    c.stream->set_notify(nullptr);
    c.stream.reset();
  }
  service_->release(this);
}

}  // namespace mx::server
