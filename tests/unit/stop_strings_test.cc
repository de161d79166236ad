// Stop strings over a fake byte-level detokenizer: held back while they may still match, released as soon
// as they cannot, matched across token boundaries, cut from the text; incomplete UTF-8 is held back too.
#include "runtime/stop_strings.h"

#include <gtest/gtest.h>

namespace mx {
namespace {

// Token t < 256 is the byte t; 256 + i is kPieces[i] (multi-byte pieces).
const std::vector<std::string> kPieces = {"hello", " world", "\xC3", "\xA9", "STOP", "ST", "OP"};

DetokenizeFn fake_detokenizer() {
  return [](std::span<const int32_t> ids) {
    std::string s;
    for (int32_t id : ids) s += id < 256 ? std::string(1, static_cast<char>(id)) : kPieces[static_cast<size_t>(id - 256)];
    return s;
  };
}

struct Fed {
  std::vector<int32_t> tokens;
  StopStringMatcher m;
  bool feed(int32_t t) {
    tokens.push_back(t);
    return m.append(tokens);
  }
  std::string safe_text() const { return m.text().substr(0, static_cast<size_t>(m.safe_text_end())); }
};

TEST(StopStrings, HoldsBackAPossibleStartAndReleasesItWhenItCannotMatch) {
  const DetokenizeFn detok = fake_detokenizer();
  Fed f{{}, StopStringMatcher(&detok, {"abc"}, 16)};
  EXPECT_FALSE(f.feed('x'));
  EXPECT_EQ(f.safe_text(), "x");
  EXPECT_EQ(f.m.safe_tokens(), 1);
  EXPECT_FALSE(f.feed('a'));
  EXPECT_EQ(f.safe_text(), "x");  // "a" may start "abc"
  EXPECT_EQ(f.m.safe_tokens(), 1);
  EXPECT_FALSE(f.feed('b'));
  EXPECT_EQ(f.safe_text(), "x");
  EXPECT_FALSE(f.feed('d'));  // "abd" cannot match: all released
  EXPECT_EQ(f.safe_text(), "xabd");
  EXPECT_EQ(f.m.safe_tokens(), 4);
}

TEST(StopStrings, MatchesAcrossTokensAndCutsTheStopString) {
  const DetokenizeFn detok = fake_detokenizer();
  Fed f{{}, StopStringMatcher(&detok, {"STOP", "world"}, 16)};
  EXPECT_FALSE(f.feed(256));       // "hello"
  EXPECT_FALSE(f.feed(' '));
  EXPECT_FALSE(f.feed(256 + 5));   // "ST"
  EXPECT_EQ(f.safe_text(), "hello ");
  EXPECT_TRUE(f.feed(256 + 6));    // "OP" completes "STOP"
  EXPECT_TRUE(f.m.matched());
  EXPECT_EQ(f.m.matched_stop(), "STOP");
  EXPECT_EQ(f.safe_text(), "hello ");
  EXPECT_EQ(f.m.safe_tokens(), 4);  // every token is released at the end
}

TEST(StopStrings, EarliestMatchWinsWithinOneToken) {
  const DetokenizeFn detok = fake_detokenizer();
  Fed f{{}, StopStringMatcher(&detok, {"world", "o w"}, 16)};
  EXPECT_FALSE(f.feed(256));      // "hello": "o" may start "o w"
  EXPECT_EQ(f.safe_text(), "hell");
  EXPECT_TRUE(f.feed(256 + 1));   // " world" completes both; "o w" starts earlier
  EXPECT_EQ(f.m.matched_stop(), "o w");
  EXPECT_EQ(f.safe_text(), "hell");
}

TEST(StopStrings, IncompleteUtf8IsHeldBackUntilComplete) {
  const DetokenizeFn detok = fake_detokenizer();
  Fed f{{}, StopStringMatcher(&detok, {}, 16)};
  EXPECT_FALSE(f.feed('a'));
  EXPECT_FALSE(f.feed(256 + 2));  // first byte of "é"
  EXPECT_EQ(f.safe_text(), "a");
  EXPECT_EQ(f.m.safe_tokens(), 2);  // tokens are never held without stop strings
  EXPECT_FALSE(f.feed(256 + 3));
  EXPECT_EQ(f.safe_text(), "a\xC3\xA9");
  // At the end whatever is left is released, complete or not.
  EXPECT_FALSE(f.feed(256 + 2));
  f.m.finish();
  EXPECT_EQ(f.safe_text(), "a\xC3\xA9\xC3");
}

TEST(StopStrings, ContextDependentDecodingUsesTheWindow) {
  // A detokenizer that drops the leading space of the first token (as sentencepiece does): the matcher
  // must use decode(window + t) - decode(window), not decode(t).
  const DetokenizeFn detok = [](std::span<const int32_t> ids) {
    std::string s;
    for (int32_t id : ids) s += " w" + std::to_string(id);
    return s.substr(1);
  };
  Fed f{{}, StopStringMatcher(&detok, {"w2 w3"}, 16)};
  EXPECT_FALSE(f.feed(1));
  EXPECT_FALSE(f.feed(2));
  EXPECT_EQ(f.m.text(), "w1 w2");
  EXPECT_EQ(f.safe_text(), "w1 ");
  EXPECT_TRUE(f.feed(3));
  EXPECT_EQ(f.safe_text(), "w1 ");
}

}  // namespace
}  // namespace mx

