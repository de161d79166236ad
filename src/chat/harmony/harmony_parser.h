// Harmony streaming parser: the token ids gpt-oss generates after `<|start|>assistant` become reasoning,
// content and tool calls, as events while streaming and as one result at the end.
//
// It works on ids, not text, so special tokens are never confused with text that merely looks like them.
// It is tolerant by design, because real outputs break the grammar: the recipient may come before or after
// <|channel|>, <|constrain|> may lack its leading space, " json" may stand without <|constrain|>, tool calls
// may sit on the analysis channel or use a bare name, the final <|call|> may be missing, <|return|> and
// <|end|> may be stray, and there may be any number of messages. Messages are classified by recipient first
// (any recipient other than assistant/user/all is a tool call), then by channel: analysis -> reasoning,
// final/commentary/none -> content. It never throws and never drops text: what it cannot place goes to
// content and is counted in `unplaced_tokens`. Pushing ids one at a time or all at once gives the same
// result, and the concatenated deltas equal the final fields.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "chat/chat_format.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace mx {

// The interface's events (chat_format.h), under the names the Harmony tests use.
using HarmonyEventType = ChatEventType;
using HarmonyEvent = ChatEvent;

struct HarmonyToolCall {
  std::string name;          // "get_weather" (the "functions." prefix removed)
  std::string recipient;     // as written, e.g. "functions.get_weather" or "get_weather"
  std::string channel;       // usually commentary; analysis happens
  std::string content_type;  // e.g. "<|constrain|>json", "json", "code", or empty
  std::string arguments;     // the message body: JSON text (not validated here)
  bool closed = false;       // ended by <|call|> or another end token (false: cut off at the end of stream)
};

struct HarmonyParseResult {
  std::string reasoning;
  std::string content;
  std::vector<HarmonyToolCall> tool_calls;
  int64_t messages = 0;         // messages seen, complete or not
  int64_t unplaced_tokens = 0;  // tokens outside the grammar (their text went to content; stray specials dropped)
  int64_t header_bytes = 0;     // header text read as structure (roles, channels, recipients, content types)
  int32_t last_end_token = -1;  // <|return|>, <|call|>, <|end|>, <|endoftext|>, or -1
};

class HarmonyStreamParser final : public ChatStreamParser {
 public:
  // `tokenizer` must outlive the parser. The stream starts right after the prompt's <|start|>assistant.
  explicit HarmonyStreamParser(const Tokenizer& tokenizer) : tok_(&tokenizer) {}

  // Feeds ids; appends the events they complete to *events (which may be null when only the result matters).
  void push(int32_t id, std::vector<HarmonyEvent>* events) override;
  void push(std::span<const int32_t> ids, std::vector<HarmonyEvent>* events);
  // End of stream: flushes held-back bytes and a pending header, closes an open message or tool call.
  void finish(std::vector<HarmonyEvent>* events) override;

  const HarmonyParseResult& result() const { return result_; }

 private:
  enum class State { kHeader, kBody, kBetween };
  enum class Target { kReasoning, kContent, kToolCall };

  struct Header {
    bool role_known = true;  // false after a <|start|> inside the stream: the first word is the role
    std::string text;        // header text with <|channel|> / <|constrain|> written out
    std::vector<int32_t> text_ids;  // the header's text tokens, to place them as content if it is not a header
    int tokens = 0;
  };
  struct Parsed {
    bool ok = true;  // false: something in it was not understood (it still classifies what it can)
    Target target = Target::kContent;
    std::string channel, recipient, content_type;
    std::string leftover;  // header words not understood, in order: they become content
  };

  void on_special(int32_t id, std::vector<HarmonyEvent>* events);
  void on_text(int32_t id, std::vector<HarmonyEvent>* events);
  void start_header(bool role_known);
  void begin_body(const Parsed& parsed, std::vector<HarmonyEvent>* events);
  // The header turned out not to be one: its text goes to content.
  void header_to_content(std::vector<HarmonyEvent>* events);
  void end_message(int32_t end_token, std::vector<HarmonyEvent>* events);
  void emit(Target target, std::string text, std::vector<HarmonyEvent>* events);
  static Parsed parse_header(const Header& header);

  const Tokenizer* tok_;
  State state_ = State::kHeader;
  Header header_;
  Target target_ = Target::kContent;
  int tool_index_ = -1;
  bool implicit_body_ = false;  // a body that no header opened: each of its tokens is unplaced
  Utf8StreamDecoder utf8_;
  std::string bytes_;  // scratch
  HarmonyParseResult result_;
};

}  // namespace mx
