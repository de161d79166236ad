#include "server/forced_transcripts.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace mx::server {

Result<ForcedTranscripts> ForcedTranscripts::load(const std::string& path, const Tokenizer& tokenizer) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error("cannot open " + path);
  std::ostringstream text;
  text << in.rdbuf();
  auto parsed = parse(text.str(), tokenizer);
  if (!parsed.is_ok()) return parsed.status().with_context(path);
  return parsed;
}

Result<ForcedTranscripts> ForcedTranscripts::parse(const std::string& json_text, const Tokenizer& tokenizer) {
  const auto doc = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("transcripts") || !doc["transcripts"].is_array())
    return invalid_argument(R"(expected {"transcripts": [{"match": ..., "text": ... or "ids": [...]}, ...]})");
  ForcedTranscripts out;
  for (size_t i = 0; i < doc["transcripts"].size(); ++i) {
    const auto& t = doc["transcripts"][i];
    const std::string where = "transcripts[" + std::to_string(i) + "]";
    if (!t.is_object()) return invalid_argument(where + " is not an object");
    ForcedTranscript transcript;
    if (t.contains("match")) {
      if (!t["match"].is_string()) return invalid_argument(where + ".match must be a string");
      transcript.match = t["match"].get<std::string>();
    }
    if (t.contains("text") == t.contains("ids")) return invalid_argument(where + " needs exactly one of text or ids");
    if (t.contains("text")) {
      if (!t["text"].is_string()) return invalid_argument(where + ".text must be a string");
      transcript.ids = tokenizer.encode(t["text"].get<std::string>(), SpecialTokens::kAllow);
    } else {
      if (!t["ids"].is_array()) return invalid_argument(where + ".ids must be an array");
      for (const auto& id : t["ids"]) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= tokenizer.vocab_size())
          return invalid_argument(where + ".ids holds something that is not a token id");
        transcript.ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
      }
    }
    if (transcript.ids.empty()) return invalid_argument(where + " is empty");
    out.transcripts_.push_back(std::move(transcript));
  }
  return out;
}

const std::vector<int32_t>* ForcedTranscripts::select(const std::string& text) const {
  for (const auto& t : transcripts_)
    if (t.match.empty() || text.find(t.match) != std::string::npos) return &t.ids;
  return nullptr;
}

}  // namespace mx::server
