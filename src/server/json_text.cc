// UTF-8 and nesting checks for request bodies, and non-throwing JSON output.
#include "server/json_text.h"

namespace mx::server {

std::string json_text(const Json& value) { return value.dump(-1, ' ', false, Json::error_handler_t::replace); }

namespace {

// Length of the well-formed UTF-8 sequence starting at text[i], 0 if ill-formed, -1 if cut off by the end.
int utf8_sequence_length(std::string_view text, size_t i) {
  const auto b0 = static_cast<unsigned char>(text[i]);
  if (b0 < 0x80) return 1;
  int len;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Unicode table 3-7)
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;  // no overlongs
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;  // no overlongs
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return 0;
  }
  for (int k = 1; k < len; ++k) {
    if (i + k >= text.size()) return -1;
    const auto b = static_cast<unsigned char>(text[i + k]);
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return 0;
  }
  return len;
}

}  // namespace

std::optional<size_t> find_invalid_utf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const int len = utf8_sequence_length(text, i);
    if (len <= 0) return i;
    i += static_cast<size_t>(len);
  }
  return std::nullopt;
}

size_t complete_utf8_prefix(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const int len = utf8_sequence_length(text, i);
    if (len < 0) return i;          // an incomplete character at the end: hold it back
    i += len == 0 ? 1 : static_cast<size_t>(len);  // an ill-formed byte will never complete: pass it on
  }
  return i;
}

int json_nesting_depth(std::string_view text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest) deepest = depth;
      if (deepest > limit) return deepest;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

std::optional<ApiError> parse_json_object(std::string_view body, Json* out) {
  if (body.empty()) return ApiError::invalid_request("The request body is empty; expected a JSON object.");
  if (auto bad = find_invalid_utf8(body))
    return ApiError::invalid_request("The request body is not valid UTF-8 (byte offset " + std::to_string(*bad) + ").",
                                     "", "invalid_utf8");
  if (json_nesting_depth(body, kMaxJsonDepth) > kMaxJsonDepth)
    return ApiError::invalid_request("The request JSON is nested deeper than " + std::to_string(kMaxJsonDepth) +
                                     " levels.");
  Json parsed = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return ApiError::invalid_request("The request body is not valid JSON.", "", "invalid_json");
  if (!parsed.is_object())
    return ApiError::invalid_request("The request body must be a JSON object, not " + std::string(parsed.type_name()) +
                                     ".");
  *out = std::move(parsed);
  return std::nullopt;
}

}  // namespace mx::server
