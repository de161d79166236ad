// Field-by-field parsing of the three generation endpoints. A small reader keeps the path of the current
// object so every error names its field; the first error wins and parsing stops.
#include "server/openai_request.h"

#include <cctype>
#include <cmath>
#include <unordered_map>

namespace mx::server {

const char* chat_role_name(ChatRole role) {
  switch (role) {
    case ChatRole::kSystem: return "system";
    case ChatRole::kDeveloper: return "developer";
    case ChatRole::kUser: return "user";
    case ChatRole::kAssistant: return "assistant";
    case ChatRole::kTool: return "tool";
  }
  return "user";
}

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kToolCalls: return "tool_calls";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
  }
  return "stop";
}

namespace {

// 'name' (built by appending: GCC 12 warns falsely (-Wrestrict) on "'" + std::string chains).
std::string quoted(const std::string& name) {
  std::string s;
  s.reserve(name.size() + 2);
  s += '\'';
  s += name;
  s += '\'';
  return s;
}

// Reads typed fields of one JSON object; `path` prefixes the param names of its errors.
class Fields {
 public:
  Fields(const Json& object, std::string path) : object_(object), path_(std::move(path)) {}

  std::string param(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  // The field, or nullptr when absent or null.
  const Json* find(const std::string& key) const {
    auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  std::optional<ApiError> type_error(const std::string& key, const char* expected) const {
    return ApiError::invalid_request(quoted(param(key)) + " must be " + expected + ".", param(key));
  }

  std::optional<ApiError> string(const std::string& key, std::string* out, bool required = false) const {
    const Json* v = find(key);
    if (!v) return required ? missing(key) : std::nullopt;
    if (!v->is_string()) return type_error(key, "a string");
    *out = v->get<std::string>();
    return std::nullopt;
  }
  std::optional<ApiError> boolean(const std::string& key, bool* out) const {
    const Json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) return type_error(key, "a boolean");
    *out = v->get<bool>();
    return std::nullopt;
  }
  std::optional<ApiError> number(const std::string& key, double lo, double hi, double* out) const {
    const Json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) return type_error(key, "a number");
    const double x = v->get<double>();
    if (!std::isfinite(x) || x < lo || x > hi) return range_error(key, std::to_string(lo), std::to_string(hi));
    *out = x;
    return std::nullopt;
  }
  // Integers outside int64 arrive as unsigned or float and fail the range check, never wrap.
  std::optional<ApiError> integer(const std::string& key, int64_t lo, int64_t hi, int64_t* out) const {
    const Json* v = find(key);
    if (!v) return std::nullopt;
    return integer_value(*v, param(key), lo, hi, out);
  }
  std::optional<ApiError> missing(const std::string& key) const {
    return ApiError::invalid_request(quoted(param(key)) + " is required.", param(key));
  }
  std::optional<ApiError> range_error(const std::string& key, const std::string& lo, const std::string& hi) const {
    return ApiError::invalid_request(quoted(param(key)) + " must be between " + lo + " and " + hi + ".", param(key));
  }
  static std::optional<ApiError> integer_value(const Json& v, const std::string& param, int64_t lo, int64_t hi,
                                               int64_t* out) {
    const std::string range = " between " + std::to_string(lo) + " and " + std::to_string(hi) + ".";
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      return ApiError::invalid_request(quoted(param) + " must be an integer" + range, param);
    if (!v.is_number_integer()) return ApiError::invalid_request(quoted(param) + " must be an integer.", param);
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) return ApiError::invalid_request(quoted(param) + " must be an integer" + range, param);
    *out = x;
    return std::nullopt;
  }

 private:
  const Json& object_;
  std::string path_;
};

#define MX_TRY(expr)                                \
  do {                                              \
    if (auto mx_err_ = (expr)) return mx_err_;      \
  } while (0)

std::string indexed(const std::string& path, size_t i) { return path + "[" + std::to_string(i) + "]"; }

// OpenAI content: a string, or an array of text parts ({"type": "text"|"input_text"|"output_text", "text"}).
std::optional<ApiError> parse_content(const Json& value, const std::string& param, std::string* out) {
  if (value.is_null()) return std::nullopt;
  if (value.is_string()) {
    *out = value.get<std::string>();
    return std::nullopt;
  }
  if (!value.is_array()) return ApiError::invalid_request(quoted(param) + " must be a string or an array of parts.", param);
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string part_param = indexed(param, i);
    if (!value[i].is_object()) return ApiError::invalid_request(quoted(part_param) + " must be an object.", part_param);
    Fields part(value[i], part_param);
    std::string type, text;
    MX_TRY(part.string("type", &type, true));
    if (type != "text" && type != "input_text" && type != "output_text")
      return ApiError::invalid_request("Content part type '" + type + "' is not supported; this model reads text only.",
                                       part.param("type"));
    MX_TRY(part.string("text", &text, true));
    *out += text;
  }
  return std::nullopt;
}

