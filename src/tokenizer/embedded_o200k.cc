// The rank file enters the object through the assembler's .incbin (CMake passes its absolute path and
// makes this object depend on it), so nothing is converted or generated at build time.
#include "tokenizer/embedded_o200k.h"

#include <mutex>

#include "core/sha256.h"

asm(".section .rodata.mx_o200k_tiktoken,\"a\",@progbits\n"
    ".hidden mx_o200k_tiktoken_begin\n"
    ".hidden mx_o200k_tiktoken_end\n"
    ".globl mx_o200k_tiktoken_begin\n"
    ".globl mx_o200k_tiktoken_end\n"
    "mx_o200k_tiktoken_begin:\n"
    ".incbin \"" MX_O200K_TIKTOKEN_PATH "\"\n"
    "mx_o200k_tiktoken_end:\n"
    ".previous\n");

extern "C" const char mx_o200k_tiktoken_begin[];
extern "C" const char mx_o200k_tiktoken_end[];

namespace mx {

Result<std::string_view> embedded_o200k_tiktoken() {
  static std::once_flag once;
  static bool verified = false;
  static std::string digest;
  const std::string_view data(mx_o200k_tiktoken_begin, static_cast<size_t>(mx_o200k_tiktoken_end - mx_o200k_tiktoken_begin));
  std::call_once(once, [&] {
    digest = sha256_hex(data);
    verified = digest == kO200kTiktokenSha256;
  });
  if (!verified)
    return internal_error("the embedded o200k tokenizer is corrupt (SHA-256 " + digest + ", expected " +
                          kO200kTiktokenSha256 + "); rebuild mxserve");
  return data;
}

}  // namespace mx
