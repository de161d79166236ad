#include "tools/cli_args.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace mx {

namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The known spelling closest to `name`, if it is close enough to be a typo (or a prefix of one).
std::string closest_option(const std::string& name, const std::vector<CliOption>& options) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, name.size() / 4) + 1;
  for (const auto& o : options) {
    std::vector<std::string> spellings = o.aliases;
    spellings.push_back(o.name);
    for (const auto& s : spellings) {
      size_t d = edit_distance(name, s);
      if (name.size() >= 4 && s.rfind(name, 0) == 0) d = std::min<size_t>(d, 1);
      if (d < best_distance) best_distance = d, best = s;
    }
  }
  return best;
}

}  // namespace

Result<CliArgs> CliArgs::parse(int argc, char** argv, int first, const std::vector<CliOption>& options,
                               const std::string& positional) {
  CliArgs args;
  bool positional_taken = false;
  for (int i = first; i < argc; ++i) {
    std::string token = argv[i];
    if (token.rfind("--", 0) != 0) {
      if (positional.empty() || positional_taken || token.empty())
        return invalid_argument("unexpected argument '" + token + "'");
      if (args.has(positional)) return invalid_argument("'" + token + "' and --" + positional + " both name the " + positional);
      positional_taken = true;
      args.values_[positional] = token;
      continue;
    }
    std::string name = token.substr(2);
    std::string value;
    bool has_inline_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_inline_value = true;
    }
    const CliOption* option = nullptr;
    for (const auto& o : options) {
      if (o.name == name || std::find(o.aliases.begin(), o.aliases.end(), name) != o.aliases.end()) option = &o;
    }
    if (!option) {
      const std::string guess = closest_option(name, options);
      return invalid_argument("unknown option --" + name + (guess.empty() ? "" : " (did you mean --" + guess + "?)"));
    }
    if (positional_taken && option->name == positional)
      return invalid_argument("--" + name + " and a bare argument both name the " + positional);
    if (option->takes_value && !has_inline_value) {
      if (i + 1 >= argc) return invalid_argument("option --" + name + " needs a value");
      value = argv[++i];
    } else if (!option->takes_value && has_inline_value) {
      return invalid_argument("option --" + name + " takes no value");
    }
    args.values_[option->name] = value;
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
    std::string also;
    for (const auto& a : o.aliases) also += (also.empty() ? " (also --" : ", --") + a;
    out << lhs << " " << o.help << (also.empty() ? "" : also + ")") << "\n";
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
