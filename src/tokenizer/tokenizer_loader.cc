// Loading a Tokenizer from the files models ship: a tiktoken rank file or a Hugging Face tokenizer.json
// (optionally gzip-compressed; byte-level here, SentencePiece-style in hf_sentencepiece_json.cc), or a model
// directory holding one of them. Every malformed input is a
// Status with the file and, where it helps, the line or token; nothing here aborts on a bad file.
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/log.h"
#include "tokenizer/hf_sentencepiece_json.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace mx {
namespace {

constexpr size_t kMaxTokenizerFileBytes = size_t{1} << 30;

// Reads a whole file; gzip-compressed files are inflated (zlib reads plain files unchanged too).
Result<std::string> read_maybe_gzipped(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) return io_error("cannot open " + path);
  std::string data;
  char buf[1 << 16];
  while (true) {
    const int n = gzread(f, buf, sizeof(buf));
    if (n < 0) {
      int err = 0;
      const std::string msg = gzerror(f, &err);
      gzclose(f);
      return io_error("cannot read " + path + ": " + msg);
    }
    if (n == 0) break;
    data.append(buf, n);
    if (data.size() > kMaxTokenizerFileBytes) {
      gzclose(f);
      return invalid_argument(path + " is larger than 1 GiB; not a tokenizer file");
    }
  }
  gzclose(f);
  return data;
}

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

bool base64_decode(std::string_view in, std::string* out) {
  out->clear();
  if (in.size() % 4 != 0) return false;
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      if (in[i + k] == '=' && i + 4 == in.size() && k >= 2) {
        v[k] = 0;
        ++pad;
      } else if (pad > 0 || (v[k] = base64_value(in[i + k])) < 0) {
        return false;
      }
    }
    const uint32_t triple = (v[0] << 18) | (v[1] << 12) | (v[2] << 6) | v[3];
    out->push_back(static_cast<char>(triple >> 16));
    if (pad < 2) out->push_back(static_cast<char>((triple >> 8) & 0xFF));
    if (pad < 1) out->push_back(static_cast<char>(triple & 0xFF));
  }
  return true;
}

// GPT-2's byte-level alphabet: bytes that are printable Latin-1 stand for themselves; the other 68 bytes
// are mapped, in order, to code points 256, 257, ... Returns the inverse table (code point -> byte).
std::unordered_map<uint32_t, uint8_t> byte_level_decoder() {
  std::unordered_map<uint32_t, uint8_t> table;
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    table[printable ? b : next++] = static_cast<uint8_t>(b);
  }
  return table;
}

// Reads one code point of valid UTF-8 at text[*pos] and advances.
uint32_t next_code_point(std::string_view text, size_t* pos) {
  const auto b0 = static_cast<uint8_t>(text[*pos]);
  const int n = utf8_sequence_length(text, *pos);
  uint32_t cp = n == 1 ? b0 : n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(text[*pos + k]) & 0x3F);
  *pos += std::max(n, 1);
  return cp;
}

bool byte_level_to_bytes(const std::unordered_map<uint32_t, uint8_t>& decoder, std::string_view text,
                         std::string* out) {
  out->clear();
  size_t pos = 0;
  while (pos < text.size()) {
    auto it = decoder.find(next_code_point(text, &pos));
    if (it == decoder.end()) return false;
    out->push_back(static_cast<char>(it->second));
  }
  return true;
}

// The pattern of the Split pre-tokenizer (alone or inside a Sequence); empty when there is none.
std::string find_split_pattern(const nlohmann::json& pre) {
  if (!pre.is_object()) return "";
  if (pre.value("type", "") == "Split" && pre.contains("pattern") && pre["pattern"].is_object()) {
    const auto& p = pre["pattern"];
    if (p.contains("Regex") && p["Regex"].is_string()) return p["Regex"].get<std::string>();
  }
  if (pre.value("type", "") == "Sequence" && pre.contains("pretokenizers") && pre["pretokenizers"].is_array()) {
    for (const auto& item : pre["pretokenizers"]) {
      std::string found = find_split_pattern(item);
      if (!found.empty()) return found;
    }
  }
  return "";
}

