// A read-only memory mapping of a whole file (RAII). Checkpoint tensors are views into it, so the
// mapping must outlive every TensorView taken from it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"

namespace mx {

class MappedFile {
 public:
  static Result<std::unique_ptr<MappedFile>> open(const std::string& path);
  // A mapping made elsewhere (mmap of `size` bytes at `data`; `name` for messages), unmapped by this object.
  static std::unique_ptr<MappedFile> adopt(std::string name, const uint8_t* data, int64_t size);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, int64_t size) : path_(std::move(path)), data_(data), size_(size) {}

  std::string path_;
  const uint8_t* data_;
  int64_t size_;
};

// Reads a whole (small) file into a string: config files, index files.
Result<std::string> read_text_file(const std::string& path);

}  // namespace mx
