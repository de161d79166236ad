#include "chat/gemma4/gemma4_render.h"

#include <optional>

#include "chat/gemma4/jinja_values.h"

namespace mx::gemma4 {
namespace {

constexpr std::string_view kQuote = "<|\"|>";

// <|"|>TEXT<|"|>: how the template delimits strings inside declarations and arguments.
void quoted(std::string_view text, RenderedPrompt* out) {
  out->control(kQuote);
  out->text(text);
  out->control(kQuote);
}

// The template's `if add_comma %},{% else %}{% set add_comma = true %}{% endif`.
void comma_once(bool* add_comma, RenderedPrompt* out) {
  if (*add_comma) out->text(",");
  *add_comma = true;
}

void render_required(const Json* list, RenderedPrompt* out) {
  out->text("required:[");
  if (list && list->is_array()) {
    for (size_t i = 0; i < list->size(); ++i) {
      if (i) out->text(",");
      quoted(python_str((*list)[i]), out);
    }
  }
  out->text("]");
}

// The template's format_parameters macro: one entry per property (standard schema keys skipped, as the
// template does even when a property is named "type").
void render_parameters(const Json& properties, RenderedPrompt* out);

void render_items(const Json& items, RenderedPrompt* out) {
  out->text("items:{");
  bool first = true;
  for (const auto& [key, value] : dictsort(items)) {
    if (value->is_null()) continue;
    if (!first) out->text(",");
    first = false;
    if (key == "properties") {
      out->text("properties:{");
      if (value->is_object()) render_parameters(*value, out);
      out->text("}");
    } else if (key == "required") {
      render_required(value, out);
    } else if (key == "type") {
      out->text("type:");
      if (value->is_string()) {
        render_argument(Json(upper_str(value)), true, out);
      } else {
        Json upper = Json::array();
        if (value->is_array())
          for (const Json& t : *value) upper.push_back(upper_str(&t));
        render_argument(upper, true, out);
      }
    } else {
      out->text(key + ":");
      render_argument(*value, true, out);
    }
  }
  out->text("}");
}

void render_parameters(const Json& properties, RenderedPrompt* out) {
  static const char* const kStandardKeys[] = {"description", "type", "properties", "required", "nullable"};
  bool found_first = false;
  for (const auto& [key, value] : dictsort(properties)) {
    bool standard = false;
    for (const char* k : kStandardKeys) standard = standard || key == k;
    if (standard) continue;
    if (found_first) out->text(",");
    found_first = true;
    out->text(key + ":{");
    bool add_comma = false;
    if (const Json* description = member(value, "description"); truthy(description)) {
      out->text("description:");
      quoted(python_str(*description), out);
      add_comma = true;
    }
    const std::string type = upper_str(member(value, "type"));
    if (type == "STRING") {
      if (const Json* values = member(value, "enum"); truthy(values)) {
        comma_once(&add_comma, out);
        out->text("enum:");
        render_argument(*values, true, out);
      }
    } else if (type == "ARRAY") {
      if (const Json* items = member(value, "items"); items && items->is_object() && !items->empty()) {
        comma_once(&add_comma, out);
        render_items(*items, out);
      }
    }
    if (truthy(member(value, "nullable"))) {
      comma_once(&add_comma, out);
      out->text("nullable:true");
    }
    if (type == "OBJECT") {
      const Json* props = member(value, "properties");
      if (props && props->is_object()) {
        comma_once(&add_comma, out);
        out->text("properties:{");
        render_parameters(*props, out);
        out->text("}");
      } else if (value->is_object()) {  // no properties: the template lists the schema's own keys
        comma_once(&add_comma, out);
        out->text("properties:{");
        render_parameters(*value, out);
        out->text("}");
      }
      if (const Json* required = member(value, "required"); truthy(required)) {
        comma_once(&add_comma, out);
        render_required(required, out);
      }
    }
    comma_once(&add_comma, out);
    out->text("type:");
    quoted(type, out);
    out->text("}");
  }
}

// The tool messages that answer `call_message` (the consecutive ones after it), as tool response blocks.
// Returns how many were rendered, or an error when one names no function.
Result<int> render_tool_results(std::span<const ChatMessage> messages, size_t call_index, RenderedPrompt* out) {
  const ChatMessage& call_message = messages[call_index];
  int rendered = 0;
  for (size_t k = call_index + 1; k < messages.size() && messages[k].role == ChatRole::kTool; ++k) {
    const ChatMessage& result = messages[k];
    std::optional<std::string> name;
    if (!result.name.empty()) name = result.name;
    for (const ToolCall& call : call_message.tool_calls)
      if (call.id == result.tool_call_id) name = call.name;
    if (!name)
      return invalid_argument("tool message " + std::to_string(k) + " answers no tool call of the assistant message "
                              "before it (tool_call_id '" + result.tool_call_id + "') and has no name");
    out->control("<|tool_response>");
    out->text("response:" + *name + "{value:");
    render_argument(Json(result.content), false, out);
    out->text("}");
    out->control("<tool_response|>");
    ++rendered;
  }
  return rendered;
}

void render_tool_call(const ToolCall& call, RenderedPrompt* out) {
  out->control("<|tool_call>");
  out->text("call:" + call.name + "{");
  // OpenAI carries arguments as JSON text; an object is written in the template's notation (as servers that
  // parse arguments before templating do), anything else as the text it is.
  Json args = Json::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
  if (!args.is_discarded() && args.is_object()) {
    bool first = true;
    for (const auto& [key, value] : dictsort(args)) {
      if (!first) out->text(",");
      first = false;
      out->text(key + ":");
      render_argument(*value, false, out);
    }
  } else {
    out->text(call.arguments);
  }
  out->text("}");
  out->control("<tool_call|>");
}

// The template's strip_thinking macro: every <|channel>...<channel|> thought cut out of a model message's
// text (written as text by the client), then trimmed.
std::string strip_thinking(const std::string& text) {
  constexpr std::string_view kOpen = "<|channel>", kClose = "<channel|>";
  std::string result;
  size_t pos = 0;
  while (true) {
    const size_t close = text.find(kClose, pos);
    const std::string_view part = std::string_view(text).substr(pos, close == std::string::npos ? std::string::npos : close - pos);
    const size_t open = part.find(kOpen);
    result += part.substr(0, open);
    if (close == std::string::npos) break;
    pos = close + kClose.size();
  }
  return python_strip(result);
}

const char* role_name(ChatRole role) {
  switch (role) {
    case ChatRole::kSystem: return "system";
    case ChatRole::kDeveloper: return "developer";
    case ChatRole::kUser: return "user";
    case ChatRole::kAssistant: return "model";
    case ChatRole::kTool: return "tool";
  }
  return "user";
}

}  // namespace

void RenderedPrompt::text(std::string_view s) {
  if (s.empty()) return;
  if (pieces_.empty() || pieces_.back().control) pieces_.push_back({false, ""});
  pieces_.back().text += s;
}

void RenderedPrompt::control(std::string_view token) { pieces_.push_back({true, std::string(token)}); }

std::string RenderedPrompt::str() const {
  std::string out;
  for (const PromptPiece& p : pieces_) out += p.text;
  return out;
}

void render_argument(const Json& value, bool escape_keys, RenderedPrompt* out) {
  if (value.is_string()) {
    quoted(value.get_ref<const std::string&>(), out);
  } else if (value.is_boolean()) {
    out->text(value.get<bool>() ? "true" : "false");
  } else if (value.is_object()) {
    out->text("{");
    bool first = true;
    for (const auto& [key, item] : dictsort(value)) {
      if (!first) out->text(",");
      first = false;
      if (escape_keys) quoted(key, out);
      else out->text(key);
      out->text(":");
      render_argument(*item, escape_keys, out);
    }
    out->text("}");
  } else if (value.is_array()) {
    out->text("[");
    for (size_t i = 0; i < value.size(); ++i) {
      if (i) out->text(",");
      render_argument(value[i], escape_keys, out);
    }
    out->text("]");
  } else {
    out->text(python_str(value));  // numbers; null prints as None, as the template does
  }
}

void render_declaration(const FunctionTool& tool, RenderedPrompt* out) {
  out->text("declaration:" + tool.name + "{description:");
  quoted(tool.description, out);
  const Json& params = tool.parameters;
  if (truthy(&params)) {
    out->text(",parameters:{");
    if (const Json* props = member(&params, "properties"); truthy(props)) {
      out->text("properties:{");
      render_parameters(*props, out);
      out->text("},");
    }
    if (const Json* required = member(&params, "required"); truthy(required)) {
      render_required(required, out);
      out->text(",");
    }
    // Without a type the template leaves the parameters' brace open; so does this.
    if (const Json* type = member(&params, "type"); truthy(type)) {
      out->text("type:");
      quoted(upper_str(type), out);
      out->text("}");
    }
  }
  out->text("}");
}

Result<RenderedPrompt> render_prompt(const Conversation& conversation, const RenderOptions& options) {
  RenderedPrompt out;
  std::span<const ChatMessage> messages = conversation.messages;
  out.control("<bos>");
  const bool first_is_system = !messages.empty() && (messages[0].role == ChatRole::kSystem ||
                                                     messages[0].role == ChatRole::kDeveloper);
  enum class Last { kNone, kToolCall, kToolResponse };
  Last last = Last::kNone;
  if (options.enable_thinking || !conversation.tools.empty() || first_is_system) {
    out.control("<|turn>");
    out.text("system\n");
    if (options.enable_thinking) {
      out.control("<|think|>");
      out.text("\n");
    }
    if (first_is_system) {
      out.text(python_strip(messages[0].content));
      messages = messages.subspan(1);
    }
    for (const FunctionTool& tool : conversation.tools) {
      out.control("<|tool>");
      render_declaration(tool, &out);
      out.control("<tool|>");
    }
    out.control("<turn|>");
    out.text("\n");
  }

  int64_t last_user = -1;
  for (size_t i = 0; i < messages.size(); ++i)
    if (messages[i].role == ChatRole::kUser) last_user = static_cast<int64_t>(i);

  const ChatMessage* previous = nullptr;  // the previous message that is not a tool result
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == ChatRole::kTool) continue;  // rendered with the call it answers
    last = Last::kNone;
    const bool is_model = m.role == ChatRole::kAssistant;
    const bool continues_turn = is_model && previous && previous->role == ChatRole::kAssistant;
    previous = &m;
    if (!continues_turn) {
      out.control("<|turn>");
      out.text(std::string(role_name(m.role)) + "\n");
    }
    if (!m.reasoning.empty() && static_cast<int64_t>(i) > last_user && !m.tool_calls.empty()) {
      out.control("<|channel>");
      out.text("thought\n" + m.reasoning + "\n");
      out.control("<channel|>");
    }
    for (const ToolCall& call : m.tool_calls) render_tool_call(call, &out);
    if (!m.tool_calls.empty()) last = Last::kToolCall;
    int results = 0;
    if (!m.tool_calls.empty()) {
      MX_ASSIGN_OR_RETURN(results, render_tool_results(messages, i, &out));
      if (results > 0) last = Last::kToolResponse;
    }
    out.text(is_model ? strip_thinking(m.content) : python_strip(m.content));
    if (last == Last::kToolCall && results == 0) {
      out.control("<|tool_response>");
    } else if (!(results > 0 && m.content.empty())) {
      out.control("<turn|>");
      out.text("\n");
    }
  }

  if (options.add_generation_prompt && last == Last::kNone) {
    out.control("<|turn>");
    out.text("model\n");
    if (!options.enable_thinking) {
      out.control("<|channel>");
      out.text("thought\n");
      out.control("<channel|>");
    }
  }
  return out;
}

}  // namespace mx::gemma4