Result<std::shared_ptr<const Tokenizer>> parse_hf_json(const std::string& text, const nlohmann::json& config,
                                                       std::span<const SpecialToken> implied) {
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return invalid_argument("not valid JSON");
  if (!doc.contains("model") || !doc["model"].is_object()) return invalid_argument("no \"model\" object");
  const auto& model = doc["model"];
  if (model.value("type", "") != "BPE")
    return unimplemented("model type \"" + model.value("type", "") + "\" is not supported (only BPE)");
  if (!model.contains("vocab") || !model["vocab"].is_object()) return invalid_argument("no model.vocab object");
  // A SentencePiece-style file lists every token its chat format uses among its added tokens, so `implied`
  // (the byte-level files' missing specials) does not apply; the format checks its tokens when it is made.
  if (!hf_json_is_byte_level(doc)) return parse_hf_sentencepiece(doc, config);
  const std::string pattern = find_split_pattern(doc.contains("pre_tokenizer") ? doc["pre_tokenizer"] : nlohmann::json());
  if (pattern.empty())
    return unimplemented("pre_tokenizer has no Split regex (only tiktoken-style byte-level BPE is supported)");
  if (!model.value("ignore_merges", false)) {
    MX_LOG(Warning) << "tokenizer.json has ignore_merges=false; encoding follows tiktoken (whole pre-tokens first)";
  }

  const auto decoder = byte_level_decoder();
  std::vector<std::string> tokens;
  std::string bytes;
  for (const auto& [key, value] : model["vocab"].items()) {
    if (!value.is_number_integer()) return invalid_argument("vocab entry \"" + key + "\" has no integer id");
    const int64_t id = value.get<int64_t>();
    if (id < 0 || id > 10'000'000) return invalid_argument("vocab entry \"" + key + "\" has id out of range");
    if (!byte_level_to_bytes(decoder, key, &bytes) || bytes.empty())
      return invalid_argument("vocab entry \"" + key + "\" is not byte-level BPE text");
    if (tokens.size() <= static_cast<size_t>(id)) tokens.resize(id + 1);
    if (!tokens[id].empty()) return invalid_argument("vocab id " + std::to_string(id) + " is used twice");
    tokens[id] = bytes;
  }

  // tiktoken semantics need the merge order to be the rank order of the merged tokens; check it rather than
  // silently encoding differently from the file's intent.
  if (model.contains("merges") && model["merges"].is_array()) {
    std::unordered_map<std::string, int32_t> rank_of;
    rank_of.reserve(tokens.size());
    for (size_t r = 0; r < tokens.size(); ++r)
      if (!tokens[r].empty()) rank_of.emplace(tokens[r], static_cast<int32_t>(r));
    int32_t last = -1;
    std::string left, right;
    for (const auto& m : model["merges"]) {
      std::string a, b;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos) return invalid_argument("merge \"" + s + "\" has no space");
        a = s.substr(0, sp);
        b = s.substr(sp + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        a = m[0].get<std::string>();
        b = m[1].get<std::string>();
      } else {
        return invalid_argument("a merge is neither \"a b\" nor [\"a\", \"b\"]");
      }
      if (!byte_level_to_bytes(decoder, a, &left) || !byte_level_to_bytes(decoder, b, &right))
        return invalid_argument("merge \"" + a + " " + b + "\" is not byte-level BPE text");
      auto it = rank_of.find(left + right);
      if (it == rank_of.end()) return invalid_argument("merge \"" + a + " " + b + "\" makes a token not in vocab");
      if (it->second < last)
        return unimplemented("merges are not in the rank order of their results (not tiktoken-style BPE)");
      last = it->second;
    }
  }

  std::vector<SpecialToken> specials;
  if (doc.contains("added_tokens") && doc["added_tokens"].is_array()) {
    for (const auto& t : doc["added_tokens"]) {
      if (!t.is_object() || !t.contains("content") || !t["content"].is_string() || !t.contains("id") ||
          !t["id"].is_number_integer())
        return invalid_argument("an added_tokens entry lacks a string content or an integer id");
      const int64_t id = t["id"].get<int64_t>();
      if (id < 0 || id > 10'000'000) return invalid_argument("added token id out of range");
      specials.push_back({t["content"].get<std::string>(), static_cast<int32_t>(id)});
    }
  }
  MX_RETURN_IF_ERROR(add_implied_specials(&specials, implied));
  return Tokenizer::create(std::move(tokens), std::move(specials), pattern);
}

