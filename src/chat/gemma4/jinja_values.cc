#include "chat/gemma4/jinja_values.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "tokenizer/utf8.h"

namespace mx::gemma4 {
namespace {

// Python's repr(str): single quotes unless the text has a single quote and no double quote; backslash,
// the quote and control characters escaped (printable non-ASCII text stays as it is).
std::string python_repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == '\\' || c == static_cast<unsigned char>(quote)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[5];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  return out;
}

std::string python_repr(const Json& value) {
  return value.is_string() ? python_repr_string(value.get<std::string>()) : python_str(value);
}

// Python's str.isspace() for one code point.
bool is_python_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
         cp == 0x3000;
}

uint32_t decode_at(std::string_view text, size_t pos, int len) {
  const auto b = [&](int i) { return static_cast<uint32_t>(static_cast<unsigned char>(text[pos + i])); };
  switch (len) {
    case 1: return b(0);
    case 2: return ((b(0) & 0x1f) << 6) | (b(1) & 0x3f);
    case 3: return ((b(0) & 0x0f) << 12) | ((b(1) & 0x3f) << 6) | (b(2) & 0x3f);
    default: return ((b(0) & 0x07) << 18) | ((b(1) & 0x3f) << 12) | ((b(2) & 0x3f) << 6) | (b(3) & 0x3f);
  }
}

}  // namespace

std::string python_float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  std::string sci(buf, end);  // "-1.2345e+02": shortest round-trip digits
  std::string out;
  size_t i = 0;
  if (sci[0] == '-') {
    out += '-';
    i = 1;
  }
  const size_t e = sci.find('e');
  std::string digits;
  for (size_t k = i; k < e; ++k)
    if (sci[k] != '.') digits += sci[k];
  const int exponent = std::stoi(sci.substr(e + 1));
  const int decpt = exponent + 1;  // digits d1 d2 ... with the point after decpt of them
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(-decpt, '0') + digits;
    } else if (decpt >= static_cast<int>(digits.size())) {
      out += digits + std::string(decpt - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, decpt) + "." + digits.substr(decpt);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp_buf[16];
  std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + exp_buf;
}

std::string python_str(const Json& value) {
  switch (value.type()) {
    case Json::value_t::string: return value.get<std::string>();
    case Json::value_t::boolean: return value.get<bool>() ? "True" : "False";
    case Json::value_t::null: return "None";
    case Json::value_t::number_integer: return std::to_string(value.get<int64_t>());
    case Json::value_t::number_unsigned: return std::to_string(value.get<uint64_t>());
    case Json::value_t::number_float: return python_float_repr(value.get<double>());
    case Json::value_t::array: {
      std::string out = "[";
      for (size_t i = 0; i < value.size(); ++i) out += (i ? ", " : "") + python_repr(value[i]);
      return out + "]";
    }
    case Json::value_t::object: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, v] : value.items()) {
        out += (first ? "" : ", ") + python_repr_string(k) + ": " + python_repr(v);
        first = false;
      }
      return out + "}";
    }
    default: return "";
  }
}

bool truthy(const Json* value) {
  if (!value) return false;
  switch (value->type()) {
    case Json::value_t::null: return false;
    case Json::value_t::boolean: return value->get<bool>();
    case Json::value_t::number_integer: return value->get<int64_t>() != 0;
    case Json::value_t::number_unsigned: return value->get<uint64_t>() != 0;
    case Json::value_t::number_float: return value->get<double>() != 0.0;
    case Json::value_t::string: return !value->get_ref<const std::string&>().empty();
    case Json::value_t::array:
    case Json::value_t::object: return !value->empty();
    default: return false;
  }
}

std::vector<std::pair<std::string, const Json*>> dictsort(const Json& object) {
  std::vector<std::pair<std::string, const Json*>> items;
  if (!object.is_object()) return items;
  for (const auto& [k, v] : object.items()) items.emplace_back(k, &v);
  auto lower = [](const std::string& s) {
    std::string out = s;
    for (char& c : out)
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    return out;
  };
  std::stable_sort(items.begin(), items.end(), [&](const auto& a, const auto& b) { return lower(a.first) < lower(b.first); });
  return items;
}

std::string python_strip(std::string_view text) {
  size_t begin = 0;
  while (begin < text.size()) {
    const int len = utf8_sequence_length(text, begin);
    if (len == 0 || !is_python_space(decode_at(text, begin, len))) break;
    begin += len;
  }
  size_t end = text.size();
  while (end > begin) {
    size_t start = end - 1;  // back up to the lead byte of the last character
    while (start > begin && (static_cast<unsigned char>(text[start]) & 0xc0) == 0x80 && end - start < 4) --start;
    const int len = utf8_sequence_length(text, start);
    if (len == 0 || start + len != end || !is_python_space(decode_at(text, start, len))) break;
    end = start;
  }
  return std::string(text.substr(begin, end - begin));
}

std::string upper_str(const Json* value) {
  if (!value) return "";
  std::string s = python_str(*value);
  for (char& c : s)
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  return s;
}

const Json* member(const Json* value, const char* key) {
  if (!value || !value->is_object()) return nullptr;
  auto it = value->find(key);
  return it == value->end() ? nullptr : &*it;
}

}  // namespace mx::gemma4
