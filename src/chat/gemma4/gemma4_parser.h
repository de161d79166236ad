// Gemma-4's streaming output parser: the ids the model writes after `<|turn>model\n` become reasoning,
// content and tool calls.
//
// What the model writes: an optional thought `<|channel>thought\n...<channel|>` (reasoning; the "thought"
// label and the newline before <channel|> are structure), content, tool calls
// `<|tool_call>call:NAME{key:value,...}<tool_call|>` in the template's notation (bare keys, strings between
// <|"|> tokens, numbers, true/false, nested {} and []), and an end: <turn|>, <eos>, or <|tool_response>
// after calls (the model waits for results). Arguments come out as JSON text in the order written; a call is
// announced once it closes (its arguments are one delta). It works on ids, so text that only looks like a
// control token stays text. It never throws and never drops text: a call that does not parse, or that the
// stream cuts off, goes to content as written; a stray control token is dropped and counted.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "chat/chat_format.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace mx::gemma4 {

// The control ids the parser steers by (-1 where the tokenizer lacks one).
struct ControlIds {
  int32_t channel_open = -1, channel_close = -1;      // <|channel> <channel|>
  int32_t tool_call_open = -1, tool_call_close = -1;  // <|tool_call> <tool_call|>
  int32_t quote = -1;                                 // <|"|>
  std::vector<int32_t> ends;                          // <turn|>, <|tool_response>, <eos>
};

// A call's text between call: and the end, in the template's notation -> {name, JSON arguments}. False when
// it does not parse. Exposed for tests.
bool parse_tool_call(const std::string& body, std::string* name, std::string* arguments_json);

class StreamParser final : public ChatStreamParser {
 public:
  // `tokenizer` must outlive the parser.
  StreamParser(const Tokenizer& tokenizer, ControlIds ids) : tok_(&tokenizer), ids_(std::move(ids)) {}

  void push(int32_t id, std::vector<ChatEvent>* events) override;
  void finish(std::vector<ChatEvent>* events) override;

  int64_t unplaced_tokens() const { return unplaced_; }

 private:
  enum class State { kContent, kChannelLabel, kReasoning, kToolCall, kEnded };

  void on_text(int32_t id, std::vector<ChatEvent>* events);
  void emit(ChatEventType type, std::string text, std::vector<ChatEvent>* events);
  void emit_reasoning(std::string text, std::vector<ChatEvent>* events);
  // Closes what is open (a thought, a call in progress) before `next`.
  void close_open(std::vector<ChatEvent>* events);
  void end_tool_call(bool closed, std::vector<ChatEvent>* events);
  bool is_end(int32_t id) const;

  const Tokenizer* tok_;
  ControlIds ids_;
  State state_ = State::kContent;
  std::string label_;         // the channel's label so far ("thought")
  bool held_newline_ = false;  // reasoning's last "\n", dropped when <channel|> follows it
  std::string call_;          // a call's text since <|tool_call>, <|"|> written out
  int tool_index_ = 0;
  int64_t unplaced_ = 0;
  Utf8StreamDecoder utf8_;
  std::string bytes_;
};

}  // namespace mx::gemma4
