// BPE and pre-tokenizer behaviour beyond the public cases: the merge rule against a plain reference on
// small random vocabularies (both merge paths), special tokens, ill-formed UTF-8, very long pre-tokens,
// whitespace classes, thread safety, and loader errors on bad files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "tokenizer/bpe_ranks.h"
#include "chat/harmony/harmony_tokens.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/utf8.h"
#include "tokenizer_util.h"

namespace mx {
namespace {

using testing::o200k;

// tiktoken's rule written the slow, obvious way.
std::vector<int32_t> reference_merge(const BpeRanks& ranks, const std::string& piece) {
  if (ranks.find(piece) >= 0) return {ranks.find(piece)};
  std::vector<std::string> parts;
  for (char c : piece) parts.emplace_back(1, c);
  while (parts.size() > 1) {
    int32_t best = -1;
    size_t at = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      const int32_t r = ranks.find(parts[i] + parts[i + 1]);
      if (r >= 0 && (best < 0 || r < best)) {
        best = r;
        at = i;
      }
    }
    if (best < 0) break;
    parts[at] += parts[at + 1];
    parts.erase(parts.begin() + at + 1);
  }
  std::vector<int32_t> ids;
  for (const auto& p : parts) ids.push_back(ranks.find(p));
  return ids;
}

TEST(TokenizerBpe, MergeMatchesReferenceOnRandomVocabularies) {
  std::mt19937 rng(7);
  for (int vocab = 0; vocab < 20; ++vocab) {
    std::vector<std::string> tokens;
    for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
    std::set<std::string> seen(tokens.begin(), tokens.end());
    while (tokens.size() < 400) {  // random multi-byte tokens over a 4-letter alphabet
      std::string t;
      for (int n = 2 + rng() % 4; n > 0; --n) t += "abcd"[rng() % 4];
      if (seen.insert(t).second) tokens.push_back(t);
    }
    std::shuffle(tokens.begin() + 256, tokens.end(), rng);
    auto ranks = BpeRanks::build(tokens);
    ASSERT_TRUE(ranks.is_ok());
    for (int iter = 0; iter < 200; ++iter) {
      std::string piece;
      const int len = iter % 10 == 0 ? 200 + rng() % 400 : 1 + rng() % 40;  // long ones take the heap path
      for (int n = 0; n < len; ++n) piece += "abcd"[rng() % 4];
      std::vector<int32_t> got;
      ranks->encode_piece(piece, &got);
      ASSERT_EQ(got, reference_merge(*ranks, piece)) << piece;
    }
  }
}

TEST(TokenizerBpe, BuildRejectsDuplicatesAndMissingBytes) {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
  tokens.push_back("a");
  EXPECT_FALSE(BpeRanks::build(tokens).is_ok());
  tokens.pop_back();
  tokens[65].clear();
  EXPECT_FALSE(BpeRanks::build(tokens).is_ok());
}

TEST(TokenizerBpe, SpecialsOnlyWhenAllowed) {
  const std::string text = "<|start|>user<|message|>hi<|end|><|bogus|><|start";
  const auto plain = o200k().encode(text);
  for (int32_t id : plain) EXPECT_FALSE(o200k().is_special(id));
  const auto allowed = o200k().encode(text, SpecialTokens::kAllow);
  EXPECT_EQ(allowed[0], harmony::kStart);
  EXPECT_EQ(std::count(allowed.begin(), allowed.end(), harmony::kEnd), 1);
  EXPECT_EQ(*o200k().decode(allowed), text);
  EXPECT_EQ(*o200k().decode(plain), text);
  EXPECT_EQ(o200k().encode("a<|<|end|>", SpecialTokens::kAllow).back(), harmony::kEnd);
}

TEST(TokenizerBpe, IllFormedUtf8IsRepairedNotRejected) {
  const auto ids = o200k().encode("ok\xFF\xC3");
  EXPECT_EQ(*o200k().decode(ids), "ok\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(TokenizerBpe, LongPreTokensAndLongWhitespaceRuns) {
  for (const std::string unit : {"a", "\xE6\x97\xA5", " ", "\n", "9", "!", "\xCC\x81"}) {
    std::string text;
    for (int i = 0; i < 200000; ++i) text += unit;
    const auto ids = o200k().encode(text);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(*o200k().decode(ids), text) << unit;
  }
}

TEST(TokenizerBpe, WhitespaceClassesFollowTiktoken) {
  // U+180E is not White_Space (PCRE2's own \s would say it is), U+0085 and U+3000 are.
  auto pre = Pretokenizer::compile("\\s+|\\S+");
  ASSERT_TRUE(pre.is_ok());
  auto pieces = [&](const std::string& text) {
    std::vector<std::string> out;
    (*pre)->split(text, [&](std::string_view p) { out.emplace_back(p); });
    return out;
  };
  EXPECT_EQ(pieces("a\xE1\xA0\x8E" "b"), std::vector<std::string>{"a\xE1\xA0\x8E" "b"});
  EXPECT_EQ(pieces("a\xC2\x85" "b"), (std::vector<std::string>{"a", "\xC2\x85", "b"}));
  EXPECT_EQ(pieces("a\xE3\x80\x80" "b"), (std::vector<std::string>{"a", "\xE3\x80\x80", "b"}));
  EXPECT_EQ(rewrite_whitespace_classes("[^\\s\\]]"), "[^\\x{9}-\\x{D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}\\]]");
  // Text the pattern does not match is kept as a piece of its own.
  auto digits = Pretokenizer::compile("[0-9]+");
  ASSERT_TRUE(digits.is_ok());
  std::vector<std::string> out;
  (*digits)->split("ab12cd", [&](std::string_view p) { out.emplace_back(p); });
  EXPECT_EQ(out, (std::vector<std::string>{"ab", "12", "cd"}));
  EXPECT_FALSE(Pretokenizer::compile("(unclosed").is_ok());
}

TEST(TokenizerBpe, ThreadsShareOneTokenizer) {
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i) texts.push_back("Thread " + std::to_string(i) + " says héllo to 東京 and 😀 " + std::string(i % 7, ' ') + "end");
  std::vector<std::vector<int32_t>> want;
  for (const auto& t : texts) want.push_back(o200k().encode(t));
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 50; ++rep)
        for (size_t i = (t * 13) % texts.size(), n = 0; n < texts.size(); ++n, i = (i + 1) % texts.size())
          if (o200k().encode(texts[i]) != want[i]) ++mismatches;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

class LoaderErrors : public ::testing::Test {
 protected:
  std::filesystem::path dir_ = std::filesystem::temp_directory_path() / ("mx_tok_" + std::to_string(::getpid()));
  void SetUp() override { std::filesystem::create_directories(dir_); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& data) {
    std::ofstream((dir_ / name).string(), std::ios::binary) << data;
    return (dir_ / name).string();
  }
};

TEST_F(LoaderErrors, BadFilesGiveClearErrors) {
  auto expect_error = [](const std::string& path, const std::string& fragment) {
    auto r = Tokenizer::load(path);
    ASSERT_FALSE(r.is_ok()) << path;
    EXPECT_NE(r.status().message().find(fragment), std::string::npos) << r.status().to_string();
  };
  expect_error(write("a.tiktoken", "QQ== 0\nQg== x\n"), "line 2: bad rank");
  expect_error(write("b.tiktoken", "QQ== 0\n!!!! 1\n"), "line 2: bad base64");
  expect_error(write("c.tiktoken", "QQ== 0\nQg== 0\n"), "appears twice");
  expect_error(write("d.tiktoken", "QQ== 0\n"), "lack the single byte");
  expect_error(write("e.json", "{not json"), "not valid JSON");
  expect_error(write("f.json", R"({"model": {"type": "Unigram"}})"), "only BPE");
  expect_error(write("g.json", R"({"model": {"type": "BPE", "vocab": {}}, "pre_tokenizer": {"type": "ByteLevel"}})"),
               "Split regex");
  // Without a ByteLevel step the file is read as SentencePiece-style BPE.
  expect_error(write("g2.json", R"({"model": {"type": "BPE", "vocab": {}}})"), "needs an unk_token");
  expect_error(write("g3.json", R"({"model": {"type": "BPE", "vocab": {}, "byte_fallback": true},
                                    "normalizer": {"type": "NFKC"}})"),
               "normalizer \"NFKC\" is not supported");
  expect_error(write("g4.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [["a", "b"]],
                                    "byte_fallback": true}})"),
               "not in the vocabulary");
  expect_error(write("h.txt", "x"), "expected a tokenizer.json");
  expect_error((dir_ / "missing.tiktoken").string(), "does not exist");
  expect_error(dir_.string(), "several .tiktoken files");
  std::filesystem::create_directories(dir_ / "empty");
  expect_error((dir_ / "empty").string(), "has no tokenizer.json");
}

TEST_F(LoaderErrors, ModelDirectoryFindsItsTokenizer) {
  // The fixture directory has one .tiktoken file and no file named tokenizer.json(.gz).
  auto r = Tokenizer::load(testing::fixture_path("tokenizer"));
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ((*r)->encode("Hello world"), (std::vector<int32_t>{13225, 2375}));
  // tokenizer.json.gz wins over .tiktoken files.
  write("x.tiktoken", "garbage");
  std::filesystem::create_symlink(testing::fixture_path("tokenizer/gpt-oss.tokenizer.json.gz"), dir_ / "tokenizer.json.gz");
  r = Tokenizer::load(dir_.string());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ((*r)->encode("Hello world"), (std::vector<int32_t>{13225, 2375}));
}

}  // namespace
}  // namespace mx
