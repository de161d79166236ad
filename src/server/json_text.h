// The door between bytes and JSON. Request bodies are checked before nlohmann sees them: valid UTF-8
// (a precise 400 instead of a parser message) and bounded nesting (a body of a million '[' must cost a
// scan, not a deep recursion). Everything we write goes through json_text, which replaces invalid bytes
// with U+FFFD instead of throwing (a model can emit half a character; llama.cpp learned this the hard way).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "server/api_error.h"

namespace mx::server {

using Json = nlohmann::json;

inline constexpr int kMaxJsonDepth = 64;

// Compact JSON text; invalid UTF-8 in strings becomes U+FFFD. Never throws.
std::string json_text(const Json& value);

// Offset of the first byte that is not part of well-formed UTF-8 (overlongs, surrogates and code points
// above U+10FFFF are ill-formed), or nullopt when all of `text` is valid.
std::optional<size_t> find_invalid_utf8(std::string_view text);

// Length of the longest prefix of `text` that does not end inside a multi-byte character; streams hold
// the rest back until the next piece completes it.
size_t complete_utf8_prefix(std::string_view text);

// Deepest array/object nesting in `text`, counted outside strings; stops counting past `limit`.
int json_nesting_depth(std::string_view text, int limit);

// UTF-8 check, depth check, then parse. The body must be a JSON object.
std::optional<ApiError> parse_json_object(std::string_view body, Json* out);

}  // namespace mx::server
