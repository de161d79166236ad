// Randomized robustness of the Harmony parser: 100,000 random id sequences mixing text tokens with every
// Harmony special (and ids outside the vocabulary). For each: no crash; feeding one id at a time, all at
// once, or in random chunks gives the same result; the deltas add up to the result; and no text is lost:
// every byte of every text token is in reasoning, content, tool arguments, or the headers the parser read.
#include <gtest/gtest.h>

#include <random>

#include "chat/harmony/harmony_parser.h"
#include "chat/harmony/harmony_tokens.h"
#include "tokenizer/utf8.h"
#include "tokenizer_util.h"

namespace mx {
namespace {

using testing::o200k;

bool same_result(const HarmonyParseResult& a, const HarmonyParseResult& b) {
  if (a.reasoning != b.reasoning || a.content != b.content || a.messages != b.messages ||
      a.unplaced_tokens != b.unplaced_tokens || a.header_bytes != b.header_bytes ||
      a.last_end_token != b.last_end_token || a.tool_calls.size() != b.tool_calls.size())
    return false;
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    const auto& x = a.tool_calls[i];
    const auto& y = b.tool_calls[i];
    if (x.name != y.name || x.recipient != y.recipient || x.channel != y.channel || x.content_type != y.content_type ||
        x.arguments != y.arguments || x.closed != y.closed)
      return false;
  }
  return true;
}

class Generator {
 public:
  explicit Generator(uint64_t seed) : rng_(seed) {
    for (const char* piece : {"assistant", " to=functions.f", " to=functions.get_weather", "to=", "analysis", "commentary",
                              "final", " json", "json", " code", " ", "functions", ".", "{\"a\": 1}", "Hello", " world"}) {
      for (int32_t id : o200k().encode(piece)) header_like_.push_back(id);
    }
    // Text tokens whose bytes are complete UTF-8, so that byte counts survive decoding unchanged.
    std::uniform_int_distribution<int32_t> any(0, o200k().num_ranks() - 1);
    while (valid_text_.size() < 4000) {
      const int32_t id = any(rng_);
      std::string bytes;
      if (o200k().append_token_bytes(id, &bytes) && utf8_is_valid(bytes)) valid_text_.push_back(id);
    }
  }

  // With arbitrary = true, any rank (partial UTF-8 included) and ids outside the vocabulary may appear.
  std::vector<int32_t> sequence(bool arbitrary) {
    static constexpr int32_t kSpecials[] = {harmony::kStart,  harmony::kChannel,    harmony::kMessage,
                                            harmony::kEnd,    harmony::kReturn,     harmony::kCall,
                                            harmony::kConstrain, harmony::kEndOfText, harmony::kStartOfText,
                                            harmony::kEndOfPrompt, 200000,          200013,
                                            201087};
    std::vector<int32_t> ids;
    const int n = std::uniform_int_distribution<int>(0, 48)(rng_);
    for (int i = 0; i < n; ++i) {
      const int kind = std::uniform_int_distribution<int>(0, 99)(rng_);
      if (kind < 30) {
        ids.push_back(kSpecials[std::uniform_int_distribution<size_t>(0, std::size(kSpecials) - 1)(rng_)]);
      } else if (kind < 55) {
        ids.push_back(header_like_[std::uniform_int_distribution<size_t>(0, header_like_.size() - 1)(rng_)]);
      } else if (!arbitrary || kind < 85) {
        ids.push_back(valid_text_[std::uniform_int_distribution<size_t>(0, valid_text_.size() - 1)(rng_)]);
      } else if (kind < 97) {
        ids.push_back(std::uniform_int_distribution<int32_t>(0, o200k().num_ranks() - 1)(rng_));
      } else {
        ids.push_back(std::uniform_int_distribution<int32_t>(-3, 300000)(rng_));
      }
    }
    return ids;
  }

  std::mt19937_64& rng() { return rng_; }

 private:
  std::mt19937_64 rng_;
  std::vector<int32_t> header_like_;
  std::vector<int32_t> valid_text_;
};

void check_sequence(const std::vector<int32_t>& ids, bool check_bytes, std::mt19937_64& rng, uint64_t seed, int index) {
  SCOPED_TRACE("seed " + std::to_string(seed) + " sequence " + std::to_string(index));
  std::vector<HarmonyEvent> events;
  HarmonyStreamParser one_by_one(o200k());
  for (const int32_t id : ids) one_by_one.push(id, &events);
  one_by_one.finish(&events);

  HarmonyStreamParser all_at_once(o200k());
  all_at_once.push(ids, nullptr);
  all_at_once.finish(nullptr);
  ASSERT_TRUE(same_result(one_by_one.result(), all_at_once.result()));

  HarmonyStreamParser chunked(o200k());
  for (size_t pos = 0; pos < ids.size();) {
    const size_t len = std::uniform_int_distribution<size_t>(1, 7)(rng);
    const size_t take = std::min(len, ids.size() - pos);
    chunked.push(std::span<const int32_t>(ids.data() + pos, take), nullptr);
    pos += take;
  }
  chunked.finish(nullptr);
  ASSERT_TRUE(same_result(one_by_one.result(), chunked.result()));

  const HarmonyParseResult& r = one_by_one.result();
  std::string reasoning, content;
  std::vector<std::string> args(r.tool_calls.size());
  for (const auto& e : events) {
    if (e.type == HarmonyEventType::kReasoningDelta) reasoning += e.text;
    if (e.type == HarmonyEventType::kContentDelta) content += e.text;
    if (e.type == HarmonyEventType::kToolCallArgumentsDelta) args.at(e.tool_index) += e.text;
  }
  ASSERT_EQ(reasoning, r.reasoning);
  ASSERT_EQ(content, r.content);
  for (size_t i = 0; i < args.size(); ++i) ASSERT_EQ(args[i], r.tool_calls[i].arguments);
  ASSERT_TRUE(utf8_is_valid(r.reasoning) && utf8_is_valid(r.content));

  if (check_bytes) {
    int64_t text_bytes = 0;
    for (const int32_t id : ids) {
      std::string bytes;
      if (!o200k().is_special(id) && o200k().append_token_bytes(id, &bytes)) text_bytes += bytes.size();
    }
    int64_t out_bytes = r.reasoning.size() + r.content.size() + r.header_bytes;
    for (const auto& call : r.tool_calls) out_bytes += call.arguments.size();
    ASSERT_EQ(out_bytes, text_bytes);
  }
}

TEST(HarmonyParserFuzz, HundredThousandRandomSequences) {
  const uint64_t seed = std::random_device()();
  std::printf("harmony parser fuzz seed %llu\n", static_cast<unsigned long long>(seed));
  Generator gen(seed);
  for (int i = 0; i < 100000; ++i) {
    const bool arbitrary = i % 4 == 3;  // a quarter with partial UTF-8 and unknown ids: crash/consistency only
    check_sequence(gen.sequence(arbitrary), !arbitrary, gen.rng(), seed, i);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace mx
