#include "model/gemma4/gemma4_demo_tokenizer.h"

#include <cstdio>
#include <map>

#include <nlohmann/json.hpp>

namespace mx {
namespace {

using nlohmann::json;

// The control tokens and where they sit. 0-2, 105/106 (the eos list [1, 106]) and 100/101 follow the
// released checkpoints as far as they are known; the others are this demo's choice (ref-gemma4-mtp-spec.md 1.6).
const std::map<int64_t, std::string>& control_tokens() {
  static const std::map<int64_t, std::string> table = {
      {0, "<pad>"},           {1, "<eos>"},           {2, "<bos>"},           {3, "<unk>"},
      {4, "<mask>"},          {46, "<|tool>"},        {47, "<tool|>"},        {48, "<|tool_call>"},
      {49, "<tool_call|>"},   {50, "<|tool_response>"}, {51, "<tool_response|>"}, {52, "<|\"|>"},
      {98, "<|think|>"},      {100, "<|channel>"},    {101, "<channel|>"},    {105, "<|turn>"},
      {106, "<turn|>"},       {255999, "<|image>"},   {256000, "<|audio>"},   {258880, "<|image|>"},
      {258881, "<|audio|>"},  {258882, "<image|>"},   {258883, "<audio|>"},   {258884, "<|video|>"},
  };
  return table;
}

constexpr int64_t kFirstByteToken = 238;  // <0x00>..<0xFF>
constexpr int64_t kFirstPiece = kFirstByteToken + 256;

// A made-up piece for index k, all distinct: an optional "▁" word start, then base-90 digits of k/2 spelled
// as consonant-vowel syllables (each digit two letters, so different k give different strings).
std::string syllable_piece(int64_t k) {
  static const char kConsonants[] = "bcdfghjklmnprstvwz";
  static const char kVowels[] = "aeiou";
  std::string out = k % 2 == 0 ? "\xE2\x96\x81" : "";
  int64_t s = k / 2;
  do {
    out += kConsonants[s % 18];
    out += kVowels[(s / 18) % 5];
    s /= 90;
  } while (s > 0);
  return out;
}

}  // namespace

std::string gemma4_demo_tokenizer_json(int64_t vocab_size) {
  json vocab = json::object();
  json added = json::array();
  const auto& controls = control_tokens();
  for (const auto& [id, text] : controls) {
    if (id >= vocab_size) continue;
    vocab[text] = id;
    added.push_back({{"id", id}, {"content", text}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", true}});
  }
  char name[16];
  for (int64_t id = 5; id < kFirstByteToken; ++id) {
    if (controls.count(id)) continue;
    std::snprintf(name, sizeof(name), "<unused%lld>", static_cast<long long>(id));
    vocab[name] = id;
  }
  for (int b = 0; b < 256; ++b) {
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = kFirstByteToken + b;
  }
  // "▁", then the printable ASCII characters, then syllable pieces up to the vocabulary size.
  int64_t id = kFirstPiece;
  vocab["\xE2\x96\x81"] = id++;
  for (char c = 33; c < 127; ++c) vocab[std::string(1, c)] = id++;
  for (int64_t k = 0; id < vocab_size; ++id) {
    if (controls.count(id)) continue;
    vocab[syllable_piece(k++)] = id;
  }
  const json replace_space = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}};
  json doc = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", replace_space},
      {"pre_tokenizer",
       {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "MergedWithPrevious"}, {"invert", false}}},
      {"post_processor", nullptr},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}}}}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", "<unk>"},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", json::array()}}},
  };
  return doc.dump() + "\n";
}

std::string gemma4_demo_tokenizer_config_json() {
  const json config = {{"add_bos_token", true}, {"add_eos_token", false}, {"bos_token", "<bos>"},
                       {"eos_token", "<eos>"},  {"pad_token", "<pad>"},   {"unk_token", "<unk>"},
                       {"tokenizer_class", "GemmaTokenizer"}};
  return config.dump(2) + "\n";
}

}  // namespace mx
