// The Harmony token constraint (chat/harmony/harmony_constraint.h, planned by server/structured_output.h)
// on hand-written o200k transcripts: every token of what gpt-oss writes for an allowed message is inside its
// step's mask, a token the request does not allow is outside it, and the reasoning budget closes the
// analysis.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "chat/chat_constraint.h"
#include "chat/harmony/harmony_format.h"
#include "server/structured_output.h"
#include "tokenizer_util.h"

namespace mx::server {
namespace {

using testing::ids_of;
using testing::Piece;

int32_t special(const char* name) {
  const auto id = testing::o200k().special_id(name);
  EXPECT_TRUE(id.has_value()) << name;
  return id.value_or(-1);
}

StructuredOutputs& outputs() {
  // Not owned: the fixture tokenizer lives as long as the test process. No background threads: the masks
  // are built on demand, which must give the same answers.
  static StructuredOutputs so(
      HarmonyFormat::create(std::shared_ptr<const Tokenizer>(&testing::o200k(), [](const Tokenizer*) {})).value(), 0);
  return so;
}

ChatRequest weather_request(ToolChoice::Mode mode) {
  ChatRequest r;
  FunctionTool tool;
  tool.name = "get_weather";
  tool.parameters = nlohmann::ordered_json::parse(
      R"({"type":"object","properties":{"city":{"enum":["Paris","Oslo"]},"days":{"type":"integer","minimum":1,"maximum":7}},)"
      R"("required":["city","days"],"additionalProperties":false})");
  r.tools.push_back(tool);
  r.tool_choice.mode = mode;
  if (mode == ToolChoice::Mode::kNamed) r.tool_choice.name = "get_weather";
  return r;
}

// Feeds `ids` through a fresh constraint of `request`: the index of the first token outside its step's mask,
// or -1 when every token was allowed.
int64_t first_refused(const ChatRequest& request, const std::vector<int32_t>& ids, int64_t reasoning_budget = -1) {
  std::shared_ptr<const TurnConstraintPlan> plan;
  const auto error = outputs().plan_for(request, &plan);
  EXPECT_FALSE(error.has_value()) << error->message;
  if (!plan) return -2;
  auto constraint = plan->make(reasoning_budget);
  const int64_t vocab = testing::o200k().vocab_size();
  std::vector<uint32_t> mask(static_cast<size_t>((vocab + 31) / 32));
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (constraint->fill_mask(mask.data(), vocab) && !((mask[id >> 5] >> (id & 31)) & 1u)) return static_cast<int64_t>(i);
    constraint->accept(id);
  }
  return -1;
}

std::vector<int32_t> tool_call(bool with_content_type, const std::string& arguments) {
  const int32_t channel = special("<|channel|>"), message = special("<|message|>"), end = special("<|end|>"),
                start = special("<|start|>"), call = special("<|call|>"), constrain = special("<|constrain|>");
  std::vector<int32_t> ids = ids_of({channel, Piece("analysis"), message, Piece("Need weather."), end, start,
                                     Piece("assistant"), channel});
  const auto header = with_content_type ? ids_of({Piece("commentary to=functions.get_weather "), constrain, Piece("json")})
                                        : ids_of({Piece("commentary to=functions.get_weather")});
  ids.insert(ids.end(), header.begin(), header.end());
  const auto body = ids_of({message, Piece(arguments), call});
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

TEST(HarmonyConstraint, ToolCallsWithAndWithoutConstrainJson) {
  for (const auto mode : {ToolChoice::Mode::kRequired, ToolChoice::Mode::kNamed}) {
    const ChatRequest r = weather_request(mode);
    EXPECT_EQ(first_refused(r, tool_call(true, R"({"city":"Oslo","days":3})")), -1);
    EXPECT_EQ(first_refused(r, tool_call(false, R"({"city":"Paris","days":7})")), -1);
    // Arguments outside the tool's schema: refused inside the body, after the header.
    const auto bad = tool_call(true, R"({"city":"Rome","days":3})");
    const int64_t at = first_refused(r, bad);
    EXPECT_GT(at, static_cast<int64_t>(tool_call(true, "").size()) - 2);
    const auto too_many_days = tool_call(false, R"({"city":"Oslo","days":9})");
    EXPECT_GT(first_refused(r, too_many_days), 0);
  }
}

TEST(HarmonyConstraint, ConstrainOnlyAfterAToolHeader) {
  ChatRequest r;
  r.output.kind = OutputConstraint::Kind::kChoice;
  r.output.choices = {"yes", "no"};
  r.output.param = "guided_choice";
  const int32_t channel = special("<|channel|>"), message = special("<|message|>"), ret = special("<|return|>"),
                constrain = special("<|constrain|>");
  EXPECT_EQ(first_refused(r, ids_of({channel, Piece("final"), message, Piece("yes"), ret})), -1);
  EXPECT_EQ(first_refused(r, ids_of({channel, Piece("final"), constrain})), 2);
  EXPECT_EQ(first_refused(r, ids_of({channel, Piece("final"), message, Piece("maybe"), ret})), 3);
}

TEST(HarmonyConstraint, ReasoningBudgetClosesTheAnalysis) {
  const ChatRequest r = weather_request(ToolChoice::Mode::kRequired);
  const int32_t channel = special("<|channel|>"), message = special("<|message|>"), end = special("<|end|>");
  // "Need weather." is 3 tokens: with a budget of 2 the third is refused, <|end|> is the only way on.
  const auto analysis = ids_of({channel, Piece("analysis"), message, Piece("Need weather."), end});
  EXPECT_EQ(first_refused(r, analysis, 3), -1);
  EXPECT_EQ(first_refused(r, analysis, 2), 5);
  const auto closed_early = ids_of({channel, Piece("analysis"), message, Piece("Need weather"), end});
  EXPECT_EQ(first_refused(r, closed_early, 2), -1);
  // Budget 0: no analysis at all, the first header is the call.
  EXPECT_EQ(first_refused(r, analysis, 0), 1);
  EXPECT_EQ(first_refused(r, ids_of({channel, Piece("commentary to=functions.get_weather"), message,
                                      Piece(R"({"city":"Oslo","days":1})"), special("<|call|>")}), 0),
            -1);
}

// A budget that runs out inside a character: its remaining byte tokens pass, <|end|> only once it is whole
// (closing at once would end the reasoning in U+FFFD). o200k writes any character as its byte tokens.
TEST(HarmonyConstraint, ReasoningBudgetFinishesACutCharacter) {
  const ChatRequest r = weather_request(ToolChoice::Mode::kRequired);
  const int32_t channel = special("<|channel|>"), message = special("<|message|>"), end = special("<|end|>");
  const int32_t e7 = *testing::o200k().rank_of("\xE7"), b95 = *testing::o200k().rank_of("\x95"),
                b8c = *testing::o200k().rank_of("\x8C");  // U+754C
  const auto head = ids_of({channel, Piece("analysis"), message, Piece("Hi")});
  const int64_t budget = static_cast<int64_t>(ids_of({Piece("Hi")}).size()) + 1;  // spent right after E7
  auto with = [&](std::initializer_list<int32_t> tail) {
    auto ids = head;
    ids.insert(ids.end(), tail);
    return ids;
  };
  const auto at = static_cast<int64_t>(head.size());
  EXPECT_EQ(first_refused(r, with({e7, b95, b8c, end}), budget), -1);
  EXPECT_EQ(first_refused(r, with({e7, end}), budget), at + 1);  // not while the character is cut
  EXPECT_EQ(first_refused(r, with({e7, b95, end}), budget), at + 2);
  EXPECT_EQ(first_refused(r, with({e7, e7}), budget), at + 1);  // nor another character
  EXPECT_EQ(first_refused(r, with({e7, b95, b8c, b95}), budget), at + 3);  // whole: only <|end|>
  EXPECT_EQ(first_refused(r, with({e7, b95, b8c}), budget - 1), at);  // spent before the character: <|end|>
}

// ReasoningBudget on a hand-made vocabulary: which continuations pass, and the hard cap on the overrun.
TEST(ReasoningBudget, OnlyContinuationsOfACutCharacterThenTheClose) {
  // 0..5 text tokens, 6 the close (a special: no bytes). E0 takes A0..BF second, then one of 80..BF.
  const grammar::TokenVocabulary vocab({"a", "\xE0", "\xA4", "\x80", "\xA4\x80", "\x80\x80\x80", ""});
  const std::vector<uint32_t> text = {0x3Fu};
  const int32_t close = 6;
  auto allowed = [&](const ReasoningBudget& b) {
    uint32_t words = 0;
    b.fill_mask(vocab, text, close, &words, 7);
    return words;
  };
  ReasoningBudget b(2);
  EXPECT_EQ(allowed(b), 0x7Fu);
  b.accept(vocab, 0);
  b.accept(vocab, 1);  // spent, inside E0
  EXPECT_EQ(allowed(b), (1u << 2) | (1u << 4));  // A4, or A4 80 which completes it; not 80 (E0 80 is ill-formed)
  b.accept(vocab, 2);
  EXPECT_EQ(allowed(b), (1u << 2) | (1u << 3));  // one more byte of 80..BF
  b.accept(vocab, 3);
  EXPECT_EQ(allowed(b), 1u << close);
  // A forced transcript that keeps starting characters past the budget: the close alone after three.
  ReasoningBudget forced(1);
  for (int i = 0; i < 3; ++i) {
    forced.accept(vocab, 1);
    EXPECT_EQ(allowed(forced), (1u << 2) | (1u << 4)) << i;
  }
  forced.accept(vocab, 1);
  EXPECT_EQ(allowed(forced), 1u << close);
  ReasoningBudget unbounded(-1);
  unbounded.accept(vocab, 1);
  EXPECT_EQ(allowed(unbounded), 0x7Fu);
}

TEST(HarmonyConstraint, ThinkingBudgetAloneLeavesTheAnswerFree) {
  ChatRequest r;
  r.thinking_token_budget = 1;
  const int32_t channel = special("<|channel|>"), message = special("<|message|>"), end = special("<|end|>"),
                start = special("<|start|>"), ret = special("<|return|>");
  EXPECT_EQ(first_refused(r, ids_of({channel, Piece("analysis"), message, Piece("Hm"), end, start, Piece("assistant"),
                                     channel, Piece("final"), message, Piece("Anything at all, {not JSON}"), ret})),
            -1);
}

}  // namespace
}  // namespace mx::server
