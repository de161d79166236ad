#include "tokenizer/hf_sentencepiece_json.h"

namespace mx {
namespace {

using nlohmann::json;

bool has_type(const json& node, const char* type) {
  if (node.is_array()) {
    for (const auto& item : node)
      if (has_type(item, type)) return true;
    return false;
  }
  if (!node.is_object()) return false;
  if (node.value("type", "") == type) return true;
  for (const char* list : {"pretokenizers", "decoders", "normalizers"})
    if (node.contains(list) && has_type(node[list], type)) return true;
  return false;
}

// The items of a component: a Sequence's list, one component, or nothing for null.
Result<std::vector<json>> flatten(const json& node, const char* list, const std::string& what) {
  std::vector<json> items;
  if (node.is_null()) return items;
  if (!node.is_object()) return invalid_argument(what + " is not an object");
  if (node.value("type", "") != "Sequence") {
    items.push_back(node);
    return items;
  }
  if (!node.contains(list) || !node[list].is_array()) return invalid_argument(what + " Sequence has no " + list);
  for (const auto& item : node[list]) {
    MX_ASSIGN_OR_RETURN(std::vector<json> inner, flatten(item, list, what));
    items.insert(items.end(), inner.begin(), inner.end());
  }
  return items;
}

// The literal of a {"String": "..."} pattern; Regex patterns are not implemented for these tokenizers.
Result<std::string> literal_pattern(const json& step, const std::string& what) {
  if (!step.contains("pattern") || !step["pattern"].is_object()) return invalid_argument(what + " has no pattern");
  const auto& p = step["pattern"];
  if (p.contains("String") && p["String"].is_string()) return p["String"].get<std::string>();
  return unimplemented(what + " with a Regex pattern (only String patterns are supported here)");
}

Result<std::string> string_field(const json& node, const char* key, const std::string& what) {
  if (!node.contains(key) || !node[key].is_string()) return invalid_argument(what + " has no string \"" + key + "\"");
  return node[key].get<std::string>();
}

Status read_normalizer(const json& doc, SentencePieceBpeSpec* spec) {
  MX_ASSIGN_OR_RETURN(std::vector<json> steps, flatten(doc.value("normalizer", json()), "normalizers", "normalizer"));
  for (const auto& step : steps) {
    const std::string type = step.value("type", "");
    NormalizerStep n;
    if (type == "Replace") {
      n.kind = NormalizerStep::Kind::kReplace;
      MX_ASSIGN_OR_RETURN(n.from, literal_pattern(step, "normalizer Replace"));
      MX_ASSIGN_OR_RETURN(n.to, string_field(step, "content", "normalizer Replace"));
    } else if (type == "Prepend") {
      n.kind = NormalizerStep::Kind::kPrepend;
      MX_ASSIGN_OR_RETURN(n.to, string_field(step, "prepend", "normalizer Prepend"));
    } else {
      return unimplemented("normalizer \"" + type + "\" is not supported (Replace and Prepend are)");
    }
    spec->normalizer.push_back(std::move(n));
  }
  return Status::ok();
}

Status read_pre_tokenizer(const json& doc, SentencePieceBpeSpec* spec) {
  MX_ASSIGN_OR_RETURN(std::vector<json> steps,
                      flatten(doc.value("pre_tokenizer", json()), "pretokenizers", "pre_tokenizer"));
  if (steps.size() > 1) return unimplemented("more than one pre-tokenizer step (one literal Split is supported)");
  if (steps.empty()) return Status::ok();
  const auto& step = steps[0];
  if (step.value("type", "") != "Split")
    return unimplemented("pre_tokenizer \"" + step.value("type", "") + "\" is not supported (a literal Split is)");
  if (step.value("invert", false)) return unimplemented("a Split pre-tokenizer with invert");
  LiteralSplit split;
  MX_ASSIGN_OR_RETURN(split.pattern, literal_pattern(step, "pre_tokenizer Split"));
  const std::string behavior = step.value("behavior", "");
  if (behavior == "Removed") split.behavior = LiteralSplit::Behavior::kRemoved;
  else if (behavior == "Isolated") split.behavior = LiteralSplit::Behavior::kIsolated;
  else if (behavior == "MergedWithPrevious") split.behavior = LiteralSplit::Behavior::kMergedWithPrevious;
  else if (behavior == "MergedWithNext") split.behavior = LiteralSplit::Behavior::kMergedWithNext;
  else if (behavior == "Contiguous") split.behavior = LiteralSplit::Behavior::kContiguous;
  else return invalid_argument("Split behavior \"" + behavior + "\" is unknown");
  spec->split = std::move(split);
  return Status::ok();
}

Status read_decoder(const json& doc, SentencePieceBpeSpec* spec) {
  MX_ASSIGN_OR_RETURN(std::vector<json> steps, flatten(doc.value("decoder", json()), "decoders", "decoder"));
  for (const auto& step : steps) {
    const std::string type = step.value("type", "");
    DecoderStep d;
    if (type == "Replace") {
      d.kind = DecoderStep::Kind::kReplace;
      MX_ASSIGN_OR_RETURN(d.from, literal_pattern(step, "decoder Replace"));
      MX_ASSIGN_OR_RETURN(d.to, string_field(step, "content", "decoder Replace"));
      if (d.from.empty()) return invalid_argument("a Replace decoder has an empty pattern");
    } else if (type == "ByteFallback") {
      d.kind = DecoderStep::Kind::kByteFallback;
    } else if (type == "Fuse") {
      d.kind = DecoderStep::Kind::kFuse;
    } else if (type == "Strip") {
      d.kind = DecoderStep::Kind::kStrip;
      MX_ASSIGN_OR_RETURN(d.strip_content, string_field(step, "content", "decoder Strip"));
      if (!step.contains("start") || !step["start"].is_number_unsigned() || !step.contains("stop") ||
          !step["stop"].is_number_unsigned())
        return invalid_argument("a Strip decoder needs non-negative start and stop");
      d.strip_start = static_cast<int32_t>(std::min<uint64_t>(step["start"].get<uint64_t>(), 1 << 20));
      d.strip_stop = static_cast<int32_t>(std::min<uint64_t>(step["stop"].get<uint64_t>(), 1 << 20));
    } else {
      return unimplemented("decoder \"" + type + "\" is not supported (Replace, ByteFallback, Fuse, Strip are)");
    }
    spec->decoder.push_back(std::move(d));
  }
  return Status::ok();
}

Status read_model(const json& model, SentencePieceBpeSpec* spec) {
  if (!model.contains("vocab") || !model["vocab"].is_object()) return invalid_argument("no model.vocab object");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(key) && !model[key].is_null() && model[key] != "")
      return unimplemented(std::string("BPE with ") + key);
  if (model.contains("dropout") && model["dropout"].is_number() && model["dropout"].get<double>() > 0)
    return unimplemented("BPE dropout");
  for (const auto& [key, value] : model["vocab"].items()) {
    if (!value.is_number_integer()) return invalid_argument("vocab entry \"" + key + "\" has no integer id");
    const int64_t id = value.get<int64_t>();
    if (id < 0 || id > 10'000'000) return invalid_argument("vocab entry \"" + key + "\" has id out of range");
    if (key.empty()) return invalid_argument("the vocabulary has an empty entry");
    if (spec->vocab.size() <= static_cast<size_t>(id)) spec->vocab.resize(id + 1);
    if (!spec->vocab[id].empty()) return invalid_argument("vocab id " + std::to_string(id) + " is used twice");
    spec->vocab[id] = key;
  }
  if (model.contains("merges") && model["merges"].is_array()) {
    spec->merges.reserve(model["merges"].size());
    for (const auto& m : model["merges"]) {
      if (m.is_string()) {
        const std::string& s = m.get_ref<const std::string&>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos) return invalid_argument("merge \"" + s + "\" has no space");
        spec->merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        spec->merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      } else {
        return invalid_argument("a merge is neither \"a b\" nor [\"a\", \"b\"]");
      }
    }
  }
  spec->byte_fallback = model.value("byte_fallback", false);
  spec->fuse_unk = model.value("fuse_unk", false);
  spec->ignore_merges = model.value("ignore_merges", false);
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    const std::string unk = model["unk_token"].get<std::string>();
    for (size_t id = 0; id < spec->vocab.size(); ++id)
      if (spec->vocab[id] == unk) spec->unk_id = static_cast<int32_t>(id);
    if (spec->unk_id < 0) return invalid_argument("unk_token \"" + unk + "\" is not in the vocabulary");
  }
  return Status::ok();
}