Result<std::shared_ptr<const Tokenizer>> parse_tiktoken(std::string_view text, std::span<const SpecialToken> implied) {
  std::vector<std::string> tokens;
  size_t pos = 0;
  int64_t line_no = 0;
  std::string bytes;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string_view line(text.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const std::string where = "line " + std::to_string(line_no);
    const size_t sp = line.find(' ');
    if (sp == std::string_view::npos) return invalid_argument(where + ": expected \"<base64> <rank>\"");
    if (!base64_decode(line.substr(0, sp), &bytes) || bytes.empty())
      return invalid_argument(where + ": bad base64 token");
    const std::string_view rank_text = line.substr(sp + 1);
    int64_t rank = 0;
    if (rank_text.empty() || rank_text.size() > 9) return invalid_argument(where + ": bad rank");
    for (char c : rank_text) {
      if (c < '0' || c > '9') return invalid_argument(where + ": bad rank");
      rank = rank * 10 + (c - '0');
    }
    if (tokens.size() <= static_cast<size_t>(rank)) tokens.resize(rank + 1);
    if (!tokens[rank].empty()) return invalid_argument(where + ": rank " + std::to_string(rank) + " appears twice");
    tokens[rank] = bytes;
  }
  if (tokens.empty()) return invalid_argument("no ranks");
  std::vector<SpecialToken> specials;
  MX_RETURN_IF_ERROR(add_implied_specials(&specials, implied));
  return Tokenizer::create(std::move(tokens), std::move(specials), kO200kPattern);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

Result<std::shared_ptr<const Tokenizer>> Tokenizer::load_hf_json(const std::string& path,
                                                                 std::span<const SpecialToken> implied_specials) {
  MX_ASSIGN_OR_RETURN(std::string text, read_maybe_gzipped(path));
  // The BOS token lives in tokenizer_config.json beside the tokenizer (Hugging Face's layout).
  nlohmann::json config;
  const std::filesystem::path config_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (std::filesystem::is_regular_file(config_path, ec)) {
    MX_ASSIGN_OR_RETURN(std::string config_text, read_maybe_gzipped(config_path.string()));
    config = nlohmann::json::parse(config_text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) return invalid_argument(config_path.string() + " is not a JSON object");
  }
  auto result = parse_hf_json(text, config, implied_specials);
  if (!result.is_ok()) return result.status().with_context(path);
  return result;
}

Result<std::shared_ptr<const Tokenizer>> Tokenizer::load_tiktoken(const std::string& path,
                                                                  std::span<const SpecialToken> implied_specials) {
  MX_ASSIGN_OR_RETURN(std::string text, read_maybe_gzipped(path));
  auto result = parse_tiktoken(text, implied_specials);
  if (!result.is_ok()) return result.status().with_context(path);
  return result;
}

Result<std::shared_ptr<const Tokenizer>> Tokenizer::from_tiktoken_text(std::string_view text,
                                                                       std::span<const SpecialToken> implied_specials) {
  return parse_tiktoken(text, implied_specials);
}

Result<std::shared_ptr<const Tokenizer>> Tokenizer::load(const std::string& path,
                                                         std::span<const SpecialToken> implied_specials) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const char* name : {"tokenizer.json", "tokenizer.json.gz"}) {
      const fs::path candidate = fs::path(path) / name;
      if (fs::is_regular_file(candidate, ec)) return load_hf_json(candidate.string(), implied_specials);
    }
    std::vector<std::string> tiktoken_files;
    for (const auto& entry : fs::directory_iterator(path, ec)) {
      if (entry.is_regular_file(ec) && entry.path().extension() == ".tiktoken")
        tiktoken_files.push_back(entry.path().string());
    }
    if (ec) return io_error("cannot list " + path + ": " + ec.message());
    if (tiktoken_files.size() == 1) return load_tiktoken(tiktoken_files[0], implied_specials);
    if (tiktoken_files.empty())
      return not_found(path + " has no tokenizer.json, tokenizer.json.gz or *.tiktoken file");
    std::sort(tiktoken_files.begin(), tiktoken_files.end());
    std::string message = path + " has several .tiktoken files (";
    for (size_t i = 0; i < tiktoken_files.size(); ++i) {
      if (i > 0) message.append(", ");
      message.append(fs::path(tiktoken_files[i]).filename().string());
    }
    message.append("); name one");
    return invalid_argument(message);
  }
  if (!fs::exists(path, ec)) return not_found(path + " does not exist");
  if (ends_with(path, ".tiktoken") || ends_with(path, ".tiktoken.gz")) return load_tiktoken(path, implied_specials);
  if (ends_with(path, ".json") || ends_with(path, ".json.gz")) return load_hf_json(path, implied_specials);
  return invalid_argument(path + ": expected a tokenizer.json(.gz), a .tiktoken file or a model directory");
}

}  // namespace mx
