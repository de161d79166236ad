#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

namespace mx {
namespace {

using nlohmann::json;

// A header this large is not a real checkpoint; refusing it bounds the JSON parser's memory.
constexpr uint64_t kMaxHeaderBytes = 256ull << 20;

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Parses one header entry into `info`, checking everything that can be checked without the file size.
Status parse_tensor_entry(const std::string& name, const json& entry, int64_t data_size, TensorInfo* info) {
  if (!entry.is_object()) return invalid_argument("tensor '" + name + "': header entry is not an object");
  auto dtype_it = entry.find("dtype");
  auto shape_it = entry.find("shape");
  auto offsets_it = entry.find("data_offsets");
  if (dtype_it == entry.end() || !dtype_it->is_string())
    return invalid_argument("tensor '" + name + "': missing or non-string dtype");
  if (shape_it == entry.end() || !shape_it->is_array())
    return invalid_argument("tensor '" + name + "': missing or non-array shape");
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2)
    return invalid_argument("tensor '" + name + "': data_offsets must be [begin, end]");
  const std::string dtype_name = dtype_it->get<std::string>();
  if (!dtype_from_safetensors(dtype_name, &info->dtype))
    return invalid_argument("tensor '" + name + "': unknown dtype '" + dtype_name + "'");
  if (shape_it->size() > static_cast<size_t>(kMaxDims))
    return invalid_argument("tensor '" + name + "': rank " + std::to_string(shape_it->size()) + " is too large");
  info->shape = Shape();
  int64_t numel = 1;
  for (const auto& d : *shape_it) {
    if (!d.is_number_unsigned()) return invalid_argument("tensor '" + name + "': shape entries must be integers >= 0");
    const uint64_t v = d.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max() / 8) ||
        (v != 0 && numel > std::numeric_limits<int64_t>::max() / 8 / static_cast<int64_t>(v)))
      return invalid_argument("tensor '" + name + "': shape " + shape_it->dump() + " is too large");
    numel *= static_cast<int64_t>(v);
    info->shape.dims[info->shape.rank++] = static_cast<int64_t>(v);
  }
  for (const auto& o : *offsets_it)
    if (!o.is_number_unsigned()) return invalid_argument("tensor '" + name + "': data_offsets must be integers >= 0");
  const uint64_t begin = (*offsets_it)[0].get<uint64_t>();
  const uint64_t end = (*offsets_it)[1].get<uint64_t>();
  if (begin > end) return invalid_argument("tensor '" + name + "': data_offsets begin > end");
  if (end > static_cast<uint64_t>(data_size))
    return out_of_range("tensor '" + name + "': data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                        ") run past the end of the data (" + std::to_string(data_size) + " bytes)");
  info->begin = static_cast<int64_t>(begin);
  info->end = static_cast<int64_t>(end);
  const int64_t expected = dtype_bytes(info->dtype, numel);
  if (info->end - info->begin != expected)
    return invalid_argument("tensor '" + name + "': shape " + info->shape.to_string() + " of " + dtype_name + " needs " +
                            std::to_string(expected) + " bytes but data_offsets cover " +
                            std::to_string(info->end - info->begin));
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  MX_ASSIGN_OR_RETURN(auto file, MappedFile::open(path));
  return open(std::move(file));
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(std::unique_ptr<MappedFile> mapped) {
  auto result = std::make_unique<SafetensorsFile>();
  result->file_ = std::move(mapped);
  const MappedFile& file = *result->file_;
  const std::string& path = file.path();
  auto fail = [&](const Status& s) { return s.with_context(path); };
  if (file.size() < 8) return fail(invalid_argument("file is truncated: " + std::to_string(file.size()) + " bytes, no header"));
  const uint64_t header_len = read_u64_le(file.data());
  if (header_len > static_cast<uint64_t>(file.size() - 8))
    return fail(out_of_range("header length " + std::to_string(header_len) + " runs past the end of the file (" +
                             std::to_string(file.size()) + " bytes)"));
  if (header_len > kMaxHeaderBytes) return fail(invalid_argument("header length " + std::to_string(header_len) + " is too large"));
  const char* header_begin = reinterpret_cast<const char*>(file.data() + 8);
  json header = json::parse(header_begin, header_begin + header_len, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) return fail(invalid_argument("header is not valid JSON"));
  if (!header.is_object()) return fail(invalid_argument("header is not a JSON object"));
  const int64_t data_size = file.size() - 8 - static_cast<int64_t>(header_len);

  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return fail(invalid_argument("__metadata__ is not an object"));
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) return fail(invalid_argument("__metadata__ value '" + m.key() + "' is not a string"));
        result->metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    TensorInfo info;
    MX_RETURN_IF_ERROR(fail(parse_tensor_entry(it.key(), *it, data_size, &info)));
    info.begin += 8 + static_cast<int64_t>(header_len);
    info.end += 8 + static_cast<int64_t>(header_len);
    result->tensors_.emplace(it.key(), info);
  }

  // Ranges must not overlap (empty tensors occupy no bytes and cannot overlap anything).
  std::vector<std::pair<const std::string*, const TensorInfo*>> by_offset;
  for (const auto& [name, info] : result->tensors_)
    if (info.end > info.begin) by_offset.emplace_back(&name, &info);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto& a, const auto& b) { return a.second->begin < b.second->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i].second->begin < by_offset[i - 1].second->end)
      return fail(invalid_argument("tensors '" + *by_offset[i - 1].first + "' and '" + *by_offset[i].first +
                                   "' have overlapping byte ranges"));
  }
  return result;
}

