#include "chat/harmony/harmony_renderer.h"

#include "chat/harmony/harmony_tokens.h"

namespace mx {
namespace {

constexpr std::string_view kConstrainMarker = "<|constrain|>";

// Lines of a description as Rust's str::lines() gives them: split at '\n', a trailing "\r" dropped, no
// empty last line for text ending in a newline.
std::vector<std::string> description_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string line = text.substr(pos, eol - pos);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
    pos = eol + 1;
  }
  return lines;
}

bool has_no_parameters(const nlohmann::ordered_json& params) {
  if (params.is_null()) return true;
  if (!params.is_object() || params.value("type", "") != "object") return false;
  auto props = params.find("properties");
  return props == params.end() || (props->is_object() && props->empty());
}

std::string functions_namespace(const std::vector<HarmonyFunctionTool>& tools) {
  std::vector<std::string> parts = {"## functions\n", "namespace functions {\n"};
  for (const auto& tool : tools) {
    for (const auto& line : description_lines(tool.description)) parts.push_back("// " + line);
    if (has_no_parameters(tool.parameters)) {
      parts.push_back("type " + tool.name + " = () => any;\n");
    } else {
      parts.push_back("type " + tool.name + " = (_: " + json_schema_to_typescript(tool.parameters, "") + ") => any;\n");
    }
  }
  parts.push_back("} // namespace functions");
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? "\n" : "") + parts[i];
  return "# Tools\n\n" + out;
}

std::string join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

std::string system_text(const HarmonyConversation& conv) {
  std::vector<std::string> sections;
  std::vector<std::string> top;
  if (!conv.model_identity.empty()) top.push_back(conv.model_identity);
  if (!conv.knowledge_cutoff.empty()) top.push_back("Knowledge cutoff: " + conv.knowledge_cutoff);
  if (!conv.current_date.empty()) top.push_back("Current date: " + conv.current_date);
  if (!top.empty()) sections.push_back(join(top, "\n"));
  sections.push_back(std::string("Reasoning: ") + reasoning_effort_name(conv.reasoning_effort));
  if (!conv.valid_channels.empty()) {
    std::string channels = "# Valid channels: " + join(conv.valid_channels, ", ") +
                           ". Channel must be included for every message.";
    if (!conv.tools.empty()) channels += "\nCalls to these tools must go to the commentary channel: 'functions'.";
    sections.push_back(channels);
  }
  return join(sections, "\n\n");
}

std::string developer_text(const HarmonyConversation& conv) {
  std::vector<std::string> sections;
  if (!conv.instructions.empty()) {
    sections.push_back("# Instructions");
    sections.push_back(conv.instructions);
  }
  if (!conv.tools.empty()) sections.push_back(functions_namespace(conv.tools));
  return join(sections, "\n\n");
}

// A header field must not smuggle header syntax (spaces, newlines, markers) into the message.
bool is_header_word(const std::string& s) {
  for (char c : s) {
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == '<' || c == '>') return false;
  }
  return true;
}

class PromptBuilder {
 public:
  explicit PromptBuilder(const Tokenizer& tok) : tok_(tok) {}
  void text(std::string_view s) { tok_.encode_into(s, SpecialTokens::kAsText, &ids_); }
  void special(int32_t id) { ids_.push_back(id); }

  Status message(const HarmonyMessage& m) {
    special(harmony::kStart);
    if (m.role == HarmonyRole::kTool) {
      if (m.author_name.empty()) return invalid_argument("a tool message needs the tool's name");
      if (!is_header_word(m.author_name)) return invalid_argument("bad tool name '" + m.author_name + "'");
      text(m.author_name);
    } else {
      text(harmony_role_name(m.role));
      if (!m.author_name.empty()) {
        if (!is_header_word(m.author_name)) return invalid_argument("bad author name '" + m.author_name + "'");
        text(":" + m.author_name);
      }
    }
    if (!m.recipient.empty() && m.recipient != "all") {
      if (!is_header_word(m.recipient)) return invalid_argument("bad recipient '" + m.recipient + "'");
      text(" to=" + m.recipient);
    }
    if (!m.channel.empty()) {
      if (!is_header_word(m.channel)) return invalid_argument("bad channel '" + m.channel + "'");
      special(harmony::kChannel);
      text(m.channel);
    }
    if (!m.content_type.empty()) {
      if (m.content_type.rfind(kConstrainMarker, 0) == 0) {
        text(" ");
        special(harmony::kConstrain);
        const std::string rest = m.content_type.substr(kConstrainMarker.size());
        if (!is_header_word(rest)) return invalid_argument("bad content type '" + m.content_type + "'");
        text(rest);
      } else {
        if (!is_header_word(m.content_type)) return invalid_argument("bad content type '" + m.content_type + "'");
        text(" " + m.content_type);
      }
    }
    special(harmony::kMessage);
    text(m.content);
    // History never carries <|return|>: a finished answer is stored with <|end|>.
    const bool is_call = m.role == HarmonyRole::kAssistant && !m.recipient.empty();
    special(is_call ? harmony::kCall : harmony::kEnd);
    return Status::ok();
  }

