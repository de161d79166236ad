#include "tools/bench/openai_stream.h"

#include <nlohmann/json.hpp>

namespace mx::bench {
namespace {

using Json = nlohmann::json;

bool non_empty_string(const Json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() && !it->get_ref<const std::string&>().empty();
}

// True when one choice of a chunk carries generated text of any kind.
bool choice_has_text(const Json& choice) {
  if (!choice.is_object()) return false;
  if (non_empty_string(choice, "text")) return true;  // /v1/completions
  auto delta = choice.find("delta");
  if (delta == choice.end() || !delta->is_object()) return false;
  if (non_empty_string(*delta, "content") || non_empty_string(*delta, "reasoning_content") ||
      non_empty_string(*delta, "reasoning"))
    return true;
  auto calls = delta->find("tool_calls");
  return calls != delta->end() && calls->is_array() && !calls->empty();
}

std::string clip(const std::string& text, size_t limit = 200) {
  if (text.size() <= limit) return text;
  return text.substr(0, limit) + "...";
}

std::string message_of(const Json& error) {
  if (error.is_string()) return error.get<std::string>();
  if (error.is_object()) {
    auto m = error.find("message");
    if (m != error.end() && m->is_string()) return m->get<std::string>();
  }
  return clip(error.dump());
}

}  // namespace

OpenAiStreamReader::Kind OpenAiStreamReader::fail(std::string message) {
  error_ = std::move(message);
  return Kind::kError;
}

OpenAiStreamReader::Kind OpenAiStreamReader::read(const SseEvent& event) {
  if (event.data == "[DONE]") {
    done_ = true;
    return Kind::kDone;
  }
  const Json chunk = Json::parse(event.data, nullptr, /*allow_exceptions=*/false);
  if (event.event == "error") {
    if (chunk.is_object() && chunk.contains("error")) return fail(message_of(chunk["error"]));
    return fail(chunk.is_discarded() ? clip(event.data) : message_of(chunk));
  }
  if (chunk.is_discarded()) return fail("stream chunk is not JSON: " + clip(event.data));
  if (!chunk.is_object()) return fail("stream chunk is not a JSON object: " + clip(event.data));
  if (auto e = chunk.find("error"); e != chunk.end() && !e->is_null()) return fail(message_of(*e));
  if (auto usage = chunk.find("usage"); usage != chunk.end() && usage->is_object()) {
    if (auto c = usage->find("completion_tokens"); c != usage->end() && c->is_number_integer())
      usage_completion_tokens_ = c->get<int64_t>();
    if (auto p = usage->find("prompt_tokens"); p != usage->end() && p->is_number_integer())
      usage_prompt_tokens_ = p->get<int64_t>();
  }
  bool has_text = false;
  if (auto choices = chunk.find("choices"); choices != chunk.end() && choices->is_array()) {
    for (const Json& choice : *choices) {
      has_text = has_text || choice_has_text(choice);
      if (choice.is_object()) {
        auto reason = choice.find("finish_reason");
        if (reason != choice.end() && reason->is_string()) finish_reason_seen_ = true;
      }
    }
  }
  if (!has_text) return Kind::kNothing;
  ++token_chunks_;
  return Kind::kTokens;
}

std::string error_message_from_body(const std::string& body) {
  const Json parsed = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_object()) {
    for (const char* key : {"error", "message", "detail"}) {
      auto it = parsed.find(key);
      if (it != parsed.end() && !it->is_null()) return message_of(*it);
    }
  }
  std::string text = clip(body);
  for (char& c : text)
    if (c == '\n' || c == '\r') c = ' ';
  return text;
}

}  // namespace mx::bench
