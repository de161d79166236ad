// Shared fixtures for the tokenizer, detokenizer and Harmony tests: the o200k tokenizer loaded once per
// test process from tests/fixtures/tokenizer, and helpers to build token streams by hand.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <variant>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace mx::testing {

// From o200k_base.tiktoken (fast to load), with Harmony's special tokens (gpt-oss's o200k_harmony). Aborts
// the test process if the fixture is missing.
const Tokenizer& o200k();
// From gpt-oss.tokenizer.json.gz (slower: use in few tests).
const Tokenizer& o200k_from_hf_json();

std::string fixture_path(const std::string& relative);
std::string read_fixture(const std::string& relative);

// A token stream written as pieces: strings are encoded as ordinary text, ints are ids (specials).
using Piece = std::variant<std::string, int32_t>;
std::vector<int32_t> ids_of(std::initializer_list<Piece> pieces);

}  // namespace mx::testing
