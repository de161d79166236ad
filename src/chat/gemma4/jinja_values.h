// How Gemma-4's chat template (a Jinja template run by Python) prints JSON values, so that gemma4_render can
// produce the same bytes without a template engine. Only the behaviours that template relies on are here:
// Python's str() of a value ({{ x }}), Jinja's truthiness, `dictsort` order, `trim` and `upper`.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace mx::gemma4 {

using Json = nlohmann::ordered_json;

// Python's str(value) for a value json.loads would give: strings as they are, True/False, None, ints,
// floats as repr() writes them (shortest round trip; 1e-05, 1e+16, 2.0), lists and dicts with repr()'d items.
std::string python_str(const Json& value);
// repr(float): the shortest digits that round-trip, in Python's choice of fixed or exponent form.
std::string python_float_repr(double value);

// Jinja's truthiness: null, false, 0, "", [] and {} are false; a missing key is looked up as null.
bool truthy(const Json* value);

// The object's members in Jinja's `dictsort` order: keys compared case-insensitively (ASCII), ties in
// their original order (Python's sort is stable).
std::vector<std::pair<std::string, const Json*>> dictsort(const Json& object);

// Jinja's `trim` (Python's str.strip()): Unicode whitespace removed from both ends.
std::string python_strip(std::string_view text);
// Jinja's `upper` on Python's str() of the value; a missing value is "". ASCII letters only (schema type
// names are ASCII).
std::string upper_str(const Json* value);

// value[key] as Jinja's sandbox looks it up: null when `value` is not an object or lacks the key.
const Json* member(const Json* value, const char* key);

}  // namespace mx::gemma4
