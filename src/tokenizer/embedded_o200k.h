// The o200k_base rank file (tests/fixtures/tokenizer/o200k_base.tiktoken, 3.6 MB), linked into the binary
// so that the demo model never needs a download at run time and works from any working directory. With
// the special tokens of gpt-oss's chat format added on load, it is gpt-oss's o200k_harmony tokenizer.
#pragma once

#include <string_view>

#include "core/status.h"

namespace mx {

inline constexpr char kO200kTiktokenSha256[] = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d";
inline constexpr char kO200kTiktokenFileName[] = "o200k_base.tiktoken";

// The embedded bytes, after checking their SHA-256 against kO200kTiktokenSha256 (once per process).
Result<std::string_view> embedded_o200k_tiktoken();

}  // namespace mx
