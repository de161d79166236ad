// Chat and completions formatters, ids, models. The Responses formatter lives in responses_formatter.cc.
#include "server/openai_response.h"

#include <random>

namespace mx::server {

std::string sse_data(const Json& data) { return "data: " + json_text(data) + "\n\n"; }

std::string random_id(const std::string& prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char kHex[] = "0123456789abcdef";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += kHex[rng() & 15];
  return id;
}

std::string ResponseFormatter::stream_error(const ApiError& error) {
  return sse_data(Json::parse(error_body(error))) + "data: [DONE]\n\n";
}

Json model_json(const ModelCard& card) {
  return {{"id", card.id}, {"object", "model"}, {"created", card.created}, {"owned_by", "mxserve"},
          {"max_model_len", card.context_length}};
}

std::string models_body(const std::vector<ModelCard>& models) {
  Json data = Json::array();
  for (const auto& m : models) data.push_back(model_json(m));
  return json_text({{"object", "list"}, {"data", std::move(data)}});
}

namespace {

Json usage_json(const GenerationUsage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}},
          {"completion_tokens_details", {{"reasoning_tokens", u.reasoning_tokens}}}};
}

Json string_or_null(const std::string& s) { return s.empty() ? Json(nullptr) : Json(s); }

Json utf8_bytes(const std::string& raw) {
  Json bytes = Json::array();
  for (unsigned char c : raw) bytes.push_back(static_cast<int>(c));
  return bytes;
}

// Chat: `{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}`.
Json chat_logprob_json(const TokenLogprobInfo& info) {
  Json top = Json::array();
  for (const auto& t : info.top) top.push_back({{"token", t.token}, {"logprob", t.logprob}, {"bytes", utf8_bytes(t.bytes)}});
  return {{"token", info.token}, {"logprob", info.logprob}, {"bytes", utf8_bytes(info.bytes)}, {"top_logprobs", std::move(top)}};
}

// Completions: parallel lists, `top_logprobs` one {token: logprob} object per token.
Json completion_logprobs_json(const std::vector<TokenLogprobInfo>& infos, int64_t first_offset) {
  Json tokens = Json::array(), logprobs = Json::array(), top = Json::array(), offsets = Json::array();
  int64_t offset = first_offset;
  for (const auto& info : infos) {
    tokens.push_back(info.token);
    logprobs.push_back(info.logprob);
    Json alternatives = Json::object();
    for (const auto& t : info.top) alternatives[t.token] = t.logprob;
    top.push_back(std::move(alternatives));
    offsets.push_back(offset);
    offset += static_cast<int64_t>(info.token.size());
  }
  return {{"tokens", std::move(tokens)}, {"token_logprobs", std::move(logprobs)}, {"top_logprobs", std::move(top)},
          {"text_offset", std::move(offsets)}};
}

struct ChoiceState {
  bool started = false;  // chat: the role chunk went out
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> tool_calls;
  std::vector<TokenLogprobInfo> logprobs;
  bool finished = false;
  FinishReason finish = FinishReason::kStop;
};

// Shared by chat and completions: identity, choices, the chunk envelope.
class ChoiceFormatter : public ResponseFormatter {
 protected:
  ChoiceFormatter(ResponseIdentity identity, StreamOptions stream, int64_t choices, const char* chunk_object)
      : id_(std::move(identity)), stream_(stream), choices_(static_cast<size_t>(choices)), chunk_object_(chunk_object) {}

