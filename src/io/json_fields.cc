#include "io/json_fields.h"

#include <cmath>

namespace mx {

using nlohmann::json;

Result<json> parse_json_object(const std::string& text, const std::string& source) {
  json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return invalid_argument(source + ": not valid JSON");
  if (!root.is_object()) return invalid_argument(source + ": not a JSON object");
  return root;
}

Status JsonFieldReader::required_int(const char* key, int64_t* out, int64_t min_value) const {
  auto it = obj_.find(key);
  if (it == obj_.end() || it->is_null()) return invalid_argument(source_ + ": missing field '" + key + "'");
  return to_int(key, *it, out, min_value);
}

Status JsonFieldReader::optional_int(const char* key, int64_t* out, int64_t min_value) const {
  auto it = obj_.find(key);
  if (it == obj_.end() || it->is_null()) return Status::ok();
  return to_int(key, *it, out, min_value);
}

Status JsonFieldReader::optional_double(const char* key, double* out) const {
  auto it = obj_.find(key);
  if (it == obj_.end() || it->is_null()) return Status::ok();
  if (!it->is_number()) return invalid_argument(source_ + ": field '" + key + "' must be a number");
  *out = it->get<double>();
  if (!std::isfinite(*out)) return invalid_argument(source_ + ": field '" + key + "' must be finite");
  return Status::ok();
}

Status JsonFieldReader::optional_bool(const char* key, bool* out) const {
  auto it = obj_.find(key);
  if (it == obj_.end() || it->is_null()) return Status::ok();
  if (!it->is_boolean()) return invalid_argument(source_ + ": field '" + key + "' must be true or false");
  *out = it->get<bool>();
  return Status::ok();
}

Status JsonFieldReader::to_int(const char* key, const json& v, int64_t* out, int64_t min_value) const {
  if (v.is_number_integer()) {
    *out = v.get<int64_t>();
  } else if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>() && std::fabs(v.get<double>()) < 9e15) {
    *out = static_cast<int64_t>(v.get<double>());
  } else {
    return invalid_argument(source_ + ": field '" + key + "' must be an integer");
  }
  if (*out < min_value)
    return invalid_argument(source_ + ": field '" + key + "' is " + std::to_string(*out) + ", must be >= " +
                            std::to_string(min_value));
  return Status::ok();
}

}  // namespace mx
