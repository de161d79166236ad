// The tokenizer against tiktoken's own ids (tok_public.json: 342 cases from tiktoken's o200k_base), through
// both file formats gpt-oss ships, plus the ids printed in Harmony's format.md.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "chat/harmony/harmony_tokens.h"
#include "tokenizer_util.h"

namespace mx {
namespace {

using testing::o200k;
using testing::o200k_from_hf_json;
using testing::read_fixture;

void expect_public_cases(const Tokenizer& tok) {
  const auto doc = nlohmann::json::parse(read_fixture("tokenizer/tok_public.json"));
  const auto& cases = doc.at("cases");
  ASSERT_EQ(cases.size(), 342u);
  int failures = 0;
  for (const auto& c : cases) {
    const std::string text = c.at("text").get<std::string>();
    const std::vector<int32_t> want = c.at("ids").get<std::vector<int32_t>>();
    const std::vector<int32_t> got = tok.encode(text);
    if (got != want && ++failures <= 5) ADD_FAILURE() << "text " << nlohmann::json(text).dump();
    auto back = tok.decode(got);
    ASSERT_TRUE(back.is_ok());
    EXPECT_EQ(*back, text);
  }
  EXPECT_EQ(failures, 0);
}

TEST(TokenizerPublic, AllCasesFromTiktokenFile) { expect_public_cases(o200k()); }

TEST(TokenizerPublic, AllCasesFromHfJsonAndSameIdsAsTiktoken) {
  expect_public_cases(o200k_from_hf_json());
  EXPECT_EQ(o200k_from_hf_json().vocab_size(), harmony::kVocabSize);
  EXPECT_EQ(o200k_from_hf_json().num_ranks(), o200k().num_ranks());
  for (int32_t id = 0; id < o200k().vocab_size(); ++id) {
    std::string a, b;
    ASSERT_EQ(o200k().append_token_bytes(id, &a), o200k_from_hf_json().append_token_bytes(id, &b)) << id;
    ASSERT_EQ(a, b) << "id " << id;
  }
}

TEST(TokenizerPublic, FormatMdExample) {
  const std::vector<int32_t> want = {1844, 31064, 25, 392, 4827, 382, 220, 17, 659, 220, 17, 16842, 12295, 81645, 13,
                                     51441, 6052, 13};
  EXPECT_EQ(o200k().encode("User asks: \"What is 2 + 2?\" Simple arithmetic. Provide answer."), want);
  EXPECT_EQ(o200k().encode("assistant"), std::vector<int32_t>{173781});
  EXPECT_EQ(o200k().encode("analysis"), std::vector<int32_t>{35644});
  EXPECT_EQ(o200k().encode("final"), std::vector<int32_t>{17196});
  EXPECT_EQ(o200k().encode("commentary"), (std::vector<int32_t>{12606, 815}));
  EXPECT_EQ(o200k().encode(" json"), std::vector<int32_t>{5701});
}

TEST(TokenizerPublic, HarmonySpecialIds) {
  const Tokenizer& tok = o200k();
  EXPECT_EQ(tok.vocab_size(), 201088);
  EXPECT_EQ(tok.special_id("<|start|>"), harmony::kStart);
  EXPECT_EQ(tok.special_id("<|channel|>"), harmony::kChannel);
  EXPECT_EQ(tok.special_id("<|message|>"), harmony::kMessage);
  EXPECT_EQ(tok.special_id("<|end|>"), harmony::kEnd);
  EXPECT_EQ(tok.special_id("<|return|>"), harmony::kReturn);
  EXPECT_EQ(tok.special_id("<|call|>"), harmony::kCall);
  EXPECT_EQ(tok.special_id("<|constrain|>"), harmony::kConstrain);
  EXPECT_EQ(tok.special_id("<|endoftext|>"), harmony::kEndOfText);
  EXPECT_EQ(tok.special_id("<|startoftext|>"), harmony::kStartOfText);
  EXPECT_EQ(tok.special_id("<|endofprompt|>"), 200018);
  EXPECT_EQ(tok.special_id("<|reserved_200018|>"), 200018);
  EXPECT_EQ(tok.special_id("<|reserved_201087|>"), 201087);
  EXPECT_FALSE(tok.special_id("<|reserved_201088|>").has_value());
  EXPECT_EQ(*tok.decode(std::vector<int32_t>{200014}), "<|reserved_200014|>");
  EXPECT_EQ(*tok.decode(std::vector<int32_t>{200018}), "<|endofprompt|>");
  EXPECT_FALSE(tok.decode(std::vector<int32_t>{201088}).is_ok());
  EXPECT_FALSE(tok.decode(std::vector<int32_t>{-1}).is_ok());
  for (int32_t id = harmony::kFirstSpecial; id < harmony::kVocabSize; ++id) EXPECT_TRUE(tok.is_special(id)) << id;
  EXPECT_FALSE(tok.is_special(199997));
}

// The whole meta file: every special name and id it lists is what we load.
TEST(TokenizerPublic, HarmonyMetaFileAgrees) {
  const auto meta = nlohmann::json::parse(read_fixture("tokenizer/o200k_harmony_meta.json"));
  EXPECT_EQ(meta.at("n_vocab").get<int32_t>(), o200k().vocab_size());
  EXPECT_EQ(meta.at("pat_str").get<std::string>(), o200k().pattern());
  EXPECT_EQ(meta.at("pat_str").get<std::string>(), o200k_from_hf_json().pattern());
  for (const auto& [name, id] : meta.at("special_tokens").items()) {
    EXPECT_EQ(o200k().special_id(name), id.get<int32_t>()) << name;
  }
}

}  // namespace
}  // namespace mx
