// The SentencePiece-style path on a tiny hand-made tokenizer: normalizer, literal split, merges by rank,
// byte fallback, fused unknowns, added tokens with lstrip/rstrip and the special flag, the decoder rules,
// and the streaming detokenizer over byte-fallback tokens (no split character, no stray U+FFFD). The full
// Gemma vocabulary is checked against Hugging Face's JS tokenizers by tests/tokenizer/diff_test_gemma.mjs.
#include <gtest/gtest.h>

#include <algorithm>

#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace mx {
namespace {

SentencePieceBpeSpec tiny_spec(bool byte_fallback) {
  SentencePieceBpeSpec spec;
  spec.vocab = {"<unk>", "<0xE6>", "<0x97>", "<0xA5>", "▁", "a", "b", "ab", "▁ab", "c", "<0x41>"};
  spec.merges = {{"a", "b"}, {"▁", "ab"}};
  spec.normalizer = {{NormalizerStep::Kind::kReplace, " ", "▁"}};
  spec.split = LiteralSplit{"▁", LiteralSplit::Behavior::kMergedWithNext};
  spec.decoder = {{DecoderStep::Kind::kReplace, "▁", " ", ""},  // kind, from, to, strip_content
                  {DecoderStep::Kind::kByteFallback, "", "", ""},
                  {DecoderStep::Kind::kFuse, "", "", ""}};
  spec.byte_fallback = byte_fallback;
  spec.fuse_unk = true;
  spec.unk_id = 0;
  return spec;
}

std::shared_ptr<const Tokenizer> tiny(bool byte_fallback = true) {
  std::vector<AddedToken> added = {
      {.text = "<turn>", .id = 11, .special = true, .lstrip = true, .rstrip = true},
      {.text = "\n\n", .id = 12, .special = false},
  };
  auto tok = Tokenizer::create_sentencepiece(tiny_spec(byte_fallback), added, 11);
  EXPECT_TRUE(tok.is_ok()) << tok.status().to_string();
  return *tok;
}

TEST(SentencePieceTokenizer, MergesByRankAcrossTheNormalizedSpace) {
  auto tok = tiny();
  EXPECT_EQ(tok->encode("ab ab"), (std::vector<int32_t>{7, 8}));
  EXPECT_EQ(tok->encode(" c"), (std::vector<int32_t>{4, 9}));
  EXPECT_EQ(*tok->decode(tok->encode("ab ab")), "ab ab");
  EXPECT_EQ(tok->bos_id(), 11);
}

TEST(SentencePieceTokenizer, ByteFallbackAndFusedUnknowns) {
  auto tok = tiny();
  EXPECT_EQ(tok->encode("日"), (std::vector<int32_t>{1, 2, 3}));  // U+65E5 = E6 97 A5
  EXPECT_EQ(*tok->decode(std::vector<int32_t>{1, 2, 3}), "日");
  EXPECT_EQ(*tok->decode(std::vector<int32_t>{10}), "A");  // <0x41> decodes to its byte
  auto no_fallback = tiny(/*byte_fallback=*/false);
  EXPECT_EQ(no_fallback->encode("日本c"), (std::vector<int32_t>{0, 9}));  // two unknown characters fuse
}

TEST(SentencePieceTokenizer, AddedTokensStripAndSpecialFlag) {
  auto tok = tiny();
  // <turn> swallows the spaces around it; "\n\n" is ordinary and always recognised.
  EXPECT_EQ(tok->encode("ab  <turn> c\n\nab", SpecialTokens::kAllow), (std::vector<int32_t>{7, 11, 9, 12, 7}));
  EXPECT_TRUE(tok->is_special(11));
  EXPECT_FALSE(tok->is_special(12));
  // As text, the special token is normalized and merged like any text (its characters fall back to <unk>).
  const auto as_text = tok->encode("<turn>");
  EXPECT_EQ(std::count(as_text.begin(), as_text.end(), 11), 0);
  EXPECT_EQ(tok->special_id("<turn>"), 11);
}

TEST(SentencePieceTokenizer, StreamingNeverSplitsACharacter) {
  auto tok = tiny();
  IncrementalDetokenizer detok(*tok);
  EXPECT_EQ(detok.push(8), " ab");
  EXPECT_EQ(detok.push(1), "");
  EXPECT_EQ(detok.push(2), "");
  EXPECT_EQ(detok.push(3), "日");
  EXPECT_EQ(detok.push(11), "<turn>");
  std::string tail;
  detok.finish(&tail);
  EXPECT_EQ(tail, "");
  IncrementalDetokenizer skipping(*tok, /*skip_special_tokens=*/true);
  EXPECT_EQ(skipping.push(11), "");
  EXPECT_EQ(skipping.push(12), "\n\n");
}

TEST(SentencePieceTokenizer, RejectsWhatItCannotEncode) {
  auto spec = tiny_spec(false);
  spec.unk_id = -1;
  EXPECT_FALSE(Tokenizer::create_sentencepiece(spec, {}, std::nullopt).is_ok());
  spec = tiny_spec(true);
  spec.decoder.push_back({DecoderStep::Kind::kStrip, "", "", " ", 1, 0});
  EXPECT_FALSE(Tokenizer::create_sentencepiece(spec, {}, std::nullopt).is_ok());
  spec = tiny_spec(true);
  spec.merges.push_back({"c", "zz"});
  EXPECT_FALSE(Tokenizer::create_sentencepiece(spec, {}, std::nullopt).is_ok());
}

}  // namespace
}  // namespace mx
