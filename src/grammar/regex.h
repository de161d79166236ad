// Regular expressions (the ECMAScript/PCRE subset JSON Schema patterns and vLLM's guided_regex use) as a
// grammar expression over UTF-8 bytes: literals, `.`, classes with ranges and negation, \d \w \s and
// their complements, \xHH \uHHHH \u{H..} escapes, groups (capturing, non-capturing, named), alternation,
// and the quantifiers * + ? {n} {n,} {n,m} (lazy and possessive suffixes accepted: they change which match
// is found, not which strings match). The whole pattern must match (a leading ^ and a trailing $ are
// allowed and change nothing). Back-references, lookaround, word boundaries, inline flags are refused
// with an error naming them.
#pragma once

#include <string_view>

#include "core/status.h"
#include "grammar/grammar.h"

namespace mx::grammar {

struct RegexOptions {
  // Leave out the characters a JSON string must escape (", \, U+0000..U+001F): a pattern applied to a JSON
  // string value can then be emitted unescaped, and every match is still a match.
  bool json_string_safe = false;
};

Result<Expr> parse_regex(std::string_view pattern, const RegexOptions& options = {});

// A whole grammar whose root matches the pattern.
Result<Grammar> regex_grammar(std::string_view pattern);

}  // namespace mx::grammar
