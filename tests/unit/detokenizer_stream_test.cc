// The incremental detokenizer and the UTF-8 stream decoder: deltas never split a character, invalid bytes
// become U+FFFD only once they can no longer complete, and the deltas add up to a one-shot lossy decode.
#include <gtest/gtest.h>

#include <random>

#include "tokenizer/detokenizer.h"
#include "chat/harmony/harmony_tokens.h"
#include "tokenizer/utf8.h"
#include "tokenizer_util.h"

namespace mx {
namespace {

using testing::o200k;

std::string stream_decode(const std::vector<std::string>& chunks, std::vector<std::string>* deltas) {
  Utf8StreamDecoder d;
  std::string all;
  for (const auto& c : chunks) {
    std::string out;
    d.push(c, &out);
    if (deltas) deltas->push_back(out);
    all += out;
  }
  std::string tail;
  d.finish(&tail);
  if (deltas) deltas->push_back(tail);
  return all + tail;
}

TEST(Utf8Stream, HoldsIncompleteSequencesAndReplacesDeadOnes) {
  std::vector<std::string> deltas;
  EXPECT_EQ(stream_decode({"a\xF0\x9F", "\x98", "\x80" "b"}, &deltas), "a\xF0\x9F\x98\x80" "b");
  EXPECT_EQ(deltas[0], "a");
  EXPECT_EQ(deltas[1], "");
  EXPECT_EQ(deltas[2], "\xF0\x9F\x98\x80" "b");
  deltas.clear();
  // A prefix that the next byte cannot continue: one U+FFFD for the prefix, then the byte itself.
  EXPECT_EQ(stream_decode({"\xE2\x82", "x"}, &deltas), "\xEF\xBF\xBDx");
  EXPECT_EQ(deltas[0], "");
  // Dangling prefix at the end of the stream.
  EXPECT_EQ(stream_decode({"ok\xE2"}, nullptr), "ok\xEF\xBF\xBD");
  // Bytes that can never start or continue a sequence are replaced at once, one U+FFFD per maximal subpart.
  EXPECT_EQ(stream_decode({"\x80\xBF\xC0\xAF\xED\xA0\x80\xF5"}, nullptr), std::string(8, '?').replace(0, 8, "") +
            "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8_make_valid("\xF0\x9F\x98"), "\xEF\xBF\xBD");  // a truncated 4-byte sequence is one subpart
  EXPECT_EQ(utf8_make_valid("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogates: byte by byte
}

TEST(Utf8Stream, RandomBytesSplitAnywhereEqualOneShotDecode) {
  std::mt19937 rng(1234);
  const std::string pool[] = {"a", "\xC3\xA9", "\xE6\x97\xA5", "\xF0\x9F\x98\x80", "\x80", "\xC3", "\xE6\x97", "\xF0\x9F",
                              "\xFF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xC0\xAF"};
  for (int iter = 0; iter < 20000; ++iter) {
    std::string bytes;
    for (int n = rng() % 12; n > 0; --n) bytes += pool[rng() % std::size(pool)];
    std::vector<std::string> chunks;
    for (size_t pos = 0; pos < bytes.size();) {
      const size_t len = 1 + rng() % 4;
      chunks.push_back(bytes.substr(pos, len));
      pos += len;
    }
    std::vector<std::string> deltas;
    ASSERT_EQ(stream_decode(chunks, &deltas), utf8_make_valid(bytes)) << iter;
    for (const auto& d : deltas) ASSERT_TRUE(utf8_is_valid(d));
  }
}

// utf8_unfinished_tail (the reasoning budget's view of a cut character) agrees with the stream decoder: the
// tail is what the decoder holds back.
TEST(Utf8Stream, UnfinishedTailIsWhatTheDecoderHoldsBack) {
  EXPECT_EQ(utf8_unfinished_tail("ab\xE6\x97"), 2);
  EXPECT_EQ(utf8_unfinished_tail("\xF0\x9F\x98"), 3);
  EXPECT_EQ(utf8_unfinished_tail("\xE6\x97\xA5"), 0);
  EXPECT_EQ(utf8_unfinished_tail("\xE0\x80"), 0);  // E0 80 can never complete
  EXPECT_EQ(utf8_unfinished_tail("\xFF"), 0);
  EXPECT_EQ(utf8_unfinished_tail(""), 0);
  std::mt19937 rng(99);
  const std::string pool[] = {"a", "\xC3\xA9", "\xE6\x97\xA5", "\xF0\x9F\x98\x80", "\x80", "\xC3", "\xE6\x97", "\xF0\x9F",
                              "\xF0", "\xFF", "\xED\xA0", "\xE0\xA4", "\xF4\x90", "\xC0"};
  for (int iter = 0; iter < 20000; ++iter) {
    std::string bytes;
    for (int n = rng() % 6; n > 0; --n) bytes += pool[rng() % std::size(pool)];
    Utf8StreamDecoder d;
    std::string out;
    d.push(bytes, &out);
    ASSERT_EQ(utf8_unfinished_tail(bytes) > 0, d.has_pending()) << iter;
    if (d.has_pending()) {  // the held-back bytes are exactly the tail: out + tail is everything, re-encoded
      const int tail = utf8_unfinished_tail(bytes);
      ASSERT_EQ(out, utf8_make_valid(bytes.substr(0, bytes.size() - static_cast<size_t>(tail)))) << iter;
    }
  }
}

TEST(Detokenizer, DeltasAddUpToDecodeForRealTokens) {
  const std::string text = "Hello 👨‍👩‍👧 東京 naïve 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 Привет 🇯🇵!";
  const std::vector<int32_t> ids = o200k().encode(text);
  IncrementalDetokenizer detok(o200k());
  std::string all;
  for (const int32_t id : ids) {
    const std::string delta = detok.push(id);
    EXPECT_TRUE(utf8_is_valid(delta));
    all += delta;
  }
  detok.finish(&all);
  EXPECT_EQ(all, text);
}

TEST(Detokenizer, EveryTokenAloneAndRandomStreamsMatchLossyDecode) {
  std::mt19937 rng(99);
  for (int iter = 0; iter < 2000; ++iter) {
    std::vector<int32_t> ids;
    for (int n = rng() % 20; n > 0; --n) ids.push_back(static_cast<int32_t>(rng() % o200k().num_ranks()));
    IncrementalDetokenizer detok(o200k());
    std::string all;
    for (const int32_t id : ids) detok.push(id, &all);
    detok.finish(&all);
    ASSERT_EQ(all, *o200k().decode(ids));
  }
}

TEST(Detokenizer, SpecialsKeptOrSkippedAndUnknownIdsReplaced) {
  IncrementalDetokenizer keep(o200k());
  EXPECT_EQ(keep.push(harmony::kStart), "<|start|>");
  IncrementalDetokenizer skip(o200k(), /*skip_special_tokens=*/true);
  EXPECT_EQ(skip.push(harmony::kStart), "");
  EXPECT_EQ(skip.push(13225), "Hello");
  IncrementalDetokenizer bad(o200k());
  EXPECT_EQ(bad.push(-1), "\xEF\xBF\xBD");
  EXPECT_EQ(bad.push(500000), "\xEF\xBF\xBD");
  EXPECT_EQ(bad.unknown_ids(), 2);
}

}  // namespace
}  // namespace mx