  std::vector<int32_t> take() { return std::move(ids_); }

 private:
  const Tokenizer& tok_;
  std::vector<int32_t> ids_;
};

}  // namespace

const char* harmony_role_name(HarmonyRole role) {
  switch (role) {
    case HarmonyRole::kSystem: return "system";
    case HarmonyRole::kDeveloper: return "developer";
    case HarmonyRole::kUser: return "user";
    case HarmonyRole::kAssistant: return "assistant";
    case HarmonyRole::kTool: return "tool";
  }
  return "user";
}

HarmonyMessage HarmonyMessage::user(std::string text) {
  HarmonyMessage m;
  m.role = HarmonyRole::kUser;
  m.content = std::move(text);
  return m;
}

HarmonyMessage HarmonyMessage::assistant(std::string channel, std::string text) {
  HarmonyMessage m;
  m.role = HarmonyRole::kAssistant;
  m.channel = std::move(channel);
  m.content = std::move(text);
  return m;
}

HarmonyMessage HarmonyMessage::tool_call(const std::string& function_name, std::string arguments_json) {
  HarmonyMessage m;
  m.role = HarmonyRole::kAssistant;
  m.channel = "commentary";
  m.recipient = "functions." + function_name;
  m.content_type = "<|constrain|>json";
  m.content = std::move(arguments_json);
  return m;
}

HarmonyMessage HarmonyMessage::tool_result(const std::string& function_name, std::string content) {
  HarmonyMessage m;
  m.role = HarmonyRole::kTool;
  m.author_name = "functions." + function_name;
  m.recipient = "assistant";
  m.channel = "commentary";
  m.content = std::move(content);
  return m;
}

Result<std::vector<int32_t>> render_harmony_prompt(const Tokenizer& tokenizer, const HarmonyConversation& conv) {
  for (const auto& tool : conv.tools) {
    if (tool.name.empty() || !is_header_word(tool.name))
      return invalid_argument("bad function tool name '" + tool.name + "'");
  }
  PromptBuilder b(tokenizer);
  if (conv.include_system_message) {
    HarmonyMessage sys;
    sys.role = HarmonyRole::kSystem;
    sys.content = system_text(conv);
    MX_RETURN_IF_ERROR(b.message(sys));
  }
  if (!conv.instructions.empty() || !conv.tools.empty()) {
    HarmonyMessage dev;
    dev.role = HarmonyRole::kDeveloper;
    dev.content = developer_text(conv);
    MX_RETURN_IF_ERROR(b.message(dev));
  }

  const auto& msgs = conv.messages;
  bool last_assistant_is_final = false;
  for (auto it = msgs.rbegin(); it != msgs.rend(); ++it) {
    if (it->role == HarmonyRole::kAssistant) {
      last_assistant_is_final = it->channel == "final";
      break;
    }
  }
  size_t first_final = msgs.size();
  for (size_t i = 0; i < msgs.size(); ++i) {
    if (msgs[i].channel == "final") {
      first_final = i;
      break;
    }
  }
  const bool drop = conv.drop_analysis && last_assistant_is_final;
  for (size_t i = 0; i < msgs.size(); ++i) {
    if (drop && i < first_final && msgs[i].channel == "analysis") continue;
    MX_RETURN_IF_ERROR(b.message(msgs[i]).with_context("message " + std::to_string(i)));
  }
  b.special(harmony::kStart);
  b.text("assistant");
  return b.take();
}

}  // namespace mx
