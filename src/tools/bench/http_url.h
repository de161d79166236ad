// `http://host[:port][/prefix]` parsed into what a TCP connect and an HTTP/1.1 request need. Only plain
// http is supported (https is refused with a clear message); IPv6 literals come in brackets.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace mx::bench {

struct HttpUrl {
  std::string host;         // without brackets, for the resolver
  uint16_t port = 80;
  std::string path_prefix;  // "" or "/prefix" without a trailing slash; a trailing "/v1" is dropped
  std::string host_header;  // the Host header value: host (bracketed for IPv6) plus ":port" when not 80

  // prefix + path, e.g. target("/v1/models").
  std::string target(std::string_view path) const { return path_prefix + std::string(path); }
  std::string to_string() const { return "http://" + host_header + path_prefix; }
};

// Base URLs as OpenAI clients write them ("http://host:8000/v1") and as bench tools do ("http://host:8000")
// both work: the "/v1" of the first is dropped, since the endpoints are added with their "/v1".
Result<HttpUrl> parse_http_url(std::string_view url);

}  // namespace mx::bench