Result<std::vector<AddedToken>> read_added_tokens(const json& doc) {
  std::vector<AddedToken> added;
  if (!doc.contains("added_tokens") || !doc["added_tokens"].is_array()) return added;
  for (const auto& t : doc["added_tokens"]) {
    if (!t.is_object() || !t.contains("content") || !t["content"].is_string() || !t.contains("id") ||
        !t["id"].is_number_integer())
      return invalid_argument("an added_tokens entry lacks a string content or an integer id");
    const int64_t id = t["id"].get<int64_t>();
    if (id < 0 || id > 10'000'000) return invalid_argument("added token id out of range");
    AddedToken a;
    a.text = t["content"].get<std::string>();
    a.id = static_cast<int32_t>(id);
    a.special = t.value("special", false);
    a.lstrip = t.value("lstrip", false);
    a.rstrip = t.value("rstrip", false);
    a.single_word = t.value("single_word", false);
    a.normalized = t.value("normalized", !a.special);  // Hugging Face's default: normalized unless special
    added.push_back(std::move(a));
  }
  return added;
}

// tokenizer_config.json's bos_token (a string or {"content": ...}) when add_bos_token is set.
Result<std::optional<int32_t>> read_bos(const json& config, const std::vector<AddedToken>& added,
                                        const SentencePieceBpeSpec& spec) {
  if (!config.is_object() || !config.value("add_bos_token", false) || !config.contains("bos_token"))
    return std::optional<int32_t>();
  const auto& bos = config["bos_token"];
  std::string text;
  if (bos.is_string()) text = bos.get<std::string>();
  else if (bos.is_object() && bos.contains("content") && bos["content"].is_string()) text = bos["content"].get<std::string>();
  else return std::optional<int32_t>();
  for (const auto& a : added)
    if (a.text == text) return std::optional<int32_t>(a.id);
  for (size_t id = 0; id < spec.vocab.size(); ++id)
    if (spec.vocab[id] == text) return std::optional<int32_t>(static_cast<int32_t>(id));
  return invalid_argument("tokenizer_config.json's bos_token \"" + text + "\" is not a token");
}

}  // namespace

bool hf_json_is_byte_level(const nlohmann::json& doc) {
  return has_type(doc.value("pre_tokenizer", json()), "ByteLevel") || has_type(doc.value("decoder", json()), "ByteLevel");
}

Result<std::shared_ptr<const Tokenizer>> parse_hf_sentencepiece(const nlohmann::json& doc,
                                                                 const nlohmann::json& config) {
  SentencePieceBpeSpec spec;
  MX_RETURN_IF_ERROR(read_normalizer(doc, &spec));
  MX_RETURN_IF_ERROR(read_pre_tokenizer(doc, &spec));
  MX_RETURN_IF_ERROR(read_decoder(doc, &spec));
  MX_RETURN_IF_ERROR(read_model(doc["model"], &spec));
  MX_ASSIGN_OR_RETURN(std::vector<AddedToken> added, read_added_tokens(doc));
  MX_ASSIGN_OR_RETURN(std::optional<int32_t> bos, read_bos(config, added, spec));
  return Tokenizer::create_sentencepiece(std::move(spec), std::move(added), bos);
}

}  // namespace mx
