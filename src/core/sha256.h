// SHA-256 (FIPS 180-4), for checking embedded and cached files against a known digest. Not for secrets:
// nothing here is constant-time.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace mx {

// The digest of `data` as 64 lower-case hex digits.
std::string sha256_hex(std::string_view data);

}  // namespace mx