  // A valid index, or nullptr for one the service should never send (ignored rather than trusted).
  ChoiceState* choice(int64_t index) {
    return index >= 0 && index < static_cast<int64_t>(choices_.size()) ? &choices_[static_cast<size_t>(index)] : nullptr;
  }
  Json chunk(Json choice_json) const {
    Json c = {{"id", id_.id}, {"object", chunk_object_}, {"created", id_.created}, {"model", id_.model},
              {"choices", Json::array({std::move(choice_json)})}};
    if (stream_.include_usage) c["usage"] = nullptr;  // OpenAI: null on every chunk but the usage chunk
    return c;
  }
  // Choices the producer left open finish with "stop"; then the usage chunk (when asked) and [DONE].
  void done(const GenerationUsage& usage, std::string* sse) override {
    for (size_t i = 0; i < choices_.size(); ++i)
      if (!choices_[i].finished) finish(static_cast<int64_t>(i), FinishReason::kStop, sse);
    close_stream(usage, sse);
  }
  void close_stream(const GenerationUsage& usage, std::string* sse) {
    if (stream_.include_usage) {
      *sse += sse_data({{"id", id_.id}, {"object", chunk_object_}, {"created", id_.created}, {"model", id_.model},
                        {"choices", Json::array()}, {"usage", usage_json(usage)}});
    }
    *sse += "data: [DONE]\n\n";
  }
  Json envelope(const char* object, Json choices, const GenerationUsage& usage) const {
    return {{"id", id_.id}, {"object", object}, {"created", id_.created}, {"model", id_.model},
            {"choices", std::move(choices)}, {"usage", usage_json(usage)}};
  }

  ResponseIdentity id_;
  StreamOptions stream_;
  std::vector<ChoiceState> choices_;
  const char* chunk_object_;
};

class ChatFormatter final : public ChoiceFormatter {
 public:
  ChatFormatter(ResponseIdentity identity, StreamOptions stream, int64_t choices, bool logprobs)
      : ChoiceFormatter(std::move(identity), stream, choices, "chat.completion.chunk"), logprobs_(logprobs) {}

  void delta(const GenerationDelta& d, std::string* sse) override {
    ChoiceState* c = choice(d.choice);
    if (!c || c->finished) return;
    start(d.choice, c, sse);
    if (!d.reasoning.empty()) {
      c->reasoning += d.reasoning;
      emit(d.choice, {{"reasoning", d.reasoning}, {"reasoning_content", d.reasoning}}, sse);
    }
    if (!d.content.empty() || !d.logprobs.empty()) {
      c->content += d.content;
      Json logprobs = nullptr;
      if (!d.logprobs.empty()) {
        logprobs = {{"content", Json::array()}};
        for (const auto& info : d.logprobs) logprobs["content"].push_back(chat_logprob_json(info));
        c->logprobs.insert(c->logprobs.end(), d.logprobs.begin(), d.logprobs.end());
      }
      emit(d.choice, {{"content", d.content}}, sse, std::move(logprobs));
    }
    for (const auto& t : d.tool_calls) {
      if (t.index < 0 || t.index > static_cast<int64_t>(c->tool_calls.size())) continue;  // calls arrive in order
      Json call = {{"index", t.index}};
      if (t.index == static_cast<int64_t>(c->tool_calls.size())) {  // first fragment of a new call
        c->tool_calls.push_back({t.id.empty() ? random_id("call_") : t.id, t.name, ""});
        call["id"] = c->tool_calls.back().id;
        call["type"] = "function";
        call["function"] = {{"name", t.name}, {"arguments", t.arguments}};
      } else {
        call["function"] = {{"arguments", t.arguments}};
      }
      c->tool_calls[static_cast<size_t>(t.index)].arguments += t.arguments;
      emit(d.choice, {{"tool_calls", Json::array({std::move(call)})}}, sse);
    }
  }

  void finish(int64_t index, FinishReason reason, std::string* sse) override {
    ChoiceState* c = choice(index);
    if (!c || c->finished) return;
    start(index, c, sse);
    c->finished = true;
    // A choice that called tools finishes with tool_calls, whatever stop token ended it.
    c->finish = (reason == FinishReason::kStop && !c->tool_calls.empty()) ? FinishReason::kToolCalls : reason;
    *sse += sse_data(chunk({{"index", index}, {"delta", Json::object()}, {"logprobs", nullptr},
                            {"finish_reason", finish_reason_name(c->finish)}}));
  }