// "none" asks for no reasoning: low effort for formats with levels only (gpt-oss always reasons), thinking
// off for formats that can turn it off; any other level turns their thinking on.
std::optional<ApiError> parse_effort(const std::string& text, const std::string& param, ChatRequest* out) {
  ReasoningEffort* effort = &out->reasoning_effort;
  out->thinking = text != "none";
  if (text == "low" || text == "minimal" || text == "none") *effort = ReasoningEffort::kLow;
  else if (text == "medium") *effort = ReasoningEffort::kMedium;
  else if (text == "high") *effort = ReasoningEffort::kHigh;
  else return ApiError::invalid_request(quoted(param) + " must be one of low, medium, high.", param);
  return std::nullopt;
}

// vLLM's chat_template_kwargs, the template switches a request may set: enable_thinking (and `thinking`, the
// name some templates use) turns reasoning on or off and wins over reasoning_effort. Other switches are
// accepted and ignored, as a template ignores variables it does not read (docs/API.md lists this).
std::optional<ApiError> parse_template_kwargs(const Fields& f, ChatRequest* out) {
  const Json* kwargs = f.find("chat_template_kwargs");
  if (!kwargs) return std::nullopt;
  if (!kwargs->is_object()) return f.type_error("chat_template_kwargs", "an object");
  Fields k(*kwargs, f.param("chat_template_kwargs"));
  for (const char* key : {"thinking", "enable_thinking"}) {
    if (!k.find(key)) continue;
    bool on = false;
    MX_TRY(k.boolean(key, &on));
    out->thinking = on;
  }
  return std::nullopt;
}

bool valid_function_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return false;
  return true;
}

// The function part of a tool: {name, description, parameters}. `flat` is the Responses API's shape,
// where these sit next to "type" instead of under "function".
std::optional<ApiError> parse_function_tool(const Json& value, const std::string& param, FunctionTool* out) {
  if (!value.is_object()) return ApiError::invalid_request(quoted(param) + " must be an object.", param);
  Fields f(value, param);
  MX_TRY(f.string("name", &out->name, true));
  if (!valid_function_name(out->name))
    return ApiError::invalid_request(quoted(f.param("name")) + " must be 1-64 characters of a-z, A-Z, 0-9, _, - or .",
                                     f.param("name"));
  MX_TRY(f.string("description", &out->description));
  if (const Json* p = f.find("parameters")) {
    if (!p->is_object()) return f.type_error("parameters", "a JSON Schema object");
    out->parameters = *p;
  }
  return std::nullopt;
}

std::optional<ApiError> parse_tools(const Fields& f, bool flat, std::vector<FunctionTool>* out) {
  const Json* tools = f.find("tools");
  if (!tools) return std::nullopt;
  if (!tools->is_array()) return f.type_error("tools", "an array");
  for (size_t i = 0; i < tools->size(); ++i) {
    const std::string param = indexed(f.param("tools"), i);
    const Json& t = (*tools)[i];
    if (!t.is_object()) return ApiError::invalid_request(quoted(param) + " must be an object.", param);
    Fields tf(t, param);
    std::string type;
    MX_TRY(tf.string("type", &type, true));
    if (type != "function")
      return ApiError::invalid_request("Tool type '" + type + "' is not supported; only function tools are.",
                                       tf.param("type"));
    FunctionTool tool;
    if (flat) {
      MX_TRY(parse_function_tool(t, param, &tool));
    } else {
      const Json* fn = tf.find("function");
      if (!fn) return tf.missing("function");
      MX_TRY(parse_function_tool(*fn, tf.param("function"), &tool));
    }
    for (const auto& seen : *out)
      if (seen.name == tool.name)
        return ApiError::invalid_request("Two tools are named '" + tool.name + "'.", param);
    out->push_back(std::move(tool));
  }
  return std::nullopt;
}

