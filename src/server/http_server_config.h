// The part of http_server.h that needs no Boost: a server's options, its access-log record and the open-file
// limit. ApiServerOptions holds the options, so api_server.h and the files that only start a server (serve_cmd.cc,
// the server tests) include this instead of parsing Boost.Beast (about 2 CPU s a file).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mx::server {

// One finished request, for the access log.
struct AccessRecord {
  std::string client;   // peer address
  std::string method;
  std::string target;   // as routed (origin form), query included
  unsigned version = 11;
  int status = 0;       // 0: the client left before a response started
  double seconds = 0;   // request fully read -> response fully queued (or the client gone)
  std::string note;     // what the handler added (ResponseChannel::set_log_note), e.g. token counts
};

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (tests)
  int io_threads = 2;
  uint64_t max_body_bytes = 16u << 20;
  uint32_t max_header_bytes = 16u << 10;
  std::chrono::milliseconds request_timeout{60000};  // to receive one whole request, and idle keep-alive
  std::chrono::milliseconds write_timeout{120000};   // for one write to drain (a client that stops reading)
  std::function<void(const AccessRecord&)> access_log;  // called once per request on its strand; may be empty
  // CORS: origins browsers may call from ("*" = any); empty = no CORS headers, preflights are not answered.
  std::vector<std::string> allowed_origins;
};

// Raises the soft limit on open files towards 65535 (capped by the hard limit); says whether it rose and,
// in `soft_after`, what the soft limit is now (-1: unlimited).
bool raise_open_file_limit(int64_t* soft_after);

}  // namespace mx::server
