// The Harmony streaming parser on hand-built token streams: one test per quirk of real gpt-oss outputs,
// harmony's own test-data streams, and stream/one-shot agreement.
#include <gtest/gtest.h>

#include <sstream>

#include "chat/harmony/harmony_parser.h"
#include "chat/harmony/harmony_tokens.h"
#include "tokenizer_util.h"

namespace mx {
namespace {

using testing::ids_of;
using testing::o200k;
namespace h = harmony;

struct Parsed {
  HarmonyParseResult result;
  std::vector<HarmonyEvent> events;
};

Parsed parse(const std::vector<int32_t>& ids) {
  HarmonyStreamParser p(o200k());
  Parsed out;
  for (const int32_t id : ids) p.push(id, &out.events);
  p.finish(&out.events);
  out.result = p.result();
  return out;
}

// Deltas concatenated per field must equal the final result.
void expect_events_match(const Parsed& parsed) {
  std::string reasoning, content;
  std::vector<std::string> args(parsed.result.tool_calls.size());
  for (const auto& e : parsed.events) {
    if (e.type == HarmonyEventType::kReasoningDelta) reasoning += e.text;
    if (e.type == HarmonyEventType::kContentDelta) content += e.text;
    if (e.type == HarmonyEventType::kToolCallArgumentsDelta) args.at(e.tool_index) += e.text;
    if (e.type == HarmonyEventType::kToolCallStart) {
      EXPECT_EQ(e.text, parsed.result.tool_calls.at(e.tool_index).name);
    }
  }
  EXPECT_EQ(reasoning, parsed.result.reasoning);
  EXPECT_EQ(content, parsed.result.content);
  for (size_t i = 0; i < args.size(); ++i) EXPECT_EQ(args[i], parsed.result.tool_calls[i].arguments);
}

std::vector<int32_t> read_ids(const std::string& name) {
  std::istringstream in(testing::read_fixture("harmony/" + name + ".txt"));
  std::vector<int32_t> ids;
  int32_t id;
  while (in >> id) ids.push_back(id);
  return ids;
}

TEST(HarmonyParser, SimpleReasoningResponseFromHarmonyTestData) {
  // analysis ... <|return|> (stray) <|start|>assistant<|channel|>final ... (no end token)
  const Parsed p = parse(read_ids("test_simple_reasoning_response"));
  EXPECT_EQ(p.result.reasoning, "User asks: \"What is 2 + 2?\" Simple arithmetic. Provide answer.");
  EXPECT_EQ(p.result.content, "2 + 2 = 4.");
  EXPECT_TRUE(p.result.tool_calls.empty());
  EXPECT_EQ(p.result.messages, 2);
  EXPECT_EQ(p.result.unplaced_tokens, 0);
  expect_events_match(p);
}

TEST(HarmonyParser, BareToolNameOnAnalysisChannelWithCodeTypeFromHarmonyTestData) {
  // ... <|start|>assistant to=lookup_weather<|channel|>analysis code<|message|>{"location": "Tokyo"} (no <|call|>)
  const Parsed p = parse(read_ids("test_simple_tool_call"));
  EXPECT_EQ(p.result.reasoning, "User asks: \"What is the weather in Tokyo?\" We need to use lookup_weather tool.");
  ASSERT_EQ(p.result.tool_calls.size(), 1u);
  EXPECT_EQ(p.result.tool_calls[0].name, "lookup_weather");
  EXPECT_EQ(p.result.tool_calls[0].channel, "analysis");
  EXPECT_EQ(p.result.tool_calls[0].content_type, "code");
  EXPECT_EQ(p.result.tool_calls[0].arguments, "{\"location\": \"Tokyo\"}");
  EXPECT_FALSE(p.result.tool_calls[0].closed);  // the stream ends without <|call|>
  EXPECT_EQ(p.result.content, "");
  expect_events_match(p);
}

TEST(HarmonyParser, RecipientBeforeChannelAsHarmonyRendersIt) {
  const Parsed p = parse(ids_of({h::kChannel, "analysis", h::kMessage, "Need weather.", h::kEnd, h::kStart, "assistant",
                                 " to=functions.get_weather", h::kChannel, "commentary", " ", h::kConstrain, "json",
                                 h::kMessage, "{\"location\":\"Paris\"}", h::kCall}));
  EXPECT_EQ(p.result.reasoning, "Need weather.");
  ASSERT_EQ(p.result.tool_calls.size(), 1u);
  EXPECT_EQ(p.result.tool_calls[0].name, "get_weather");
  EXPECT_EQ(p.result.tool_calls[0].recipient, "functions.get_weather");
  EXPECT_EQ(p.result.tool_calls[0].content_type, "<|constrain|>json");
  EXPECT_EQ(p.result.tool_calls[0].arguments, "{\"location\":\"Paris\"}");
  EXPECT_TRUE(p.result.tool_calls[0].closed);
  EXPECT_EQ(p.result.last_end_token, h::kCall);
  EXPECT_EQ(p.result.unplaced_tokens, 0);
  expect_events_match(p);
}

TEST(HarmonyParser, RecipientAfterChannelWithoutSpaceBeforeConstrain) {
  const Parsed p = parse(ids_of({h::kChannel, "commentary to=functions.get_weather", h::kConstrain, "json", h::kMessage,
                                 "{\"latitude\":48.8566,\"longitude\":2.3522}", h::kCall}));
  ASSERT_EQ(p.result.tool_calls.size(), 1u);
  EXPECT_EQ(p.result.tool_calls[0].name, "get_weather");
  EXPECT_EQ(p.result.tool_calls[0].channel, "commentary");
  EXPECT_EQ(p.result.tool_calls[0].content_type, "<|constrain|>json");
  EXPECT_EQ(p.result.tool_calls[0].arguments, "{\"latitude\":48.8566,\"longitude\":2.3522}");
  EXPECT_EQ(p.result.unplaced_tokens, 0);
}

TEST(HarmonyParser, PlainJsonWithoutConstrainAsTheHfTemplateWritesIt) {
  const Parsed p = parse(ids_of({" to=functions.f", h::kChannel, "commentary json", h::kMessage, "{}", h::kCall}));
  ASSERT_EQ(p.result.tool_calls.size(), 1u);
  EXPECT_EQ(p.result.tool_calls[0].name, "f");
  EXPECT_EQ(p.result.tool_calls[0].content_type, "json");
  EXPECT_EQ(p.result.tool_calls[0].arguments, "{}");
  EXPECT_EQ(p.result.unplaced_tokens, 0);
}

TEST(HarmonyParser, ToolCallOnAnalysisChannelIsStillAToolCall) {
  const Parsed p = parse(ids_of({h::kChannel, "analysis to=functions.search", " ", h::kConstrain, "json", h::kMessage,
                                 "{\"q\":\"x\"}", h::kCall}));
  ASSERT_EQ(p.result.tool_calls.size(), 1u);
  EXPECT_EQ(p.result.tool_calls[0].name, "search");
  EXPECT_EQ(p.result.tool_calls[0].channel, "analysis");
  EXPECT_EQ(p.result.reasoning, "");  // the arguments do not leak into reasoning
}

TEST(HarmonyParser, MissingCallAtTheEndClosesTheCallAtFinish) {
  const Parsed p = parse(ids_of({h::kChannel, "commentary to=functions.f <|constrain|>json", h::kMessage, "{\"a\":1}"}));
  // "<|constrain|>" above is plain text (ids_of encodes strings as text), as a model could write it.
  ASSERT_EQ(p.result.tool_calls.size(), 1u);
  EXPECT_EQ(p.result.tool_calls[0].arguments, "{\"a\":1}");
  EXPECT_FALSE(p.result.tool_calls[0].closed);
  ASSERT_FALSE(p.events.empty());
  EXPECT_EQ(p.events.back().type, HarmonyEventType::kMessageEnd);
  EXPECT_EQ(p.events.back().end_token, -1);
}

TEST(HarmonyParser, ToolCallEndedByReturnAndStrayEndTokens) {
  const Parsed p = parse(ids_of({h::kChannel, "final", h::kMessage, "Done.", h::kEnd, h::kReturn, h::kEnd, h::kStart,
                                 "assistant to=functions.g", h::kChannel, "commentary", h::kMessage, "{}", h::kReturn,
                                 h::kReturn}));
  EXPECT_EQ(p.result.content, "Done.");
  ASSERT_EQ(p.result.tool_calls.size(), 1u);
  EXPECT_EQ(p.result.tool_calls[0].name, "g");
  EXPECT_TRUE(p.result.tool_calls[0].closed);
  EXPECT_EQ(p.result.unplaced_tokens, 3);  // two stray ends and one stray return, counted, nothing lost
}

TEST(HarmonyParser, ManyMessages) {
  const Parsed p = parse(ids_of({h::kChannel, "analysis", h::kMessage, "Think 1.", h::kEnd,                     //
                                 h::kStart, "assistant", h::kChannel, "commentary", h::kMessage, "Plan: two calls.", h::kEnd,
                                 h::kStart, "assistant", h::kChannel, "analysis", h::kMessage, " Think 2.", h::kEnd,
                                 h::kStart, "assistant to=functions.a", h::kChannel, "commentary", h::kMessage, "{\"x\":1}", h::kCall,
                                 h::kStart, "assistant to=functions.b", h::kChannel, "commentary", h::kMessage, "{\"y\":2}", h::kCall,
                                 h::kStart, "assistant", h::kChannel, "final", h::kMessage, " Answer.", h::kReturn}));
  EXPECT_EQ(p.result.reasoning, "Think 1. Think 2.");
  EXPECT_EQ(p.result.content, "Plan: two calls. Answer.");
  ASSERT_EQ(p.result.tool_calls.size(), 2u);
  EXPECT_EQ(p.result.tool_calls[0].name, "a");
  EXPECT_EQ(p.result.tool_calls[1].arguments, "{\"y\":2}");
  EXPECT_EQ(p.result.messages, 6);
  EXPECT_EQ(p.result.unplaced_tokens, 0);
  EXPECT_EQ(p.result.last_end_token, h::kReturn);
  expect_events_match(p);
}

TEST(HarmonyParser, TextWithoutAnyHeaderBecomesCountedContent) {
  const std::string text =
      "I cannot help with that request, but here is a long explanation of why that goes on for quite a while "
      "so that it is clearly longer than any header could ever be, and then it ends.";
  const Parsed p = parse(ids_of({text}));
  EXPECT_EQ(p.result.content, text);
  EXPECT_GT(p.result.unplaced_tokens, 0);
  expect_events_match(p);
  const Parsed short_text = parse(ids_of({"Hi there."}));  // short: released at the end of the stream
  EXPECT_EQ(short_text.result.content, "Hi there.");
}

TEST(HarmonyParser, SkippedStartOrEndStillSeparatesMessages) {
  const Parsed p = parse(ids_of({h::kChannel, "analysis", h::kMessage, "think", h::kChannel, "final", h::kMessage,
                                 "answer", h::kStart, "assistant", h::kChannel, "final", h::kMessage, "!", h::kEnd}));
  EXPECT_EQ(p.result.reasoning, "think");
  EXPECT_EQ(p.result.content, "answer!");
  EXPECT_EQ(p.result.messages, 3);
}

TEST(HarmonyParser, HallucinatedToolResponseAndUnknownChannelGoToContent) {
  const Parsed p = parse(ids_of({h::kChannel, "commentary to=browser.search code", h::kMessage, "{\"query\":\"x\"}",
                                 h::kCall, h::kStart, "browser.search to=assistant", h::kChannel, "commentary",
                                 h::kMessage, "{\"result\":1}", h::kEnd, h::kStart, "assistant", h::kChannel,
                                 "\xE2\x80\x93\xE2\x80\x93" "commentary", h::kMessage, "ok", h::kEnd, h::kStart, "assistant",
                                 h::kChannel, "weird", h::kMessage, "text", h::kEnd}));
  ASSERT_EQ(p.result.tool_calls.size(), 1u);
  EXPECT_EQ(p.result.tool_calls[0].name, "browser.search");
  EXPECT_EQ(p.result.content, "browser.search{\"result\":1}okweirdtext");
  EXPECT_EQ(p.result.unplaced_tokens, 2);  // the foreign-role header and the unknown channel
}

TEST(HarmonyParser, StreamableParserTextFromHarmonyTestData) {
  std::string text = testing::read_fixture("harmony/test_streamable_parser.txt");
  while (!text.empty() && text.back() == '\n') text.pop_back();
  const Parsed p = parse(o200k().encode(text, SpecialTokens::kAllow));
  EXPECT_EQ(p.result.reasoning.rfind("User asks \"Who is the current US president?\"", 0), 0u);
  ASSERT_EQ(p.result.tool_calls.size(), 1u);
  EXPECT_EQ(p.result.tool_calls[0].name, "browser.search");
  EXPECT_EQ(p.result.tool_calls[0].arguments, "{\"query\": \"current US president July 2025\", \"topn\": 10, \"source\": \"news\"}");
  expect_events_match(p);
}

TEST(HarmonyParser, HeaderCutOffAndEmptyToolCall) {
  Parsed p = parse(ids_of({h::kChannel, "final"}));  // max_tokens hit inside the header
  EXPECT_EQ(p.result.content, "");
  EXPECT_EQ(p.result.unplaced_tokens, 0);
  p = parse(ids_of({h::kChannel, "commentary to=functions.now", h::kCall}));  // no <|message|>, no arguments
  ASSERT_EQ(p.result.tool_calls.size(), 1u);
  EXPECT_EQ(p.result.tool_calls[0].name, "now");
  EXPECT_EQ(p.result.tool_calls[0].arguments, "");
}

TEST(HarmonyParser, Utf8SplitAcrossTokensIsNeverSplitInDeltas) {
  // "é😀" as single-byte tokens: deltas may only carry whole characters.
  std::vector<int32_t> ids = ids_of({h::kChannel, "final", h::kMessage});
  for (unsigned char c : std::string("\xC3\xA9\xF0\x9F\x98\x80")) ids.push_back(*o200k().rank_of(std::string(1, c)));
  ids.push_back(*o200k().rank_of("\xF0\x9F"));  // a dangling prefix at the end of the message
  ids.push_back(h::kEnd);
  const Parsed p = parse(ids);
  EXPECT_EQ(p.result.content, "\xC3\xA9\xF0\x9F\x98\x80\xEF\xBF\xBD");
  for (const auto& e : p.events) {
    if (e.type == HarmonyEventType::kContentDelta) {
      EXPECT_TRUE(e.text == "\xC3\xA9" || e.text == "\xF0\x9F\x98\x80" || e.text == "\xEF\xBF\xBD") << e.text;
    }
  }
}

TEST(HarmonyParser, EndOfTextStopsAndUnknownIdsDoNotCrash) {
  const Parsed p = parse({h::kChannel, 17196 /* final */, h::kMessage, 13225 /* Hello */, -7, 999999, h::kEndOfText, 201087});
  EXPECT_EQ(p.result.content, "Hello\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(p.result.last_end_token, h::kEndOfText);
  EXPECT_EQ(p.result.unplaced_tokens, 3);
}

}  // namespace
}  // namespace mx
