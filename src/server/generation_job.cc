// Engine output -> GenerationStream events, on the connection's strand.
#include "server/generation_job.h"

#include <algorithm>

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
    c.spec = std::move(spec);
    c.id = (*added)->id();
    c.stream = std::move(added).value();
    if (kind_ == Kind::kChat) c.parser = std::make_unique<HarmonyStreamParser>(*service_->tokenizer_);
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
    stream_->finish_choice(c.spec.index, finish_reason(out.finish));
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
  auto apply = [&](const HarmonyEvent& e, const SampledToken* logprob) {
    switch (e.type) {
      case HarmonyEventType::kReasoningDelta: delta_for(DeltaKind::kReasoning).reasoning += e.text; break;
      case HarmonyEventType::kContentDelta: {
        GenerationDelta& d = delta_for(DeltaKind::kContent);
        d.content += e.text;
        // Tokens that produced no text yet (the first bytes of a character) belong to this text.
        for (const SampledToken& held : c.held_logprobs) d.logprobs.push_back(logprob_info(held));
        c.held_logprobs.clear();
        if (logprob) d.logprobs.push_back(logprob_info(*logprob));
        break;
      }
      case HarmonyEventType::kToolCallStart:
        delta_for(DeltaKind::kTool).tool_calls.push_back({e.tool_index, random_id("call_"), e.text, ""});
        break;
      case HarmonyEventType::kToolCallArgumentsDelta: {
        GenerationDelta& d = delta_for(DeltaKind::kTool);
        if (d.tool_calls.empty() || d.tool_calls.back().index != e.tool_index) d.tool_calls.push_back({e.tool_index, "", "", ""});
        d.tool_calls.back().arguments += e.text;
        break;
      }
      case HarmonyEventType::kMessageEnd: break;
    }
  };
  // A stop string ends the text inside the last tokens, which the engine still releases whole: its text
  // (special tokens skipped, the stop string excluded) says where to cut. Positions count the bytes of
  // non-special tokens, which is what that text is made of; a token cut in the middle is replaced by the
  // ids of its kept bytes, so the parser (which may hold text back) never sees what follows the stop.
  const Tokenizer& tok = *service_->tokenizer_;
  c.engine_text_bytes += static_cast<int64_t>(out.text.size());
  const int64_t limit = out.finished() && !out.stop_string.empty() ? c.engine_text_bytes : -1;
  std::string bytes;
  for (size_t j = 0; j < out.token_ids.size(); ++j) {
    const int32_t id = out.token_ids[j];
    bytes.clear();
    if (!tok.is_special(id)) tok.append_token_bytes(id, &bytes);
    const int64_t size = static_cast<int64_t>(bytes.size());
    if (limit >= 0 && size > 0 && c.text_bytes >= limit) break;
    std::vector<int32_t> ids = {id};
    if (limit >= 0 && c.text_bytes + size > limit)
      ids = tok.encode(std::string_view(bytes).substr(0, static_cast<size_t>(limit - c.text_bytes)));
    c.text_bytes += size;
    const SampledToken* logprob = c.logprobs && j < out.logprobs.size() ? &out.logprobs[j] : nullptr;
    bool reasoning = false, any_event = false;
    for (int32_t piece : ids) {
      events_.clear();
      c.parser->push(piece, &events_);
      for (const HarmonyEvent& e : events_) {
        any_event = true;
        reasoning = reasoning || e.type == HarmonyEventType::kReasoningDelta;
        if (e.type != HarmonyEventType::kContentDelta) c.held_logprobs.clear();
        apply(e, logprob);
        if (e.type == HarmonyEventType::kContentDelta) logprob = nullptr;  // once per token
      }
    }
    if (reasoning) ++c.reasoning_tokens;
    // A text token without events is part of a character still incomplete, or header text (a special
    // token always follows a header, and clears what was held).
    if (tok.is_special(id)) c.held_logprobs.clear();
    else if (!any_event && logprob) c.held_logprobs.push_back(*logprob);
  }
  if (out.finished()) {
    events_.clear();
    c.parser->finish(&events_);
    for (const HarmonyEvent& e : events_) apply(e, nullptr);
  }
  const int64_t tokens = static_cast<int64_t>(out.token_ids.size());
  if (deltas.empty() && tokens > 0) delta_for(DeltaKind::kNone);  // header tokens: still counted for latency
  if (!deltas.empty()) deltas.front().num_tokens = tokens;
  for (GenerationDelta& d : deltas) stream_->delta(std::move(d));
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
