// Safetensors reading (mmap, one file or shards through model.safetensors.index.json) and writing.
// Headers are validated before any tensor is exposed: length, JSON, dtype names, shapes against byte
// ranges, ranges inside the file and not overlapping. Every error names the file and the tensor.
#pragma once

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor_view.h"
#include "io/mapped_file.h"

namespace mx {

struct TensorInfo {
  DType dtype = DType::kF32;
  Shape shape;
  int64_t begin = 0;  // byte offset of the data inside the file (after the header)
  int64_t end = 0;
};

// One .safetensors file.
class SafetensorsFile {
 public:
  static Result<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  // The same over a file's bytes already mapped (a synthetic checkpoint made in memory).
  static Result<std::unique_ptr<SafetensorsFile>> open(std::unique_ptr<MappedFile> file);

  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return file_->path(); }
  // A read-only host view of a tensor; the caller checked that `name` exists.
  TensorView view(const std::string& name) const;

 private:
  std::unique_ptr<MappedFile> file_;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a checkpoint directory: model.safetensors.index.json when present, else the single
// model.safetensors, else every *.safetensors file in the directory.
class Checkpoint {
 public:
  static Result<Checkpoint> open_dir(const std::string& dir);
  // One file; used by tests and tools.
  static Result<Checkpoint> open_file(const std::string& path);
  // One safetensors file's bytes in memory (model/synthetic_writer.h's in-memory checkpoints).
  static Result<Checkpoint> from_mapping(std::unique_ptr<MappedFile> file);

  bool has(const std::string& name) const { return where_.count(name) != 0; }
  Result<TensorView> get(const std::string& name) const;
  std::vector<std::string> names() const;
  int64_t total_bytes() const;

 private:
  Status add_file(const std::string& path, const std::vector<std::string>* expected_names);
  Status add(std::unique_ptr<SafetensorsFile> file, const std::vector<std::string>* expected_names);

  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, int> where_;  // tensor name -> index into files_
};

struct NamedTensor {
  std::string name;
  TensorView view;  // host memory
};

struct TensorSpec {
  std::string name;
  DType dtype;
  Shape shape;
};

// A safetensors file's first bytes for `specs` in order: the 8-byte length, then the JSON header padded with
// spaces to a multiple of 8 (tensor data stays 8-byte aligned). Fails on duplicate names.
Result<std::string> safetensors_header(const std::vector<TensorSpec>& specs,
                                       const std::map<std::string, std::string>& metadata = {});

// Streams a safetensors file whose tensor list is known up front: the header is written at open, then
// each tensor's bytes in order. Lets multi-gigabyte checkpoints be written without holding them in memory.
class SafetensorsWriter {
 public:
  static Result<std::unique_ptr<SafetensorsWriter>> open(const std::string& path, const std::vector<TensorSpec>& specs,
                                                         const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  // Appends the next tensor's bytes; `bytes` must equal that tensor's size.
  Status write_next(const void* data, int64_t bytes);
  // Checks every tensor was written and flushes.
  Status close();

 private:
  SafetensorsWriter() = default;
  std::string path_;
  std::FILE* file_ = nullptr;
  std::vector<int64_t> sizes_;
  size_t next_ = 0;
};

// Writes tensors (in the order given) with optional string metadata. Fails on duplicate names.
Status write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace mx
