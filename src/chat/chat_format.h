// ChatFormat: how one model family turns a conversation into prompt ids and its generated ids back into
// reasoning, content and tool calls. The server speaks only this interface; each format lives in its own
// folder (harmony/ for gpt-oss, gemma4/ for Gemma-4) and the model registry names the format a family uses
// (model_registry.h: model_chat_format), so a new format never touches src/server or src/runtime.
//
// What an implementation must do, and why:
// - render(): the whole prompt, ending where the model writes the next assistant turn (Harmony:
//   `<|start|>assistant`; Gemma-4: `<|turn>model\n`, plus the empty thought channel when thinking is off).
//   Text from the client is always encoded as ordinary text (SpecialTokens::kAsText), and only the format
//   adds special ids: a user who types "<|end|>" must never forge a token. A conversation the format cannot
//   express (a tool message without a name, a name that would break a header) is an error (it becomes a
//   400), never an abort. Tools arrive already filtered by tool_choice; their JSON Schemas keep the client's
//   key order (the model sees that order).
// - stop_ids(): the ids that end an assistant turn (Harmony: <|return|> and <|call|>; Gemma-4: <turn|>
//   and <eos>). The server stops chat generation on exactly these, whatever the checkpoint's
//   generation_config lists. Ids that close a message *inside* a turn (Harmony's <|end|> after the
//   analysis) must not be here.
// - make_parser(): a fresh streaming parser per choice. It must never throw and never drop text the model
//   wrote (what it cannot place goes to content), and feeding ids one at a time or all at once must give
//   the same events, because the engine delivers tokens in arbitrary batches. Reasoning, content and tool
//   calls come out in the order the model wrote them (the Responses API opens output items in that order).
// - plan_constraint() (structured outputs, chat_constraint.h): where the answer and tool-call arguments
//   start and end in the format's output, how the reasoning is closed when its budget runs out, and which
//   tool call prefixes a required or named tool_choice forces. tool_argument_notation() and
//   tool_argument_special_tokens() say how the format writes arguments, so the server compiles a tool's
//   JSON Schema to a grammar of that notation. A format that cannot do this keeps the default, which
//   refuses (a 400 naming the field), never silently unconstrained output.
// - special_tokens(): registered with the format in chat_formats.cc, so that a tokenizer file that lacks
//   them (a bare .tiktoken rank file has none) still gets them; a file that gives them other ids fails to
//   load. The tokenizer knows no format: it takes its specials from the file plus this list.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "grammar/json_schema.h"
#include "tokenizer/tokenizer.h"

namespace mx {

// ---- The conversation, as the client sent it (OpenAI chat semantics, no format's vocabulary) ----

enum class ChatRole { kSystem, kDeveloper, kUser, kAssistant, kTool };

// How hard the model should think. gpt-oss has three levels and cannot turn reasoning off; formats with
// on/off thinking only (Gemma-4) read Conversation::thinking instead.
enum class ReasoningEffort { kLow, kMedium, kHigh };
const char* reasoning_effort_name(ReasoningEffort effort);

struct ToolCall {
  std::string id;         // "call_..." as the client received it
  std::string name;
  std::string arguments;  // JSON text, as OpenAI carries it (formats that need values parse it)
};

struct ChatMessage {
  ChatRole role = ChatRole::kUser;
  std::string content;    // text parts joined; "" when null
  std::string reasoning;  // assistant: `reasoning` or `reasoning_content` (clients send either)
  std::vector<ToolCall> tool_calls;  // assistant
  std::string tool_call_id;          // tool
  std::string name;  // tool: the function answered (from the matching assistant call when not given)
};

struct FunctionTool {
  std::string name;
  std::string description;
  // JSON Schema in the client's key order (the order the model sees).
  nlohmann::ordered_json parameters = nlohmann::ordered_json::object();
};

// A view of one request's conversation; the messages must outlive the render call.
struct Conversation {
  std::span<const ChatMessage> messages;
  std::vector<FunctionTool> tools;  // what the model may call (tool_choice already applied)
  ReasoningEffort reasoning_effort = ReasoningEffort::kMedium;
  // Unset: the format's default. false: as little reasoning as the model allows (Harmony: low effort, since
  // gpt-oss always reasons). true: reasoning on (Harmony: reasoning_effort as given).
  std::optional<bool> thinking;
};

// ---- Generated ids -> events ----

enum class ChatEventType {
  kReasoningDelta,          // text: more reasoning
  kContentDelta,            // text: more user-visible content
  kToolCallStart,           // text: the function name; tool_index: the call's index within the choice
  kToolCallArgumentsDelta,  // text: more argument JSON text; tool_index
  kMessageEnd,              // end_token: the id that closed the message, -1 when implied
};

struct ChatEvent {
  ChatEventType type;
  std::string text;
  int tool_index = -1;
  int32_t end_token = -1;
};

class ChatStreamParser {
 public:
  virtual ~ChatStreamParser() = default;
  // Feeds one generated id; appends the events it completes to *events (null: only the state advances).
  virtual void push(int32_t id, std::vector<ChatEvent>* events) = 0;
  // End of generation: flushes held-back bytes and closes an open message or tool call.
  virtual void finish(std::vector<ChatEvent>* events) = 0;
};

class GrammarCompiler;
struct TurnConstraintSpec;
class TurnConstraintPlan;

class ChatFormat {
 public:
  virtual ~ChatFormat() = default;

  // The registry's name ("harmony"), for logs and errors.
  virtual std::string name() const = 0;
  // The tokenizer the format encodes with (loaded with its special tokens).
  virtual const Tokenizer& tokenizer() const = 0;
  // The prompt ids, ending where the model writes the next assistant turn.
  virtual Result<std::vector<int32_t>> render(const Conversation& conversation) const = 0;
  // Ids that end an assistant turn: chat generation stops on them.
  virtual const std::vector<int32_t>& stop_ids() const = 0;
  // A parser for one generated stream, which starts right after render()'s last id.
  virtual std::unique_ptr<ChatStreamParser> make_parser() const = 0;

  // ---- Structured outputs (chat_constraint.h) ----
  // The notation tool-call arguments are written in (default: JSON).
  virtual grammar::JsonSchemaOptions tool_argument_notation() const { return {}; }
  // Special tokens inside written arguments, with the bytes tool_argument_notation() spells them as
  // (Gemma-4: <|"|> around strings). Empty: arguments are ordinary text.
  virtual std::vector<std::pair<int32_t, std::string>> tool_argument_special_tokens() const { return {}; }
  // One request's constraint on the turn the model writes next; grammars the format needs beyond `spec`'s
  // are compiled through `compiler`. Default: an error saying the format has none.
  virtual Result<std::shared_ptr<const TurnConstraintPlan>> plan_constraint(const TurnConstraintSpec& spec,
                                                                            GrammarCompiler& compiler) const;
};

}  // namespace mx