// "auto" | "none" | "required" | {"type": "function", "function": {"name"}} (chat) or {"type", "name"} (responses).
std::optional<ApiError> parse_tool_choice(const Fields& f, const std::vector<FunctionTool>& tools, ToolChoice* out) {
  const Json* v = f.find("tool_choice");
  if (!v) {
    out->mode = ToolChoice::Mode::kAuto;
    return std::nullopt;
  }
  const std::string param = f.param("tool_choice");
  if (v->is_string()) {
    const std::string s = v->get<std::string>();
    if (s == "auto") out->mode = ToolChoice::Mode::kAuto;
    else if (s == "none") out->mode = ToolChoice::Mode::kNone;
    else if (s == "required") out->mode = ToolChoice::Mode::kRequired;
    else return ApiError::invalid_request("'tool_choice' must be auto, none, required or a named function.", param);
  } else if (v->is_object()) {
    Fields c(*v, param);
    std::string type;
    MX_TRY(c.string("type", &type, true));
    if (type != "function") return ApiError::invalid_request("'tool_choice.type' must be function.", c.param("type"));
    std::string name;
    if (const Json* fn = c.find("function")) {
      if (!fn->is_object()) return c.type_error("function", "an object");
      MX_TRY(Fields(*fn, c.param("function")).string("name", &name, true));
    } else {
      MX_TRY(c.string("name", &name, true));
    }
    out->mode = ToolChoice::Mode::kNamed;
    out->name = name;
  } else {
    return ApiError::invalid_request("'tool_choice' must be a string or an object.", param);
  }
  if ((out->mode == ToolChoice::Mode::kRequired || out->mode == ToolChoice::Mode::kNamed) && tools.empty())
    return ApiError::invalid_request("'tool_choice' asks for a tool call but no tools were given.", param);
  if (out->mode == ToolChoice::Mode::kNamed) {
    bool found = false;
    for (const auto& t : tools) found = found || t.name == out->name;
    if (!found) return ApiError::invalid_request("'tool_choice' names '" + out->name + "', which is not in 'tools'.", param);
  }
  return std::nullopt;
}

std::optional<ApiError> parse_stop(const Fields& f, std::vector<std::string>* out) {
  const Json* v = f.find("stop");
  if (!v) return std::nullopt;
  const std::string param = f.param("stop");
  if (v->is_string()) {
    if (!v->get<std::string>().empty()) out->push_back(v->get<std::string>());
    return std::nullopt;
  }
  if (!v->is_array()) return f.type_error("stop", "a string or an array of strings");
  if (static_cast<int64_t>(v->size()) > kMaxStopStrings)
    return ApiError::invalid_request("'stop' may hold at most " + std::to_string(kMaxStopStrings) + " strings.", param);
  for (size_t i = 0; i < v->size(); ++i) {
    if (!(*v)[i].is_string() || (*v)[i].get<std::string>().empty())
      return ApiError::invalid_request(quoted(indexed(param, i)) + " must be a non-empty string.", indexed(param, i));
    out->push_back((*v)[i].get<std::string>());
  }
  return std::nullopt;
}

// Fields shared by chat and completions. `max_tokens_keys` lists the accepted spellings, first wins.
std::optional<ApiError> parse_sampling(const Fields& f, std::initializer_list<const char*> max_tokens_keys,
                                       SamplingOptions* s) {
  MX_TRY(f.number("temperature", 0.0, 2.0, &s->temperature));
  MX_TRY(f.number("top_p", 0.0, 1.0, &s->top_p));
  if (s->top_p <= 0.0) return ApiError::invalid_request("'top_p' must be greater than 0.", f.param("top_p"));
  MX_TRY(f.integer("top_k", -1, 1 << 30, &s->top_k));
  if (s->top_k < 0) s->top_k = 0;
  MX_TRY(f.number("min_p", 0.0, 1.0, &s->min_p));
  MX_TRY(f.number("presence_penalty", -2.0, 2.0, &s->presence_penalty));
  MX_TRY(f.number("frequency_penalty", -2.0, 2.0, &s->frequency_penalty));
  for (const char* key : max_tokens_keys) {
    int64_t max_tokens = 0;
    if (!f.find(key)) continue;
    MX_TRY(f.integer(key, 1, INT64_MAX, &max_tokens));
    s->max_tokens = max_tokens;
    break;
  }
  MX_TRY(parse_stop(f, &s->stop));
  if (const Json* seed = f.find("seed")) {
    int64_t v = 0;
    MX_TRY(Fields::integer_value(*seed, f.param("seed"), INT64_MIN, INT64_MAX, &v));
    s->seed = static_cast<uint64_t>(v);
  }
  MX_TRY(f.integer("n", 1, kMaxChoices, &s->n));
  MX_TRY(f.boolean("ignore_eos", &s->ignore_eos));
  return std::nullopt;
}

