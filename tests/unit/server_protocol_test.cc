// Pieces of the server without sockets: UTF-8 and nesting checks, request parsing details the HTTP
// tests do not reach, and the Prometheus text format.
#include <gtest/gtest.h>

#include "server/json_text.h"
#include "server/metrics.h"
#include "server/openai_request.h"

namespace mx::server {
namespace {

TEST(ServerProtocol, Utf8Checks) {
  EXPECT_FALSE(find_invalid_utf8("plain ascii, \xc3\xa9, \xe2\x82\xac, \xf0\x9f\x98\x80"));
  EXPECT_EQ(find_invalid_utf8("ab\xff"), 2u);
  EXPECT_EQ(find_invalid_utf8("\xc0\xaf"), 0u);          // overlong '/'
  EXPECT_EQ(find_invalid_utf8("x\xed\xa0\x80"), 1u);     // surrogate
  EXPECT_EQ(find_invalid_utf8("\xf4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(find_invalid_utf8("\xe2\x82"), 0u);          // cut off
  // Streams hold back a character cut in the middle and pass everything else through.
  EXPECT_EQ(complete_utf8_prefix("ab\xe2\x82"), 2u);
  EXPECT_EQ(complete_utf8_prefix("ab\xe2\x82\xac"), 5u);
  EXPECT_EQ(complete_utf8_prefix("ab\xff"), 3u);
  // Output never throws on bad bytes; they become U+FFFD.
  EXPECT_EQ(json_text(Json("a\xff")), "\"a\xef\xbf\xbd\"");
}

TEST(ServerProtocol, NestingDepthIgnoresBracketsInStrings) {
  EXPECT_EQ(json_nesting_depth(R"({"a":[1,{"b":"[[[[{{{{"}]})", 100), 3);
  EXPECT_EQ(json_nesting_depth(R"(["\"[[["])", 100), 1);
  EXPECT_EQ(json_nesting_depth(std::string(1000000, '['), 64), 65);  // stops early
}

TEST(ServerProtocol, ChatParsingDetails) {
  const Json body = Json::parse(R"({
    "messages": [
      {"role": "system", "content": "sys"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null, "reasoning_content": "think",
       "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "42"}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}],
    "tool_choice": {"type": "function", "function": {"name": "f"}},
    "max_tokens": 7, "max_completion_tokens": 9, "stop": "END", "seed": -1, "top_k": 5,
    "logprobs": true, "top_logprobs": 3, "stream": true, "stream_options": {"include_usage": true}
  })");
  ChatRequest r;
  ASSERT_FALSE(parse_chat_request(body, &r));
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[1].content, "ab");
  EXPECT_EQ(r.messages[2].reasoning, "think");
  EXPECT_EQ(r.messages[2].tool_calls[0].arguments, R"({"x":1})");
  EXPECT_EQ(r.messages[3].name, "f");  // resolved from the call id
  EXPECT_EQ(r.tool_choice.mode, ToolChoice::Mode::kNamed);
  EXPECT_EQ(r.sampling.max_tokens, 9);  // max_completion_tokens wins
  EXPECT_EQ(r.sampling.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(r.sampling.seed, UINT64_MAX);
  EXPECT_EQ(r.sampling.top_k, 5);
  EXPECT_EQ(r.sampling.top_logprobs, 3);
  EXPECT_TRUE(r.stream.stream && r.stream.include_usage);
  EXPECT_EQ(r.reasoning_effort, ReasoningEffort::kMedium);
  EXPECT_DOUBLE_EQ(r.sampling.temperature, 1.0);  // gpt-oss's default, not llama.cpp's 0.8
}

// Thinking on/off: a reasoning level turns it on, "none" off, chat_template_kwargs.enable_thinking (or
// `thinking`) wins over both; absent, the format decides.
TEST(ServerProtocol, ThinkingFromReasoningEffortAndTemplateKwargs) {
  auto thinking = [](const std::string& extra) {
    ChatRequest r;
    EXPECT_FALSE(parse_chat_request(Json::parse(R"({"messages":[{"role":"user","content":"hi"}])" + extra + "}"), &r));
    return r.thinking;
  };
  EXPECT_EQ(thinking(""), std::nullopt);
  EXPECT_EQ(thinking(R"(,"reasoning_effort":"low")"), true);
  EXPECT_EQ(thinking(R"(,"reasoning_effort":"none")"), false);
  EXPECT_EQ(thinking(R"(,"chat_template_kwargs":{"enable_thinking":true})"), true);
  EXPECT_EQ(thinking(R"(,"reasoning_effort":"high","chat_template_kwargs":{"enable_thinking":false})"), false);
  EXPECT_EQ(thinking(R"(,"chat_template_kwargs":{"thinking":true,"other":1})"), true);
  ChatRequest r;
  auto error = parse_chat_request(Json::parse(R"({"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"enable_thinking":"yes"}})"), &r);
  ASSERT_TRUE(error);
  EXPECT_EQ(error->param, "chat_template_kwargs.enable_thinking");
}

TEST(ServerProtocol, ResponsesInputItemsBecomeChatMessages) {
  const Json body = Json::parse(R"({
    "instructions": "be brief",
    "input": [
      {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
      {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "call it"}]},
      {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "c1", "output": "sunny"}
    ],
    "tools": [{"type": "function", "name": "get_weather"}], "max_output_tokens": 100
  })");
  ResponsesRequest r;
  ASSERT_FALSE(parse_responses_request(body, &r));
  const auto& m = r.chat.messages;
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0].role, ChatRole::kDeveloper);
  EXPECT_EQ(m[1].content, "weather?");
  EXPECT_EQ(m[2].role, ChatRole::kAssistant);  // reasoning and the call form one assistant turn
  EXPECT_EQ(m[2].reasoning, "call it");
  ASSERT_EQ(m[2].tool_calls.size(), 1u);
  EXPECT_EQ(m[3].role, ChatRole::kTool);
  EXPECT_EQ(m[3].name, "get_weather");
  EXPECT_EQ(r.chat.sampling.max_tokens, 100);
}

TEST(ServerProtocol, PrometheusText) {
  MetricsRegistry registry("m\"x");
  Counter* c = registry.counter({"mx:c_total"}, "A counter.");
  Histogram* h = registry.histogram({"mx:h_seconds", "other:h_seconds"}, "A histogram.", {0.1, 1.0});
  c->add(2);
  h->observe(0.05);
  h->observe(0.5);
  h->observe(5.0);
  const std::string text = registry.render();
  EXPECT_NE(text.find("# TYPE mx:c_total counter\nmx:c_total{model_name=\"m\\\"x\"} 2\n"), std::string::npos) << text;
  // Bounds in their shortest form: alert rules match `le="0.1"` as text.
  EXPECT_NE(text.find("mx:h_seconds_bucket{model_name=\"m\\\"x\",le=\"0.1\"} 1\n"), std::string::npos) << text;
  // One series under two names, each with its own HELP/TYPE.
  EXPECT_NE(text.find("# TYPE other:h_seconds histogram\nother:h_seconds_bucket{model_name=\"m\\\"x\",le=\"0.1\"} 1\n"),
            std::string::npos) << text;
  EXPECT_EQ(server::metric_number(0.3), "0.3");
  EXPECT_EQ(server::metric_number(2560), "2560");
  EXPECT_EQ(server::metric_number(1e-3), "0.001");
  EXPECT_NE(text.find("mx:h_seconds_bucket{model_name=\"m\\\"x\",le=\"1\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("mx:h_seconds_bucket{model_name=\"m\\\"x\",le=\"+Inf\"} 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("mx:h_seconds_count{model_name=\"m\\\"x\"} 3\n"), std::string::npos) << text;
}

TEST(ServerProtocol, ToolSchemasKeepTheClientsKeyOrder) {
  const std::string chat_text = R"({"messages":[{"role":"user","content":"x"}],"big":{"a":1},
    "tools":[{"type":"function","function":{"name":"f","parameters":
      {"type":"object","properties":{"zeta":{"type":"string"},"alpha":{"type":"number"}},"required":["zeta"]}}}]})";
  const Json body = Json::parse(chat_text);
  ChatRequest r;
  ASSERT_FALSE(parse_chat_request(body, &r));
  EXPECT_EQ(r.tools[0].parameters["properties"].begin().key(), "alpha");  // Json sorted them
  restore_tool_schema_order(chat_text, body, &r.tools);
  EXPECT_EQ(r.tools[0].parameters["properties"].begin().key(), "zeta");
  EXPECT_EQ(r.tools[0].parameters.begin().key(), "type");
  // Responses' flat tools too.
  const std::string responses_text =
      R"({"input":"x","tools":[{"type":"function","name":"g","parameters":{"properties":{"b":{},"a":{}},"type":"object"}}]})";
  const Json rbody = Json::parse(responses_text);
  ResponsesRequest rr;
  ASSERT_FALSE(parse_responses_request(rbody, &rr));
  restore_tool_schema_order(responses_text, rbody, &rr.chat.tools);
  EXPECT_EQ(rr.chat.tools[0].parameters.begin().key(), "properties");
  EXPECT_EQ(rr.chat.tools[0].parameters["properties"].begin().key(), "b");
}

}  // namespace
}  // namespace mx::server
