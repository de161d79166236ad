#include "tokenizer_util.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "chat/harmony/harmony_tokens.h"
#include "core/log.h"

namespace mx::testing {

std::string fixture_path(const std::string& relative) { return std::string(MX_FIXTURES_DIR) + "/" + relative; }

std::string read_fixture(const std::string& relative) {
  std::ifstream in(fixture_path(relative), std::ios::binary);
  MX_CHECK(in.good()) << "missing fixture " << fixture_path(relative);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

namespace {

std::shared_ptr<const Tokenizer> load_fixture_tokenizer(const std::string& name) {
  auto r = Tokenizer::load(fixture_path("tokenizer/" + name), harmony::special_tokens());
  MX_CHECK(r.is_ok()) << r.status().to_string();
  return *r;
}

}  // namespace

const Tokenizer& o200k() {
  static const auto tok = load_fixture_tokenizer("o200k_base.tiktoken");
  return *tok;
}

const Tokenizer& o200k_from_hf_json() {
  static const auto tok = load_fixture_tokenizer("gpt-oss.tokenizer.json.gz");
  return *tok;
}

std::vector<int32_t> ids_of(std::initializer_list<Piece> pieces) {
  std::vector<int32_t> ids;
  for (const auto& p : pieces) {
    if (const auto* text = std::get_if<std::string>(&p)) {
      o200k().encode_into(*text, SpecialTokens::kAsText, &ids);
    } else {
      ids.push_back(std::get<int32_t>(p));
    }
  }
  return ids;
}

}  // namespace mx::testing
