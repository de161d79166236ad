#include "model/demo_model.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/log.h"
#include "tokenizer/embedded_o200k.h"

namespace mx {

namespace fs = std::filesystem;

Status write_demo_model(const std::string& dir, const SyntheticOptions& options) {
  MX_RETURN_IF_ERROR(write_synthetic_model("demo", dir, options));
  MX_ASSIGN_OR_RETURN(std::string_view ranks, embedded_o200k_tiktoken());
  const fs::path path = fs::path(dir) / kO200kTiktokenFileName;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(ranks.data(), static_cast<std::streamsize>(ranks.size()));
  out.close();
  if (!out) return io_error("cannot write " + path.string());
  return Status::ok();
}

Result<std::string> default_demo_model_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && xdg[0] == '/') return (fs::path(xdg) / "mxserve" / kDemoModelName).string();
  const char* home = std::getenv("HOME");
  if (home && home[0] != '\0') return (fs::path(home) / ".cache" / "mxserve" / kDemoModelName).string();
  return invalid_argument("neither XDG_CACHE_HOME nor HOME is set: give --model DIR");
}

namespace {

// A writer killed mid-write (SIGKILL, a crash, a lost machine) leaves its `NAME.tmp-PID-RANDOM` folder
// (~110 MB) behind: remove those whose process is gone. Folders of live writers are left alone.
void remove_abandoned_temp_dirs(const fs::path& target) {
  std::error_code ec;
  const std::string prefix = target.filename().string() + ".tmp-";
  for (const auto& entry : fs::directory_iterator(target.parent_path(), ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string rest = name.substr(prefix.size());
    char* end = nullptr;
    const long pid = std::strtol(rest.c_str(), &end, 10);
    if (end == rest.c_str() || *end != '-' || pid <= 0) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // still running (or not ours to judge)
    std::error_code remove_ec;
    fs::remove_all(entry.path(), remove_ec);
    if (!remove_ec) {
      MX_LOG(Info) << "removed " << entry.path().string() << ", left by a writer that did not finish";
    }
  }
}

}  // namespace

Result<std::string> ensure_demo_model(const std::string& dir) {
  std::error_code ec;
  remove_abandoned_temp_dirs(fs::path(dir));
  if (fs::is_directory(dir, ec)) return dir;  // only ever created complete (by the rename below)
  const fs::path target(dir);
  fs::create_directories(target.parent_path(), ec);
  if (ec) return io_error("cannot create " + target.parent_path().string() + ": " + ec.message());
  std::random_device random;
  const fs::path temp = target.parent_path() / (target.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
                                                std::to_string(random()));
  MX_LOG(Info) << "writing the demo model to " << dir << " (first use; about 110 MB)";
  Status written = write_demo_model(temp.string());
  if (written.is_ok()) {
    fs::rename(temp, target, ec);
    // Another process may have finished first: its model is as good as ours.
    if (ec && fs::is_directory(target)) ec.clear();
    if (ec) written = io_error("cannot rename " + temp.string() + " to " + dir + ": " + ec.message());
  }
  fs::remove_all(temp, ec);
  MX_RETURN_IF_ERROR(written);
  return dir;
}

}  // namespace mx
