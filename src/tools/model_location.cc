#include "tools/model_location.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace mx {
namespace fs = std::filesystem;

namespace {

bool has_config(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / "config.json", ec);
}

fs::path hf_hub_dir() {
  if (const char* hub = std::getenv("HF_HUB_CACHE"); hub && *hub) return hub;
  if (const char* home = std::getenv("HF_HOME"); home && *home) return fs::path(home) / "hub";
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return fs::path(xdg) / "huggingface" / "hub";
  const char* user_home = std::getenv("HOME");
  return fs::path(user_home ? user_home : ".") / ".cache" / "huggingface" / "hub";
}

// ORG/NAME with the characters Hugging Face allows in ids.
bool looks_like_hf_id(const std::string& s) {
  const size_t slash = s.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == s.size() || s.find('/', slash + 1) != std::string::npos)
    return false;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                    c == '_' || c == '.' || c == '/';
    if (!ok) return false;
  }
  return s.find("..") == std::string::npos;
}

// The snapshot refs/main names, else the only snapshot holding a config.json.
Result<fs::path> cached_snapshot(const fs::path& repo, const std::string& id) {
  std::ifstream ref(repo / "refs" / "main");
  std::string revision;
  if (ref && std::getline(ref, revision) && !revision.empty() && has_config(repo / "snapshots" / revision))
    return repo / "snapshots" / revision;
  std::error_code ec;
  fs::path found;
  int count = 0;
  for (const auto& entry : fs::directory_iterator(repo / "snapshots", ec)) {
    if (entry.is_directory() && has_config(entry.path())) found = entry.path(), ++count;
  }
  if (count == 1) return found;
  if (count > 1) {
    return invalid_argument("model '" + id + "': several snapshots in " + (repo / "snapshots").string() +
                            " and no refs/main naming one; pass the snapshot directory itself");
  }
  return not_found("model '" + id + "' is in the Hugging Face cache (" + repo.string() +
                   ") but no snapshot there holds a config.json");
}

}  // namespace

Result<ModelLocation> resolve_model_location(const std::string& model) {
  std::string dir = model;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  std::error_code ec;
  if (fs::is_directory(dir, ec)) {
    if (!has_config(dir)) return invalid_argument("--model " + model + ": no config.json there");
    return ModelLocation{dir, fs::path(dir).filename().string()};
  }
  if (!looks_like_hf_id(model)) return invalid_argument("--model " + model + ": no such directory");
  std::string folder = "models--" + model;
  folder.replace(folder.find('/'), 1, "--");
  const fs::path repo = hf_hub_dir() / folder;
  if (!fs::is_directory(repo, ec)) {
    return not_found("--model " + model + ": not a directory, and not in the Hugging Face cache (" + repo.string() +
                     "); mxserve does not download. Get it with: huggingface-cli download " + model +
                     " --exclude 'original/*'");
  }
  MX_ASSIGN_OR_RETURN(fs::path snapshot, cached_snapshot(repo, model));
  return ModelLocation{snapshot.string(), model};
}

}  // namespace mx
