// Reading model config files (config.json, generation_config.json): a JSON object parsed without
// exceptions and typed field access whose every failure names the file and the field. Model families
// parse their own configs with it (model/<family>/); nothing here knows a model.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace mx {

// `text` parsed as a JSON object; `source` names the file in errors.
Result<nlohmann::json> parse_json_object(const std::string& text, const std::string& source);

class JsonFieldReader {
 public:
  JsonFieldReader(const nlohmann::json& obj, std::string source) : obj_(obj), source_(std::move(source)) {}

  const std::string& source() const { return source_; }
  Status required_int(const char* key, int64_t* out, int64_t min_value) const;
  Status optional_int(const char* key, int64_t* out, int64_t min_value) const;
  Status optional_double(const char* key, double* out) const;
  Status optional_bool(const char* key, bool* out) const;

 private:
  Status to_int(const char* key, const nlohmann::json& v, int64_t* out, int64_t min_value) const;

  const nlohmann::json& obj_;
  std::string source_;
};

}  // namespace mx
