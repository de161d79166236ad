// `mxserve tokenize`: text <-> token ids through a tokenizer file or model directory, one JSON value a line.
// Encoding reads one JSON string per line and prints one JSON int array; --decode does the reverse. A bad
// line stops the run with its line number on stderr (the lines before it have been answered).
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "chat/chat_formats.h"
#include "model/model_registry.h"
#include "tools/cli_args.h"
#include "tools/commands.h"
#include "tokenizer/tokenizer.h"

namespace mx {
namespace {

const std::vector<CliOption> kOptions = {
    {"tokenizer", true, "tokenizer.json(.gz), .tiktoken file, or a model directory"},
    {"decode", false, "read JSON int arrays, print JSON strings"},
    {"allow-special", false, "encode special-token text such as <|start|> as the special id"},
    {"chat-format", true,
     "add this chat format's special tokens where the file lacks them, or none (default: a model directory's "
     "format; harmony, gpt-oss's, for a bare tokenizer file)"},
    {"help", false, "print this help"},
};

int fail(const std::string& message) {
  std::fprintf(stderr, "error: %s\n", message.c_str());
  return 1;
}

// Handles one input line; writes the answer line to *out or returns the error.
Status process_line(const Tokenizer& tok, const std::string& line, bool decode, SpecialTokens specials,
                    std::string* out) {
  const nlohmann::json value = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return invalid_argument("not valid JSON");
  if (!decode) {
    if (!value.is_string()) return invalid_argument("expected a JSON string");
    const std::vector<int32_t> ids = tok.encode(value.get_ref<const std::string&>(), specials);
    out->push_back('[');
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) out->push_back(',');
      out->append(std::to_string(ids[i]));
    }
    out->append("]\n");
    return Status::ok();
  }
  if (!value.is_array()) return invalid_argument("expected a JSON array of token ids");
  std::vector<int32_t> ids;
  ids.reserve(value.size());
  for (const auto& v : value) {
    if (!v.is_number_integer()) return invalid_argument("expected a JSON array of token ids");
    const int64_t id = v.get<int64_t>();
    if (id < 0 || id >= tok.vocab_size()) return invalid_argument("unknown token id " + std::to_string(id));
    ids.push_back(static_cast<int32_t>(id));
  }
  MX_ASSIGN_OR_RETURN(std::string text, tok.decode(ids));
  out->append(nlohmann::json(text).dump());
  out->push_back('\n');
  return Status::ok();
}

// The special tokens --chat-format asks for (see kOptions).
Result<std::vector<SpecialToken>> implied_specials(const CliArgs& args) {
  const std::string path = args.get("tokenizer");
  std::string format = args.get("chat-format");
  if (format == "none") return std::vector<SpecialToken>{};
  if (format.empty()) {
    std::error_code ec;
    const bool model_dir = std::filesystem::is_regular_file(std::filesystem::path(path) / "config.json", ec);
    if (model_dir) {
      MX_ASSIGN_OR_RETURN(format, model_chat_format(path));
    } else {
      format = "harmony";
    }
  }
  return chat_format_special_tokens(format);
}

}  // namespace

int run_tokenize_command(int argc, char** argv) {
  auto args = CliArgs::parse(argc, argv, 2, kOptions);
  if (!args.is_ok()) return fail(args.status().message() + " (see mxserve tokenize --help)");
  if (args->has("help")) {
    std::fputs(cli_usage("tokenize", kOptions).c_str(), stdout);
    return 0;
  }
  if (!args->has("tokenizer")) return fail("--tokenizer PATH is required");
  const bool decode = args->has("decode");
  if (decode && args->has("allow-special")) return fail("--allow-special applies to encoding only");
  auto implied = implied_specials(*args);
  if (!implied.is_ok()) return fail(implied.status().to_string());
  auto tok = Tokenizer::load(args->get("tokenizer"), *implied);
  if (!tok.is_ok()) return fail(tok.status().to_string());
  const SpecialTokens specials = args->has("allow-special") ? SpecialTokens::kAllow : SpecialTokens::kAsText;

  std::ios::sync_with_stdio(false);
  std::string line, out;
  int64_t line_no = 0;
  while (std::getline(std::cin, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const Status st = process_line(**tok, line, decode, specials, &out);
    if (!st.is_ok()) {
      std::fwrite(out.data(), 1, out.size(), stdout);
      std::fflush(stdout);
      return fail("line " + std::to_string(line_no) + ": " + st.message());
    }
    if (out.size() > (1 << 16)) {
      std::fwrite(out.data(), 1, out.size(), stdout);
      out.clear();
    }
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
  return 0;
}

}  // namespace mx
