// What the GPU benchmarks share: a failed step ends the benchmark with the expression and its status (a
// number measured past a failure would mean nothing).
#pragma once

#include <cstdio>
#include <cstdlib>

#include "core/status.h"

#define CHECK_OK(expr)                                                 \
  do {                                                                 \
    ::mx::Status s_ = (expr);                                          \
    if (!s_.is_ok()) {                                                 \
      std::fprintf(stderr, "%s: %s\n", #expr, s_.to_string().c_str()); \
      std::exit(1);                                                    \
    }                                                                  \
  } while (0)
