// EBNF text grammars in the GBNF style that vLLM's `grammar` / `guided_grammar` and SGLang's `ebnf` carry:
//   root  ::= "answer: " value        # the start rule is named root
//   value ::= [0-9]+ | "yes" | "no" | ( "a" | "b" ){2,3} item?
// Terms: "literal" (escapes \n \t \r \\ \" \xHH \uHHHH), [character class] (as in regex.h), rule names,
// ( groups ), and the quantifiers * + ? {m} {m,} {m,n}; alternatives with |; comments from # to the end
// of the line. A rule's body runs until the next `name ::=`. Errors name the line.
#pragma once

#include <string_view>

#include "core/status.h"
#include "grammar/grammar.h"

namespace mx::grammar {

Result<Grammar> parse_ebnf(std::string_view text);

}  // namespace mx::grammar