std::optional<ApiError> parse_stream(const Fields& f, StreamOptions* out) {
  MX_TRY(f.boolean("stream", &out->stream));
  if (const Json* so = f.find("stream_options")) {
    if (!so->is_object()) return f.type_error("stream_options", "an object");
    if (!out->stream)
      return ApiError::invalid_request("'stream_options' is only allowed when 'stream' is true.", f.param("stream_options"));
    MX_TRY(Fields(*so, f.param("stream_options")).boolean("include_usage", &out->include_usage));
  }
  return std::nullopt;
}

std::optional<ApiError> parse_tool_calls(const Json& value, const std::string& param, std::vector<ToolCall>* out) {
  if (!value.is_array()) return ApiError::invalid_request(quoted(param) + " must be an array.", param);
  for (size_t i = 0; i < value.size(); ++i) {
    const std::string call_param = indexed(param, i);
    if (!value[i].is_object()) return ApiError::invalid_request(quoted(call_param) + " must be an object.", call_param);
    Fields c(value[i], call_param);
    ToolCall call;
    MX_TRY(c.string("id", &call.id));
    const Json* fn = c.find("function");
    if (!fn) return c.missing("function");
    if (!fn->is_object()) return c.type_error("function", "an object");
    Fields ff(*fn, c.param("function"));
    MX_TRY(ff.string("name", &call.name, true));
    // OpenAI sends arguments as JSON text; some clients send the object itself, which we accept.
    if (const Json* args = ff.find("arguments")) call.arguments = args->is_string() ? args->get<std::string>() : json_text(*args);
    out->push_back(std::move(call));
  }
  return std::nullopt;
}

std::optional<ApiError> parse_role(const std::string& text, const std::string& param, ChatRole* out) {
  static const std::unordered_map<std::string, ChatRole> kRoles = {
      {"system", ChatRole::kSystem}, {"developer", ChatRole::kDeveloper}, {"user", ChatRole::kUser},
      {"assistant", ChatRole::kAssistant}, {"tool", ChatRole::kTool}};
  auto it = kRoles.find(text);
  if (it == kRoles.end())
    return ApiError::invalid_request(quoted(param) + " must be one of system, developer, user, assistant, tool.", param);
  *out = it->second;
  return std::nullopt;
}

// A tool result names the function it answers by call id; formats render the name, so look it up.
void resolve_tool_names(std::vector<ChatMessage>* messages) {
  std::unordered_map<std::string, std::string> names;
  for (auto& m : *messages) {
    for (const auto& call : m.tool_calls)
      if (!call.id.empty()) names[call.id] = call.name;
    if (m.role == ChatRole::kTool && m.name.empty()) {
      auto it = names.find(m.tool_call_id);
      if (it != names.end()) m.name = it->second;
    }
  }
}

std::optional<ApiError> parse_message(const Json& value, const std::string& param, ChatMessage* m) {
  if (!value.is_object()) return ApiError::invalid_request(quoted(param) + " must be an object.", param);
  Fields f(value, param);
  std::string role;
  MX_TRY(f.string("role", &role, true));
  MX_TRY(parse_role(role, f.param("role"), &m->role));
  if (const Json* content = f.find("content")) MX_TRY(parse_content(*content, f.param("content"), &m->content));
  if (m->role == ChatRole::kAssistant) {
    // Accept both names of the reasoning field (vLLM renamed reasoning_content to reasoning; clients differ).
    MX_TRY(f.string("reasoning", &m->reasoning));
    if (m->reasoning.empty()) MX_TRY(f.string("reasoning_content", &m->reasoning));
    if (const Json* calls = f.find("tool_calls")) MX_TRY(parse_tool_calls(*calls, f.param("tool_calls"), &m->tool_calls));
  } else if (!f.find("content")) {
    return f.missing("content");
  }
  if (m->role == ChatRole::kTool) {
    MX_TRY(f.string("tool_call_id", &m->tool_call_id));
    MX_TRY(f.string("name", &m->name));
  }
  return std::nullopt;
}

