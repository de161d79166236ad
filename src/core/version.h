// The mxserve release version: `mxserve --version`, `serve --version` and GET /version report it.
#pragma once

namespace mx {

inline constexpr const char* kMxserveVersion = "0.1.0";

}  // namespace mx
