// Minimal `--name value` / `--flag` parsing for the mxserve subcommands. Unknown options and missing
// values are errors with one clear line; nothing here aborts on user input.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"

namespace mx {

struct CliOption {
  std::string name;  // without the leading "--"
  bool takes_value;
  std::string help;
  // Other spellings of the same setting that users paste from vLLM and SGLang command lines
  // (`max-num-seqs` for `max-running-requests`); stored under `name`.
  std::vector<std::string> aliases = {};
};

class CliArgs {
 public:
  // Parses argv[first..argc). Accepts "--name value" and "--name=value", and an alias for any name. With
  // `positional` set, one bare argument is taken as that option's value (`mxserve serve DIR`). An unknown
  // option is an error that names the closest known one ("did you mean --max-num-seqs?").
  static Result<CliArgs> parse(int argc, char** argv, int first, const std::vector<CliOption>& options,
                               const std::string& positional = "");

  bool has(const std::string& name) const { return values_.count(name) != 0; }
  std::string get(const std::string& name, const std::string& fallback = "") const;
  Result<int64_t> get_int(const std::string& name, int64_t fallback) const;
  Result<double> get_double(const std::string& name, double fallback) const;

 private:
  std::map<std::string, std::string> values_;
};

// "usage: mxserve <command> [options]" followed by one line per option.
std::string cli_usage(const std::string& command, const std::vector<CliOption>& options);

// The shared frame of a subcommand: parse (usage + exit 2 on a bad option), --help (exit 0), then `run`;
// a failed Status prints one "error:" line and exits 1.
int run_cli_command(int argc, char** argv, const std::string& command, const std::vector<CliOption>& options,
                    const std::function<Status(const CliArgs&)>& run);

// Parses "1,2,3" into integers; rejects empty items and non-numbers.
Result<std::vector<int64_t>> parse_int_list(const std::string& text);

}  // namespace mx
