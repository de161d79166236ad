#include "tools/cli_args.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace mx {

Result<CliArgs> CliArgs::parse(int argc, char** argv, int first, const std::vector<CliOption>& options) {
  CliArgs args;
  for (int i = first; i < argc; ++i) {
    std::string token = argv[i];
    if (token.rfind("--", 0) != 0) return invalid_argument("unexpected argument '" + token + "'");
    std::string name = token.substr(2);
    std::string value;
    bool has_inline_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_inline_value = true;
    }
    const CliOption* option = nullptr;
    for (const auto& o : options)
      if (o.name == name) option = &o;
    if (!option) return invalid_argument("unknown option --" + name);
    if (option->takes_value && !has_inline_value) {
      if (i + 1 >= argc) return invalid_argument("option --" + name + " needs a value");
      value = argv[++i];
    } else if (!option->takes_value && has_inline_value) {
      return invalid_argument("option --" + name + " takes no value");
    }
    args.values_[name] = value;
  }
  return args;
}

std::string CliArgs::get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

Result<int64_t> CliArgs::get_int(const std::string& name, int64_t fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(it->second.c_str(), &end, 10);
  if (it->second.empty() || *end != '\0' || errno == ERANGE)
    return invalid_argument("option --" + name + " needs an integer, got '" + it->second + "'");
  return static_cast<int64_t>(v);
}

Result<double> CliArgs::get_double(const std::string& name, double fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(it->second.c_str(), &end);
  if (it->second.empty() || *end != '\0' || errno == ERANGE)
    return invalid_argument("option --" + name + " needs a number, got '" + it->second + "'");
  return v;
}

std::string cli_usage(const std::string& command, const std::vector<CliOption>& options) {
  std::ostringstream out;
  out << "usage: mxserve " << command << " [options]\n";
  for (const auto& o : options) {
    std::string lhs = "  --" + o.name + (o.takes_value ? " VALUE" : "");
    if (lhs.size() < 30) lhs.resize(30, ' ');
    out << lhs << " " << o.help << "\n";
  }
  return out.str();
}

int run_cli_command(int argc, char** argv, const std::string& command, const std::vector<CliOption>& options,
                    const std::function<Status(const CliArgs&)>& run) {
  auto args = CliArgs::parse(argc, argv, 2, options);
  if (!args.is_ok()) {
    std::fprintf(stderr, "error: %s\n%s", args.status().message().c_str(), cli_usage(command, options).c_str());
    return 2;
  }
  if (args->has("help")) {
    std::fprintf(stdout, "%s", cli_usage(command, options).c_str());
    return 0;
  }
  const Status status = run(*args);
  if (!status.is_ok()) {
    std::fprintf(stderr, "error: %s\n", status.message().c_str());
    return 1;
  }
  return 0;
}

Result<std::vector<int64_t>> parse_int_list(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno == ERANGE)
      return invalid_argument("'" + item + "' is not an integer in list '" + text + "'");
    out.push_back(v);
  }
  if (out.empty()) return invalid_argument("empty list");
  return out;
}

}  // namespace mx
