#include "tools/bench/http_url.h"

#include <algorithm>
#include <cctype>

namespace mx::bench {
namespace {

bool starts_with_nocase(std::string_view text, std::string_view prefix) {
  if (text.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(text[i])) != prefix[i]) return false;
  return true;
}

bool valid_host_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
}

}  // namespace

Result<HttpUrl> parse_http_url(std::string_view url) {
  const std::string quoted = "'" + std::string(url) + "'";
  if (starts_with_nocase(url, "https://"))
    return invalid_argument("base URL " + quoted + ": https is not supported, only http:// (run the client where "
                            "it can reach the server over plain HTTP)");
  if (!starts_with_nocase(url, "http://"))
    return invalid_argument("base URL " + quoted + " must look like http://HOST[:PORT][/PREFIX]");
  std::string_view rest = url.substr(7);
  const size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? std::string_view() : rest.substr(slash);
  if (authority.find('@') != std::string_view::npos)
    return invalid_argument("base URL " + quoted + ": user:password@ is not supported (use --api-key)");
  if (path.find_first_of("?#") != std::string_view::npos)
    return invalid_argument("base URL " + quoted + ": a query or fragment is not supported");
  if (path.find_first_of(" \t\r\n") != std::string_view::npos)
    return invalid_argument("base URL " + quoted + ": the path holds whitespace");

  HttpUrl out;
  std::string_view port_text;
  bool has_port = false;
  if (!authority.empty() && authority[0] == '[') {
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) return invalid_argument("base URL " + quoted + ": unclosed '[' in the host");
    out.host = std::string(authority.substr(1, close - 1));
    const std::string_view after = authority.substr(close + 1);
    if (!after.empty() && after[0] != ':') return invalid_argument("base URL " + quoted + ": junk after ']'");
    has_port = !after.empty();
    if (has_port) port_text = after.substr(1);
    if (out.host.empty() || out.host.find_first_not_of("0123456789abcdefABCDEF:.") != std::string::npos)
      return invalid_argument("base URL " + quoted + ": bad IPv6 address");
  } else {
    const size_t colon = authority.find(':');
    out.host = std::string(authority.substr(0, colon));
    has_port = colon != std::string_view::npos;
    if (has_port) port_text = authority.substr(colon + 1);
    if (out.host.empty()) return invalid_argument("base URL " + quoted + " has no host");
    if (!std::all_of(out.host.begin(), out.host.end(), valid_host_char))
      return invalid_argument("base URL " + quoted + ": bad character in the host");
  }
  if (has_port) {
    if (port_text.empty() || port_text.size() > 5 || port_text.find_first_not_of("0123456789") != std::string_view::npos)
      return invalid_argument("base URL " + quoted + ": the port must be a number");
    const int port = std::stoi(std::string(port_text));
    if (port < 1 || port > 65535) return invalid_argument("base URL " + quoted + ": the port must be 1..65535");
    out.port = static_cast<uint16_t>(port);
  }
  std::string prefix(path);
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  if (prefix.size() >= 3 && prefix.compare(prefix.size() - 3, 3, "/v1") == 0) prefix.resize(prefix.size() - 3);
  out.path_prefix = prefix;
  const bool ipv6 = out.host.find(':') != std::string::npos;
  out.host_header = ipv6 ? "[" + out.host + "]" : out.host;
  if (out.port != 80) out.host_header += ":" + std::to_string(out.port);
  return out;
}

}  // namespace mx::bench
