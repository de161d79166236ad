// The ChatFormat seam: formats by name, the tokenizer loaded with a format's special tokens, and Harmony
// behind the interface rendering the OpenAI mapping (system/developer -> instructions, reasoning ->
// analysis, tool calls -> commentary to functions.NAME, tool results from functions.NAME) and parsing like
// HarmonyStreamParser itself.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "chat/chat_formats.h"
#include "chat/harmony/harmony_format.h"
#include "chat/harmony/harmony_parser.h"
#include "chat/harmony/harmony_tokens.h"
#include "chat_test_util.h"
#include "model/model_registry.h"
#include "tokenizer_util.h"

namespace mx {
namespace {

const ChatTokenizer& harmony_chat() {
  static const ChatTokenizer chat = [] {
    auto loaded = load_chat_tokenizer(testing::fixture_path("tokenizer/o200k_base.tiktoken"), "harmony");
    EXPECT_TRUE(loaded.is_ok()) << loaded.status().to_string();
    return *loaded;
  }();
  return chat;
}

std::vector<ChatMessage> tool_turn_messages() {
  ChatMessage assistant{ChatRole::kAssistant, "", "Need the tool.", {{"call_1", "get_weather", R"({"city":"Paris"})"}}, "", ""};
  return {text_message(ChatRole::kSystem, "Be brief."),
          text_message(ChatRole::kDeveloper, "Answer in French."),
          text_message(ChatRole::kUser, "Weather in Paris?"),
          assistant,
          {ChatRole::kTool, "sunny", "", {}, "call_1", "get_weather"},
          text_message(ChatRole::kUser, "Thanks")};
}

TEST(ChatFormat, HarmonyRendersTheOpenAiMapping) {
  const ChatTokenizer& chat = harmony_chat();
  const std::vector<ChatMessage> messages = tool_turn_messages();
  Conversation conv;
  conv.messages = messages;
  conv.tools = {{"get_weather", "Weather now.", nlohmann::ordered_json::parse(R"({"type":"object","properties":{"city":{"type":"string"}}})")}};
  conv.reasoning_effort = ReasoningEffort::kHigh;

  HarmonyConversation want;
  want.reasoning_effort = ReasoningEffort::kHigh;
  want.instructions = "Be brief.\n\nAnswer in French.";
  want.tools = {{"get_weather", "Weather now.", conv.tools[0].parameters}};
  want.messages = {HarmonyMessage::user("Weather in Paris?"), HarmonyMessage::assistant("analysis", "Need the tool."),
                   HarmonyMessage::tool_call("get_weather", R"({"city":"Paris"})"),
                   HarmonyMessage::tool_result("get_weather", "sunny"), HarmonyMessage::user("Thanks")};
  auto got = chat.format->render(conv);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  EXPECT_EQ(*got, *render_harmony_prompt(*chat.tokenizer, want));
  EXPECT_EQ(got->back(), chat.tokenizer->encode("assistant").back());  // ends in <|start|>assistant

  // gpt-oss cannot stop reasoning: thinking off renders the lowest effort.
  conv.thinking = false;
  want.reasoning_effort = ReasoningEffort::kLow;
  EXPECT_EQ(*chat.format->render(conv), *render_harmony_prompt(*chat.tokenizer, want));
  EXPECT_NE(chat.tokenizer->decode(*chat.format->render(conv))->find("Reasoning: low"), std::string::npos);

  // A conversation the format cannot express is an error, not an abort.
  std::vector<ChatMessage> bad_name = {{ChatRole::kTool, "sunny", "", {}, "call_1", "get weather"}};
  conv.messages = bad_name;
  EXPECT_FALSE(chat.format->render(conv).is_ok());
}

TEST(ChatFormat, HarmonyStopsAtReturnAndCallOnly) {
  const ChatFormat& format = *harmony_chat().format;
  EXPECT_EQ(format.name(), "harmony");
  EXPECT_EQ(format.stop_ids(), (std::vector<int32_t>{harmony::kReturn, harmony::kCall}));
}

TEST(ChatFormat, HarmonyParserBehindTheInterfaceMatchesTheParser) {
  const ChatTokenizer& chat = harmony_chat();
  const std::vector<int32_t> ids = chat.tokenizer->encode(
      "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
      "<|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>",
      SpecialTokens::kAllow);
  auto parser = chat.format->make_parser();
  HarmonyStreamParser direct(*chat.tokenizer);
  std::vector<ChatEvent> a, b;
  for (int32_t id : ids) {
    parser->push(id, &a);
    direct.push(id, &b);
  }
  parser->finish(&a);
  direct.finish(&b);
  ASSERT_EQ(a.size(), b.size());
  std::string reasoning, name, arguments;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].type, b[i].type);
    EXPECT_EQ(a[i].text, b[i].text);
    if (a[i].type == ChatEventType::kReasoningDelta) reasoning += a[i].text;
    if (a[i].type == ChatEventType::kToolCallStart) name = a[i].text;
    if (a[i].type == ChatEventType::kToolCallArgumentsDelta) arguments += a[i].text;
  }
  EXPECT_EQ(reasoning, "Think.");
  EXPECT_EQ(name, "get_weather");
  EXPECT_EQ(arguments, R"({"city":"Paris"})");
}

TEST(ChatFormat, RegistryAndSpecialTokens) {
  auto unknown = make_chat_format("nope", harmony_chat().tokenizer);
  ASSERT_FALSE(unknown.is_ok());
  EXPECT_NE(unknown.status().message().find("harmony"), std::string::npos) << unknown.status().to_string();
  EXPECT_FALSE(chat_format_special_tokens("nope").is_ok());

  // The tokenizer takes only the file's specials (a .tiktoken file has none); Harmony refuses such a tokenizer.
  auto bare = Tokenizer::load(testing::fixture_path("tokenizer/o200k_base.tiktoken"));
  ASSERT_TRUE(bare.is_ok());
  EXPECT_FALSE((*bare)->special_id("<|start|>").has_value());
  auto refused = make_chat_format("harmony", *bare);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_NE(refused.status().message().find("<|startoftext|>"), std::string::npos) << refused.status().to_string();

  // A file that gives a format's special token another id fails to load.
  std::vector<SpecialToken> file = {{"<|start|>", 5}};
  const Status clash = add_implied_specials(&file, harmony::special_tokens());
  ASSERT_FALSE(clash.is_ok());
  EXPECT_NE(clash.message().find("<|start|>"), std::string::npos) << clash.to_string();

  // The registry names each family's format.
  auto format = model_chat_format(testing::fixture_path("tiny-gpt-oss"));
  ASSERT_TRUE(format.is_ok()) << format.status().to_string();
  EXPECT_EQ(*format, "harmony");
}

}  // namespace
}  // namespace mx