// {"type": "text" | "json_object" | "json_schema", ...}: chat's response_format (schema under json_schema)
// or Responses' text.format (flat: name, schema, strict beside type).
std::optional<ApiError> parse_format(const Json& v, const std::string& param, bool flat, OutputConstraint* out) {
  if (!v.is_object()) return ApiError::invalid_request(quoted(param) + " must be an object.", param);
  Fields f(v, param);
  std::string type;
  MX_TRY(f.string("type", &type, true));
  out->param = param;
  if (type == "text") {
    out->kind = OutputConstraint::Kind::kNone;
  } else if (type == "json_object") {
    out->kind = OutputConstraint::Kind::kJsonObject;
  } else if (type == "json_schema") {
    const Json* holder = &v;
    std::string where = param;
    if (!flat) {
      holder = f.find("json_schema");
      if (!holder) return f.missing("json_schema");
      if (!holder->is_object()) return f.type_error("json_schema", "an object");
      where = f.param("json_schema");
    }
    Fields g(*holder, where);
    const Json* schema = g.find("schema");
    if (!schema) return g.missing("schema");
    if (!schema->is_object() && !schema->is_boolean()) return g.type_error("schema", "an object");
    out->kind = OutputConstraint::Kind::kJsonSchema;
    out->schema = *schema;
    out->param = g.param("schema");
  } else {
    return ApiError::invalid_request(quoted(f.param("type")) + " must be text, json_object or json_schema.", f.param("type"));
  }
  return std::nullopt;
}

// vLLM's structured_outputs {json | regex | choice | grammar | json_object} and the older guided_* fields.
std::optional<ApiError> parse_vllm_constraint(const Json& v, const std::string& key, const std::string& param,
                                              OutputConstraint* out) {
  out->param = param;
  if (key == "json") {
    if (v.is_string()) {
      Json parsed = Json::parse(v.get<std::string>(), nullptr, false);
      if (parsed.is_discarded()) return ApiError::invalid_request(quoted(param) + " is not valid JSON.", param);
      out->schema = std::move(parsed);
    } else if (v.is_object() || v.is_boolean()) {
      out->schema = v;
    } else {
      return ApiError::invalid_request(quoted(param) + " must be a JSON schema.", param);
    }
    out->kind = OutputConstraint::Kind::kJsonSchema;
  } else if (key == "regex" || key == "grammar") {
    if (!v.is_string()) return ApiError::invalid_request(quoted(param) + " must be a string.", param);
    out->text = v.get<std::string>();
    out->kind = key == "regex" ? OutputConstraint::Kind::kRegex : OutputConstraint::Kind::kGrammar;
  } else if (key == "choice") {
    if (!v.is_array() || v.empty()) return ApiError::invalid_request(quoted(param) + " must be a non-empty array of strings.", param);
    for (const Json& c : v) {
      if (!c.is_string()) return ApiError::invalid_request(quoted(param) + " must be a non-empty array of strings.", param);
      out->choices.push_back(c.get<std::string>());
    }
    out->kind = OutputConstraint::Kind::kChoice;
  } else if (key == "json_object") {
    if (!v.is_boolean()) return ApiError::invalid_request(quoted(param) + " must be a boolean.", param);
    if (v.get<bool>()) out->kind = OutputConstraint::Kind::kJsonObject;
  } else {
    return ApiError::invalid_request(quoted(param) + " is not supported (json, regex, choice, grammar, json_object are).", param);
  }
  return std::nullopt;
}

// Every way a request can ask for structured output; more than one is an error (which would win is unclear).
std::optional<ApiError> parse_output_constraint(const Fields& f, bool responses, OutputConstraint* out) {
  std::vector<std::string> given;
  auto take = [&](const OutputConstraint& c, const std::string& param) {
    given.push_back(param);
    if (c.kind != OutputConstraint::Kind::kNone) *out = c;
  };
  if (!responses) {
    if (const Json* rf = f.find("response_format")) {
      OutputConstraint c;
      MX_TRY(parse_format(*rf, "response_format", /*flat=*/false, &c));
      take(c, "response_format");
    }
  } else if (const Json* text = f.find("text")) {
    if (!text->is_object()) return f.type_error("text", "an object");
    if (const Json* format = Fields(*text, "text").find("format")) {
      OutputConstraint c;
      MX_TRY(parse_format(*format, "text.format", /*flat=*/true, &c));
      take(c, "text.format");
    }
  }
  if (const Json* so = f.find("structured_outputs")) {
    if (!so->is_object()) return f.type_error("structured_outputs", "an object");
    for (const auto& [key, value] : so->items()) {
      if (value.is_null()) continue;
      OutputConstraint c;
      MX_TRY(parse_vllm_constraint(value, key, "structured_outputs." + key, &c));
      take(c, "structured_outputs." + key);
    }
  }
  for (const char* key : {"json", "regex", "choice", "grammar"}) {
    const std::string name = std::string("guided_") + key;
    if (const Json* v = f.find(name)) {
      OutputConstraint c;
      MX_TRY(parse_vllm_constraint(*v, key, name, &c));
      take(c, name);
    }
  }
  if (given.size() > 1) {
    return ApiError::invalid_request("Only one structured output may be given; got " + given[0] + " and " + given[1] + ".",
                                     given[1]);
  }
  return std::nullopt;
}

