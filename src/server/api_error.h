// ApiError: one failed HTTP request as OpenAI reports it, `{"error": {"message", "type", "param", "code"}}`
// with the matching status. Every error the server sends goes through here, so no handler can answer
// 200 with an error inside (tenstorrent/vllm#386) or invent its own shape.
#pragma once

#include <string>

namespace mx::server {

struct ApiError {
  int status = 500;
  std::string type;     // invalid_request_error, authentication_error, not_found_error, ...
  std::string message;  // one sentence for the person who sent the request
  std::string param;    // the offending field ("messages[2].content"); "" is sent as null
  std::string code;     // machine-readable ("context_length_exceeded"); "" is sent as null

  static ApiError invalid_request(std::string message, std::string param = "", std::string code = "");
  static ApiError unauthorized();
  static ApiError not_found(std::string message, std::string code = "not_found");
  static ApiError method_not_allowed(const std::string& method, const std::string& path);
  static ApiError payload_too_large(long long limit_bytes);
  static ApiError headers_too_large();
  static ApiError unsupported_media_type(const std::string& content_type);
  // 503: the queue is full, the model is loading or the server is draining. Sent with Retry-After.
  static ApiError unavailable(std::string message, std::string code = "");
  static ApiError not_implemented(std::string message);
  static ApiError internal(std::string message);
};

// The JSON envelope, `{"error": {...}}`.
std::string error_body(const ApiError& error);

}  // namespace mx::server