TensorView SafetensorsFile::view(const std::string& name) const {
  const TensorInfo& info = tensors_.at(name);
  return TensorView(const_cast<uint8_t*>(file_->data() + info.begin), info.dtype, info.shape, Device::kCpu);
}

Status Checkpoint::add_file(const std::string& path, const std::vector<std::string>* expected_names) {
  MX_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(path));
  return add(std::move(file), expected_names);
}

Status Checkpoint::add(std::unique_ptr<SafetensorsFile> file, const std::vector<std::string>* expected_names) {
  const std::string& path = file->path();
  const int index = static_cast<int>(files_.size());
  for (const auto& [name, info] : file->tensors()) {
    (void)info;
    if (where_.count(name))
      return invalid_argument("tensor '" + name + "' appears in more than one file (" + path + ")");
    where_[name] = index;
  }
  if (expected_names) {
    for (const auto& name : *expected_names)
      if (!file->tensors().count(name))
        return not_found("tensor '" + name + "' is listed in the index for " + path + " but the file does not hold it");
  }
  files_.push_back(std::move(file));
  return Status::ok();
}

Result<Checkpoint> Checkpoint::open_file(const std::string& path) {
  Checkpoint ckpt;
  MX_RETURN_IF_ERROR(ckpt.add_file(path, nullptr));
  return ckpt;
}

Result<Checkpoint> Checkpoint::from_mapping(std::unique_ptr<MappedFile> mapped) {
  MX_ASSIGN_OR_RETURN(auto file, SafetensorsFile::open(std::move(mapped)));
  Checkpoint ckpt;
  MX_RETURN_IF_ERROR(ckpt.add(std::move(file), nullptr));
  return ckpt;
}

Result<Checkpoint> Checkpoint::open_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return not_found("model directory " + dir + " does not exist");
  Checkpoint ckpt;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index_path, ec)) {
    MX_ASSIGN_OR_RETURN(std::string text, read_text_file(index_path.string()));
    json index = json::parse(text, nullptr, false);
    if (index.is_discarded() || !index.is_object()) return invalid_argument(index_path.string() + ": not valid JSON");
    auto map_it = index.find("weight_map");
    if (map_it == index.end() || !map_it->is_object())
      return invalid_argument(index_path.string() + ": missing weight_map object");
    std::map<std::string, std::vector<std::string>> names_by_file;
    for (auto it = map_it->begin(); it != map_it->end(); ++it) {
      if (!it->is_string()) return invalid_argument(index_path.string() + ": weight_map value for '" + it.key() + "' is not a string");
      const std::string shard = it->get<std::string>();
      if (shard.find('/') != std::string::npos || shard == "..")
        return invalid_argument(index_path.string() + ": shard name '" + shard + "' must be a file in the model directory");
      names_by_file[shard].push_back(it.key());
    }
    for (const auto& [shard, names] : names_by_file)
      MX_RETURN_IF_ERROR(ckpt.add_file((fs::path(dir) / shard).string(), &names));
    return ckpt;
  }
  const fs::path single = fs::path(dir) / "model.safetensors";
  if (fs::exists(single, ec)) {
    MX_RETURN_IF_ERROR(ckpt.add_file(single.string(), nullptr));
    return ckpt;
  }
  std::vector<std::string> shards;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.path().extension() == ".safetensors") shards.push_back(entry.path().string());
  if (shards.empty()) return not_found("no .safetensors files in " + dir);
  std::sort(shards.begin(), shards.end());
  for (const auto& path : shards) MX_RETURN_IF_ERROR(ckpt.add_file(path, nullptr));
  return ckpt;
}