// vLLM's thinking_token_budget (chat and responses): a non-negative count of reasoning tokens.
std::optional<ApiError> parse_thinking_budget(const Fields& f, ChatRequest* out) {
  if (!f.find("thinking_token_budget")) return std::nullopt;
  int64_t budget = 0;
  MX_TRY(f.integer("thinking_token_budget", 0, INT64_MAX, &budget));
  out->thinking_token_budget = budget;
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_chat_request(const Json& body, ChatRequest* out) {
  Fields f(body, "");
  MX_TRY(f.string("model", &out->model));
  const Json* messages = f.find("messages");
  if (!messages) return f.missing("messages");
  if (!messages->is_array() || messages->empty())
    return ApiError::invalid_request("'messages' must be a non-empty array.", "messages");
  for (size_t i = 0; i < messages->size(); ++i) {
    ChatMessage m;
    MX_TRY(parse_message((*messages)[i], indexed("messages", i), &m));
    out->messages.push_back(std::move(m));
  }
  resolve_tool_names(&out->messages);
  MX_TRY(parse_tools(f, /*flat=*/false, &out->tools));
  MX_TRY(parse_tool_choice(f, out->tools, &out->tool_choice));
  MX_TRY(f.boolean("parallel_tool_calls", &out->parallel_tool_calls));
  MX_TRY(parse_output_constraint(f, /*responses=*/false, &out->output));
  std::string effort;
  MX_TRY(f.string("reasoning_effort", &effort));
  if (!effort.empty()) MX_TRY(parse_effort(effort, "reasoning_effort", out));
  MX_TRY(parse_template_kwargs(f, out));
  MX_TRY(parse_thinking_budget(f, out));
  MX_TRY(parse_sampling(f, {"max_completion_tokens", "max_tokens"}, &out->sampling));
  MX_TRY(f.boolean("logprobs", &out->sampling.logprobs));
  MX_TRY(f.integer("top_logprobs", 0, kMaxTopLogprobs, &out->sampling.top_logprobs));
  if (out->sampling.top_logprobs > 0 && !out->sampling.logprobs)
    return ApiError::invalid_request("'top_logprobs' requires 'logprobs' to be true.", "top_logprobs");
  MX_TRY(parse_stream(f, &out->stream));
  return std::nullopt;
}

std::optional<ApiError> parse_completion_request(const Json& body, CompletionRequest* out) {
  Fields f(body, "");
  MX_TRY(f.string("model", &out->model));
  const Json* prompt = f.find("prompt");
  if (!prompt) return f.missing("prompt");
  auto token_prompt = [](const Json& ids, const std::string& param, CompletionPrompt* p) -> std::optional<ApiError> {
    p->is_tokens = true;
    for (size_t i = 0; i < ids.size(); ++i) {
      int64_t id = 0;
      MX_TRY(Fields::integer_value(ids[i], indexed(param, i), 0, INT32_MAX, &id));
      p->token_ids.push_back(id);
    }
    if (p->token_ids.empty()) return ApiError::invalid_request(quoted(param) + " must not be empty.", param);
    return std::nullopt;
  };
  if (prompt->is_string()) {
    out->prompts.push_back({prompt->get<std::string>(), {}, false});
  } else if (prompt->is_array() && !prompt->empty() && (*prompt)[0].is_number()) {
    CompletionPrompt p;
    MX_TRY(token_prompt(*prompt, "prompt", &p));
    out->prompts.push_back(std::move(p));
  } else if (prompt->is_array() && !prompt->empty()) {
    if (static_cast<int64_t>(prompt->size()) > kMaxPrompts)
      return ApiError::invalid_request("'prompt' may hold at most " + std::to_string(kMaxPrompts) + " prompts.", "prompt");
    for (size_t i = 0; i < prompt->size(); ++i) {
      const Json& item = (*prompt)[i];
      CompletionPrompt p;
      if (item.is_string()) p.text = item.get<std::string>();
      else if (item.is_array()) MX_TRY(token_prompt(item, indexed("prompt", i), &p));
      else return ApiError::invalid_request(quoted(indexed("prompt", i)) + " must be a string or an array of token ids.",
                                            indexed("prompt", i));
      out->prompts.push_back(std::move(p));
    }
  } else {
    return ApiError::invalid_request("'prompt' must be a non-empty string, array of strings or array of token ids.",
                                     "prompt");
  }
  for (size_t i = 0; i < out->prompts.size(); ++i)
    if (!out->prompts[i].is_tokens && out->prompts[i].text.empty())
      return ApiError::invalid_request("Prompts must not be empty.", out->prompts.size() == 1 ? "prompt" : indexed("prompt", i));
  MX_TRY(parse_sampling(f, {"max_tokens"}, &out->sampling));
  if (!f.find("max_tokens")) out->sampling.max_tokens = 16;  // OpenAI's documented default for completions
  // Completions spell logprobs as a count of alternatives (0-5 in OpenAI's API).
  if (const Json* lp = f.find("logprobs")) {
    int64_t count = 0;
    MX_TRY(Fields::integer_value(*lp, "logprobs", 0, 5, &count));
    out->sampling.logprobs = true;
    out->sampling.top_logprobs = count;
  }
  MX_TRY(f.boolean("echo", &out->echo));
  // The whole completion follows the constraint (vLLM accepts the same fields here as on chat).
  MX_TRY(parse_output_constraint(f, /*responses=*/false, &out->output));
  if (static_cast<int64_t>(out->prompts.size()) * out->sampling.n > kMaxPrompts)
    return ApiError::invalid_request("Prompts times 'n' must not exceed " + std::to_string(kMaxPrompts) + ".", "n");
  MX_TRY(parse_stream(f, &out->stream));
  return std::nullopt;
}

namespace {

// One item of Responses `input`: a message ({role, content} with or without type "message"), a
// function_call, a function_call_output, or a reasoning item from an earlier turn.
std::optional<ApiError> parse_responses_item(const Json& item, const std::string& param, std::vector<ChatMessage>* out) {
  if (!item.is_object()) return ApiError::invalid_request(quoted(param) + " must be an object.", param);
  Fields f(item, param);
  std::string type = "message";
  MX_TRY(f.string("type", &type));
  if (type == "message") {
    ChatMessage m;
    std::string role;
    MX_TRY(f.string("role", &role, true));
    MX_TRY(parse_role(role, f.param("role"), &m.role));
    if (m.role == ChatRole::kTool) return ApiError::invalid_request("Use function_call_output items for tool results.", f.param("role"));
    const Json* content = f.find("content");
    if (!content) return f.missing("content");
    MX_TRY(parse_content(*content, f.param("content"), &m.content));
    out->push_back(std::move(m));
  } else if (type == "function_call") {
    ToolCall call;
    MX_TRY(f.string("call_id", &call.id, true));
    MX_TRY(f.string("name", &call.name, true));
    MX_TRY(f.string("arguments", &call.arguments));
    // Consecutive calls (and a preceding reasoning item) belong to one assistant turn.
    if (out->empty() || out->back().role != ChatRole::kAssistant || !out->back().content.empty()) {
      ChatMessage m;
      m.role = ChatRole::kAssistant;
      out->push_back(std::move(m));
    }
    out->back().tool_calls.push_back(std::move(call));
  } else if (type == "function_call_output") {
    ChatMessage m;
    m.role = ChatRole::kTool;
    MX_TRY(f.string("call_id", &m.tool_call_id, true));
    const Json* output = f.find("output");
    if (!output) return f.missing("output");
    MX_TRY(parse_content(*output, f.param("output"), &m.content));
    out->push_back(std::move(m));
  } else if (type == "reasoning") {
    ChatMessage m;
    m.role = ChatRole::kAssistant;
    for (const char* key : {"content", "summary"}) {
      const Json* parts = f.find(key);
      if (!parts || !parts->is_array()) continue;
      for (const auto& part : *parts)
        if (part.is_object() && part.contains("text") && part["text"].is_string()) m.reasoning += part["text"].get<std::string>();
    }
    out->push_back(std::move(m));
  } else {
    return ApiError::invalid_request("Input item type '" + type + "' is not supported.", f.param("type"));
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_responses_request(const Json& body, ResponsesRequest* out) {
  Fields f(body, "");
  ChatRequest& chat = out->chat;
  MX_TRY(f.string("model", &chat.model));
  // previous_response_id and item_reference items were resolved before parsing (ResponseStore::expand).
  bool store = true;
  MX_TRY(f.boolean("store", &store));
  MX_TRY(f.string("instructions", &out->instructions));
  if (!out->instructions.empty()) chat.messages.push_back({ChatRole::kDeveloper, out->instructions, "", {}, "", ""});
  const Json* input = f.find("input");
  if (!input) return f.missing("input");
  if (input->is_string()) {
    chat.messages.push_back({ChatRole::kUser, input->get<std::string>(), "", {}, "", ""});
  } else if (input->is_array() && !input->empty()) {
    for (size_t i = 0; i < input->size(); ++i) MX_TRY(parse_responses_item((*input)[i], indexed("input", i), &chat.messages));
  } else {
    return ApiError::invalid_request("'input' must be a string or a non-empty array of items.", "input");
  }
  resolve_tool_names(&chat.messages);
  MX_TRY(parse_tools(f, /*flat=*/true, &chat.tools));
  MX_TRY(parse_tool_choice(f, chat.tools, &chat.tool_choice));
  MX_TRY(f.boolean("parallel_tool_calls", &chat.parallel_tool_calls));
  MX_TRY(parse_output_constraint(f, /*responses=*/true, &chat.output));
  if (const Json* reasoning = f.find("reasoning")) {
    if (!reasoning->is_object()) return f.type_error("reasoning", "an object");
    std::string effort;
    MX_TRY(Fields(*reasoning, "reasoning").string("effort", &effort));
    if (!effort.empty()) MX_TRY(parse_effort(effort, "reasoning.effort", &chat));
  }
  MX_TRY(f.number("temperature", 0.0, 2.0, &chat.sampling.temperature));
  MX_TRY(f.number("top_p", 0.0, 1.0, &chat.sampling.top_p));
  if (chat.sampling.top_p <= 0.0) return ApiError::invalid_request("'top_p' must be greater than 0.", "top_p");
  int64_t max_output = 0;
  MX_TRY(parse_thinking_budget(f, &chat));
  MX_TRY(f.integer("max_output_tokens", 1, INT64_MAX, &max_output));
  if (max_output > 0) chat.sampling.max_tokens = max_output;
  MX_TRY(f.boolean("stream", &chat.stream.stream));
  chat.stream.include_usage = chat.stream.stream;  // usage rides on response.completed
  return std::nullopt;
}

namespace {

bool objects_small(const Json& value) {
  if (value.is_object() && value.size() > kMaxOrderedKeys) return false;
  if (value.is_structured())
    for (const auto& child : value) if (!objects_small(child)) return false;
  return true;
}

}  // namespace

void restore_tool_schema_order(std::string_view body, const Json& parsed_body, std::vector<FunctionTool>* tools) {
  if (tools->empty() || !parsed_body.contains("tools") || !objects_small(parsed_body["tools"])) return;
  // Depth 1 is the top-level object's members: only "tools" is kept; everything else is skipped unbuilt.
  auto keep_tools = [](int depth, nlohmann::ordered_json::parse_event_t event, nlohmann::ordered_json& value) {
    return !(depth == 1 && event == nlohmann::ordered_json::parse_event_t::key && value != "tools");
  };
  const auto ordered = nlohmann::ordered_json::parse(body, keep_tools, /*allow_exceptions=*/false);
  if (ordered.is_discarded() || !ordered.is_object() || !ordered.contains("tools") || !ordered["tools"].is_array()) return;
  for (const auto& t : ordered["tools"]) {
    if (!t.is_object()) continue;
    // Chat nests {name, parameters} under "function"; Responses has them next to "type".
    const auto& f = t.contains("function") && t["function"].is_object() ? t["function"] : t;
    if (!f.contains("name") || !f["name"].is_string() || !f.contains("parameters") || !f["parameters"].is_object()) continue;
    for (FunctionTool& tool : *tools)
      if (tool.name == f["name"].get<std::string>()) tool.parameters = f["parameters"];
  }
}

}  // namespace mx::server
