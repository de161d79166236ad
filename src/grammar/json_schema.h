// JSON Schema -> Grammar: OpenAI's strict subset plus the common non-strict forms. Supported: type (one or
// several), enum, const, anyOf / oneOf (as alternatives), allOf of one schema, $ref into the document
// ("#", "#/$defs/..", "#/definitions/..", any JSON pointer) with recursion, nullable; objects with
// properties / required / additionalProperties; arrays with items / minItems / maxItems; strings with
// pattern / format (date-time, date, time, duration, email, hostname, ipv4, ipv6, uuid) / minLength /
// maxLength; integers and numbers with minimum / maximum / exclusive bounds, written as digit rules so a
// value out of range cannot be generated at all; booleans and null. Annotations (title, description,
// default, examples, ...) are ignored. Any other keyword is an error that names it: output is never
// silently less constrained than the schema asks.
//
// The JSON written is compact: no whitespace except one optional space after ',' and ':'. Objects list
// the required properties (in `required` order) and then the optional ones, each at most once; extra
// properties are never generated (that is always valid). Number bounds that are not integers are rounded
// inwards; decimals carry at most 15 fraction digits and never an exponent when bounded. Every output the
// grammar allows validates against the schema.
//
// A chat format may write values in a notation other than JSON (Gemma-4's tool calls: {key:value,...} with
// bare keys, strings between quote tokens with no escapes, no spaces). JsonSchemaOptions::string_quote
// selects it: the same value space, spelled that way; the caller maps the quote token to those bytes.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "grammar/grammar.h"

namespace mx::grammar {

struct JsonSchemaOptions {
  // Empty: JSON. Otherwise the quoted notation: strings are `string_quote` + raw UTF-8 (no escapes, no
  // control characters) + `string_quote`; object keys are bare words ([A-Za-z0-9_]+, others quoted);
  // no whitespace. `string_quote` must be bytes no UTF-8 text contains (e.g. "\xff").
  std::string string_quote;
};

Result<Grammar> json_schema_grammar(const nlohmann::json& schema, const JsonSchemaOptions& options = {});

// Any JSON value (object_only: any JSON object, the json_object response format).
Grammar any_json_grammar(bool object_only, const JsonSchemaOptions& options = {});

}  // namespace mx::grammar
