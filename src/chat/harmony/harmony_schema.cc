// JSON Schema -> the TypeScript-like types gpt-oss was trained to read in its "# Tools" section.
//
// The layout (comment placement, "?" for optional fields, enum unions, "// default:" comments, oneOf
// unions one per line, four more spaces of indent per nested object) is what openai/harmony renders, and
// the tests pin it byte for byte. Unknown or malformed schema parts degrade to `any`; nothing here fails.
#include <unordered_set>

#include "chat/harmony/harmony_renderer.h"

namespace mx {
namespace {

using Json = nlohmann::ordered_json;

bool is_enum(const Json& schema) {
  auto it = schema.find("enum");
  return it != schema.end() && it->is_array() && !it->empty();
}

const std::string* string_field(const Json& schema, const char* key) {
  auto it = schema.find(key);
  return it != schema.end() && it->is_string() ? &it->get_ref<const std::string&>() : nullptr;
}

bool is_nullable(const Json& schema) {
  auto it = schema.find("nullable");
  return it != schema.end() && it->is_boolean() && it->get<bool>();
}

// "default: ..." text. Property-level defaults print a string enum value bare (`default: celsius`), a
// free string quoted, anything else as compact JSON; union variants always use the JSON form for enums.
std::string default_text(const Json& value, bool bare_enum_strings, bool owner_is_enum) {
  if (value.is_string() && !owner_is_enum) return "default: \"" + value.get<std::string>() + "\"";
  if (value.is_string() && bare_enum_strings) return "default: " + value.get<std::string>();
  return "default: " + value.dump();
}

std::string with_null(std::string type, const Json& schema) {
  if (is_nullable(schema) && type.find("null") == std::string::npos) type += " | null";
  return type;
}

// Trailing " // description default: ..." of one union variant.
std::string variant_comment(const Json& variant, bool skip_description, const std::string* property_desc,
                            bool bare_enum_strings) {
  std::string text;
  const std::string* desc = string_field(variant, "description");
  if (!skip_description && desc && (!property_desc || *desc != *property_desc)) text = *desc;
  if (auto it = variant.find("default"); it != variant.end()) {
    if (!text.empty()) text += " ";
    text += default_text(*it, bare_enum_strings, is_enum(variant));
  }
  return text.empty() ? "" : " // " + text;
}

std::string object_to_typescript(const Json& schema, const std::string& indent) {
  std::string out;
  if (const std::string* desc = string_field(schema, "description")) out += indent + "// " + *desc + "\n";
  out += "{\n";
  auto props = schema.find("properties");
  if (props != schema.end() && props->is_object()) {
    std::unordered_set<std::string> required;
    if (auto req = schema.find("required"); req != schema.end() && req->is_array()) {
      for (const auto& r : *req)
        if (r.is_string()) required.insert(r.get<std::string>());
    }
    for (const auto& [key, val] : props->items()) {
      const std::string optional = required.count(key) ? "" : "?";
      if (const std::string* title = string_field(val, "title")) out += indent + "// " + *title + "\n" + indent + "//\n";
      auto one_of = val.find("oneOf");
      const bool has_one_of = one_of != val.end();
      const std::string* desc = string_field(val, "description");
      if (!has_one_of && desc) out += indent + "// " + *desc + "\n";
      if (auto ex = val.find("examples"); ex != val.end() && ex->is_array() && !ex->empty()) {
        out += indent + "// Examples:\n";
        for (const auto& e : *ex)
          if (e.is_string()) out += indent + "// - \"" + e.get<std::string>() + "\"\n";
      }
      if (has_one_of && one_of->is_array()) {
        // The property's description goes above unless the first variant repeats it.
        bool desc_above = false;
        if (desc) {
          const std::string* first_desc = one_of->empty() ? nullptr : string_field((*one_of)[0], "description");
          if (!first_desc || *first_desc != *desc) {
            out += indent + "// " + *desc + "\n";
            desc_above = true;
          }
        }
        if (auto def = val.find("default"); def != val.end())
          out += indent + "// " + default_text(*def, /*bare_enum_strings=*/true, is_enum(val)) + "\n";
        out += indent + key + optional + ":\n";
        for (size_t i = 0; i < one_of->size(); ++i) {
          const Json& variant = (*one_of)[i];
          out += indent + " | " + with_null(json_schema_to_typescript(variant, indent + "   "), variant);
          out += variant_comment(variant, i == 0 && desc_above, desc, /*bare_enum_strings=*/true);
          out += "\n";
        }
        out += indent + ",\n";
        continue;
      }
      out += indent + key + optional + ": " + with_null(json_schema_to_typescript(val, indent + "    "), val) + ",";
      if (!has_one_of) {
        if (auto def = val.find("default"); def != val.end())
          out += " // " + default_text(*def, /*bare_enum_strings=*/true, is_enum(val));
      }
      out += "\n";
    }
  }
  out += indent + "}";
  return out;
}

}  // namespace

std::string json_schema_to_typescript(const Json& schema, const std::string& indent) {
  if (!schema.is_object()) return "any";
  if (auto one_of = schema.find("oneOf"); one_of != schema.end() && one_of->is_array()) {
    std::string out;
    for (const auto& variant : *one_of) {
      out += "\n" + indent + " | " + with_null(json_schema_to_typescript(variant, indent + "   "), variant);
      out += variant_comment(variant, false, nullptr, /*bare_enum_strings=*/false);
    }
    return out;
  }
  auto type = schema.find("type");
  if (type == schema.end()) return "any";
  if (type->is_array()) {
    std::string out;
    for (const auto& t : *type) {
      if (!t.is_string()) continue;
      if (!out.empty()) out += " | ";
      out += t.get<std::string>() == "integer" ? "number" : t.get<std::string>();
    }
    if (!out.empty()) return out;
    return "any";
  }
  if (!type->is_string()) return "any";
  const std::string& t = type->get_ref<const std::string&>();
  if (t == "object") return object_to_typescript(schema, indent);
  if (t == "string") {
    std::string out;
    if (auto e = schema.find("enum"); e != schema.end() && e->is_array()) {
      for (const auto& v : *e) {
        if (!v.is_string()) continue;
        if (!out.empty()) out += " | ";
        out += "\"" + v.get<std::string>() + "\"";
      }
    }
    return out.empty() ? "string" : out;
  }
  if (t == "number" || t == "integer") return "number";
  if (t == "boolean") return "boolean";
  if (t == "array") {
    auto items = schema.find("items");
    return items != schema.end() ? json_schema_to_typescript(*items, indent) + "[]" : "Array<any>";
  }
  return "any";
}

}  // namespace mx
