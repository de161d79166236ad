// OpenAI error envelopes. Types follow OpenAI's (and llama.cpp's) spelling so that clients which switch on
// `type` or `code` behave as they do against the real API.
#include "server/api_error.h"

#include <nlohmann/json.hpp>

#include "server/json_text.h"

namespace mx::server {

ApiError ApiError::invalid_request(std::string message, std::string param, std::string code) {
  return {400, "invalid_request_error", std::move(message), std::move(param), std::move(code)};
}

ApiError ApiError::unauthorized() {
  return {401, "authentication_error", "Invalid or missing API key: send `Authorization: Bearer <key>`.", "",
          "invalid_api_key"};
}

ApiError ApiError::not_found(std::string message, std::string code) {
  return {404, "not_found_error", std::move(message), "", std::move(code)};
}

ApiError ApiError::method_not_allowed(const std::string& method, const std::string& path) {
  return {405, "invalid_request_error", "Method " + method + " is not allowed on " + path + ".", "",
          "method_not_allowed"};
}

ApiError ApiError::payload_too_large(long long limit_bytes) {
  return {413, "invalid_request_error",
          "Request body is larger than the server's limit of " + std::to_string(limit_bytes) + " bytes.", "",
          "request_too_large"};
}

ApiError ApiError::headers_too_large() {
  return {431, "invalid_request_error", "Request headers are larger than the server accepts.", "",
          "headers_too_large"};
}

ApiError ApiError::unsupported_media_type(const std::string& content_type) {
  return {415, "invalid_request_error",
          "Content-Type '" + content_type + "' is not supported: send the body as JSON with `Content-Type: application/json`.",
          "", "unsupported_media_type"};
}

ApiError ApiError::unavailable(std::string message, std::string code) {
  return {503, "unavailable_error", std::move(message), "", std::move(code)};
}

ApiError ApiError::not_implemented(std::string message) {
  return {501, "not_supported_error", std::move(message), "", "not_implemented"};
}

ApiError ApiError::internal(std::string message) {
  return {500, "server_error", std::move(message), "", ""};
}

std::string error_body(const ApiError& error) {
  nlohmann::json inner = {{"message", error.message}, {"type", error.type}};
  inner["param"] = error.param.empty() ? nlohmann::json(nullptr) : nlohmann::json(error.param);
  inner["code"] = error.code.empty() ? nlohmann::json(nullptr) : nlohmann::json(error.code);
  return json_text(nlohmann::json{{"error", std::move(inner)}});
}

}  // namespace mx::server