  std::string body(const GenerationUsage& usage) const override {
    Json choices = Json::array();
    for (size_t i = 0; i < choices_.size(); ++i) {
      const ChoiceState& c = choices_[i];
      Json message = {{"role", "assistant"},
                      {"content", c.content.empty() && !c.tool_calls.empty() ? Json(nullptr) : Json(c.content)},
                      {"reasoning", string_or_null(c.reasoning)},
                      {"reasoning_content", string_or_null(c.reasoning)},
                      {"refusal", nullptr}};
      if (!c.tool_calls.empty()) {
        Json calls = Json::array();
        for (const auto& t : c.tool_calls)
          calls.push_back({{"id", t.id}, {"type", "function"}, {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
        message["tool_calls"] = std::move(calls);
      }
      Json logprobs = nullptr;
      if (logprobs_) {
        logprobs = {{"content", Json::array()}};
        for (const auto& info : c.logprobs) logprobs["content"].push_back(chat_logprob_json(info));
      }
      choices.push_back({{"index", i}, {"message", std::move(message)}, {"logprobs", std::move(logprobs)},
                         {"finish_reason", finish_reason_name(c.finish)}});
    }
    return json_text(envelope("chat.completion", std::move(choices), usage));
  }

 private:
  void start(int64_t index, ChoiceState* c, std::string* sse) {
    if (c->started) return;
    c->started = true;
    emit(index, {{"role", "assistant"}, {"content", ""}}, sse);
  }
  void emit(int64_t index, Json delta, std::string* sse, Json logprobs = nullptr) const {
    *sse += sse_data(chunk({{"index", index}, {"delta", std::move(delta)}, {"logprobs", std::move(logprobs)}, {"finish_reason", nullptr}}));
  }

  const bool logprobs_;
};

class CompletionFormatter final : public ChoiceFormatter {
 public:
  CompletionFormatter(ResponseIdentity identity, StreamOptions stream, int64_t choices, bool logprobs)
      : ChoiceFormatter(std::move(identity), stream, choices, "text_completion"), logprobs_(logprobs) {}

  void delta(const GenerationDelta& d, std::string* sse) override {
    ChoiceState* c = choice(d.choice);
    if (!c || c->finished || (d.content.empty() && d.logprobs.empty())) return;
    Json logprobs = nullptr;
    if (!d.logprobs.empty()) {
      logprobs = completion_logprobs_json(d.logprobs, logprob_offset(*c));
      c->logprobs.insert(c->logprobs.end(), d.logprobs.begin(), d.logprobs.end());
    }
    c->content += d.content;
    *sse += sse_data(chunk({{"index", d.choice}, {"text", d.content}, {"logprobs", std::move(logprobs)}, {"finish_reason", nullptr}}));
  }

  void finish(int64_t index, FinishReason reason, std::string* sse) override {
    ChoiceState* c = choice(index);
    if (!c || c->finished) return;
    c->finished = true;
    c->finish = reason;
    *sse += sse_data(chunk({{"index", index}, {"text", ""}, {"logprobs", nullptr}, {"finish_reason", finish_reason_name(reason)}}));
  }

  std::string body(const GenerationUsage& usage) const override {
    Json choices = Json::array();
    for (size_t i = 0; i < choices_.size(); ++i) {
      const ChoiceState& c = choices_[i];
      // Offsets count from the start of the choice's text (after an echoed prompt, which has no logprobs).
      const int64_t first = static_cast<int64_t>(c.content.size()) - logprob_text_size(c);
      choices.push_back({{"index", i}, {"text", c.content},
                         {"logprobs", logprobs_ ? completion_logprobs_json(c.logprobs, first) : Json(nullptr)},
                         {"finish_reason", finish_reason_name(c.finish)}});
    }
    return json_text(envelope("text_completion", std::move(choices), usage));
  }

 private:
  static int64_t logprob_text_size(const ChoiceState& c) {
    int64_t n = 0;
    for (const auto& info : c.logprobs) n += static_cast<int64_t>(info.token.size());
    return n;
  }
  // Where the next token's text starts: right after the text sent so far.
  static int64_t logprob_offset(const ChoiceState& c) { return static_cast<int64_t>(c.content.size()); }

  const bool logprobs_;
};

}  // namespace

std::unique_ptr<ResponseFormatter> make_chat_formatter(ResponseIdentity identity, StreamOptions stream, int64_t choices,
                                                       bool logprobs) {
  return std::make_unique<ChatFormatter>(std::move(identity), stream, choices, logprobs);
}

std::unique_ptr<ResponseFormatter> make_completion_formatter(ResponseIdentity identity, StreamOptions stream,
                                                             int64_t choices, bool logprobs) {
  return std::make_unique<CompletionFormatter>(std::move(identity), stream, choices, logprobs);
}

}  // namespace mx::server
