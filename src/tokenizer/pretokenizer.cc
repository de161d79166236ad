#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/log.h"
#include "tokenizer/utf8.h"

namespace mx {

const char kO200kPattern[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

namespace {

// Unicode White_Space, the definition Rust's regex (and so tiktoken) uses for \s.
constexpr const char kWhiteSpaceItems[] =
    "\\x{9}-\\x{D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

// Per-thread PCRE2 scratch: match data and a JIT stack large enough for long runs of one character class.
struct MatchScratch {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  MatchScratch() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    if (context && stack) pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchScratch& scratch() {
  thread_local MatchScratch s;
  return s;
}

}  // namespace

std::string rewrite_whitespace_classes(const std::string& pattern) {
  std::string out;
  out.reserve(pattern.size() + 256);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[i + 1];
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpaceItems) : "[" + std::string(kWhiteSpaceItems) + "]";
      } else if (e == 'S' && !in_class) {
        out += "[^" + std::string(kWhiteSpaceItems) + "]";
      } else {
        out += c;
        out += e;
      }
      ++i;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal, not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

Result<std::shared_ptr<const Pretokenizer>> Pretokenizer::compile(const std::string& pattern) {
  const std::string rewritten = rewrite_whitespace_classes(pattern);
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &error_offset, nullptr);
  if (!code) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return invalid_argument("pre-tokenizer regex does not compile at offset " + std::to_string(error_offset) +
                            ": " + reinterpret_cast<const char*>(message));
  }
  std::shared_ptr<Pretokenizer> p(new Pretokenizer(pattern));
  p->code_ = code;
  p->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  if (!p->jit_) {
    MX_LOG(Warning) << "PCRE2 JIT is unavailable; the pre-tokenizer runs interpreted";
  }
  return std::shared_ptr<const Pretokenizer>(std::move(p));
}

Pretokenizer::~Pretokenizer() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Pretokenizer::next_match(std::string_view text, size_t pos, size_t* begin, size_t* end) const {
  auto* code = static_cast<pcre2_code*>(code_);
  MatchScratch& s = scratch();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  int rc = PCRE2_ERROR_NOMATCH;
  if (s.data) {
    // The caller guarantees valid UTF-8, so PCRE2 need not re-check it on every call (that would make a
    // long text quadratic).
    rc = jit_ ? pcre2_jit_match(code, subject, text.size(), pos, 0, s.data, s.context)
              : pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, s.data, s.context);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH && jit_)  // JIT stack exhausted: the interpreter uses the heap
      rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, s.data, nullptr);
  }
  if (rc == PCRE2_ERROR_NOMATCH) {
    *begin = *end = text.size();
    return;
  }
  if (rc > 0) {
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.data);
    if (ov[1] > pos && ov[0] <= ov[1]) {
      *begin = ov[0];
      *end = ov[1];
      return;
    }
    if (ov[0] > pos) {  // an empty match later on: the gap before it is a piece of its own
      *begin = *end = ov[0];
      return;
    }
  }
  // An empty match at pos, or an engine failure: take one character on its own so that we always progress.
  int n = utf8_sequence_length(text, pos);
  if (n <= 0) n = 1;
  if (rc < 0) {
    MX_LOG(Warning) << "pre-tokenizer regex failed (PCRE2 error " << rc << "); splitting by character";
  }
  *begin = pos;
  *end = pos + n;
}

}  // namespace mx
