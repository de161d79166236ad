// Helpers shared by unit tests: temporary directories, file I/O, running the mxserve binary.
#pragma once

#include <string>

namespace mx::test {

// A fresh directory under $TMPDIR, removed (recursively) when the object goes away.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& bytes);
void copy_file(const std::string& from, const std::string& to);

struct CommandResult {
  int exit_code = -1;
  std::string stdout_text;
  std::string stderr_text;
};

// Runs `build/mxserve <args>` (args are passed through the shell as given) and captures both streams.
CommandResult run_mxserve(const std::string& args);

std::string fixture(const std::string& name);

}  // namespace mx::test