// The same matcher over the real o200k tokenizer (tests/fixtures/tokenizer).
#include "chat/harmony/harmony_tokens.h"
#include "runtime/tokenizer_detokenize.h"
#include "tokenizer_util.h"

namespace mx {
namespace {

std::shared_ptr<const Tokenizer> shared_o200k() {
  static std::shared_ptr<const Tokenizer> tok = [] {
    auto t = Tokenizer::load(testing::fixture_path("tokenizer/o200k_base.tiktoken"), harmony::special_tokens());
    EXPECT_TRUE(t.is_ok()) << t.status().to_string();
    return *t;
  }();
  return tok;
}

TEST(StopStringsO200k, StopsInsideATokenAndHoldsBackMultiTokenCharacters) {
  const DetokenizeFn detok = make_detokenize_fn(shared_o200k());
  const std::string text = "The answer is 42, said the 🦙 model. Done.";
  const std::vector<int32_t> ids = shared_o200k()->encode(text);
  Fed f{{}, StopStringMatcher(&detok, {"🦙 mo"}, 64)};
  std::string streamed;
  int64_t released = 0;
  bool matched = false;
  for (int32_t id : ids) {
    matched = f.feed(id);
    const std::string safe = f.safe_text();
    ASSERT_GE(static_cast<int64_t>(safe.size()), released);  // never takes text back
    streamed += safe.substr(static_cast<size_t>(released));
    released = static_cast<int64_t>(safe.size());
    if (matched) break;
  }
  EXPECT_TRUE(matched);
  EXPECT_EQ(streamed, "The answer is 42, said the ");
  EXPECT_EQ(f.m.text().substr(0, text.find(" model") + 3), text.substr(0, text.find(" model") + 3));
}

TEST(StopStringsO200k, SpecialTokensAreSkippedInText) {
  const auto tok = shared_o200k();
  const DetokenizeFn detok = make_detokenize_fn(tok);
  std::vector<int32_t> ids = tok->encode("Hi");
  ids.push_back(200007);  // <|end|> (a Harmony special added on load)
  const auto more = tok->encode(" there");
  ids.insert(ids.end(), more.begin(), more.end());
  EXPECT_EQ(detok(ids), "Hi there");
  EXPECT_EQ(make_detokenize_fn(tok, false)(ids), "Hi<|end|> there");
}

}  // namespace
}  // namespace mx