Result<TensorView> Checkpoint::get(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) return not_found("tensor '" + name + "' is missing from the checkpoint");
  return files_[it->second]->view(name);
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, index] : where_) {
    (void)index;
    out.push_back(name);
  }
  return out;
}

int64_t Checkpoint::total_bytes() const {
  int64_t total = 0;
  for (const auto& f : files_)
    for (const auto& [name, info] : f->tensors()) {
      (void)name;
      total += info.end - info.begin;
    }
  return total;
}

Result<std::string> safetensors_header(const std::vector<TensorSpec>& specs,
                                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t offset = 0;
  std::set<std::string> seen;
  for (const auto& t : specs) {
    if (!seen.insert(t.name).second) return invalid_argument("duplicate tensor name '" + t.name + "'");
    const char* dtype = dtype_to_safetensors(t.dtype);
    if (!dtype) return invalid_argument(std::string("dtype ") + dtype_name(t.dtype) + " has no safetensors name");
    json shape = json::array();
    for (int i = 0; i < t.shape.rank; ++i) shape.push_back(t.shape.dims[i]);
    const int64_t bytes = dtype_bytes(t.dtype, t.shape.numel());
    header[t.name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string header_text = header.dump();
  header_text.resize((header_text.size() + 7) / 8 * 8, ' ');  // keep tensor data 8-byte aligned
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(static_cast<uint64_t>(header_text.size()) >> (8 * i));
  return out + header_text;
}

Result<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::open(const std::string& path,
                                                                   const std::vector<TensorSpec>& specs,
                                                                   const std::map<std::string, std::string>& metadata) {
  MX_ASSIGN_OR_RETURN(const std::string header, safetensors_header(specs, metadata));
  std::unique_ptr<SafetensorsWriter> writer(new SafetensorsWriter());
  for (const auto& t : specs) writer->sizes_.push_back(dtype_bytes(t.dtype, t.shape.numel()));
  writer->path_ = path;
  writer->file_ = std::fopen(path.c_str(), "wb");
  if (!writer->file_) return io_error("cannot create " + path + ": " + std::strerror(errno));
  if (std::fwrite(header.data(), 1, header.size(), writer->file_) != header.size()) return io_error("cannot write " + path);
  return writer;
}

SafetensorsWriter::~SafetensorsWriter() {
  if (file_) std::fclose(file_);
}

Status SafetensorsWriter::write_next(const void* data, int64_t bytes) {
  if (!file_ || next_ >= sizes_.size()) return internal_error(path_ + ": no tensor left to write");
  if (bytes != sizes_[next_])
    return internal_error(path_ + ": tensor " + std::to_string(next_) + " has " + std::to_string(bytes) +
                          " bytes, expected " + std::to_string(sizes_[next_]));
  if (std::fwrite(data, 1, static_cast<size_t>(bytes), file_) != static_cast<size_t>(bytes))
    return io_error("cannot write " + path_ + ": " + std::strerror(errno));
  ++next_;
  return Status::ok();
}

Status SafetensorsWriter::close() {
  if (!file_) return internal_error(path_ + ": already closed");
  const bool complete = next_ == sizes_.size();
  const bool flushed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!complete) return internal_error(path_ + ": closed after " + std::to_string(next_) + " of " +
                                       std::to_string(sizes_.size()) + " tensors");
  if (!flushed) return io_error("cannot write " + path_);
  return Status::ok();
}

Status write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  for (const auto& t : tensors) specs.push_back({t.name, t.view.dtype(), t.view.shape()});
  MX_ASSIGN_OR_RETURN(auto writer, SafetensorsWriter::open(path, specs, metadata));
  for (const auto& t : tensors) MX_RETURN_IF_ERROR(writer->write_next(t.view.data(), t.view.bytes()));
  return writer->close();
}

}  // namespace mx
