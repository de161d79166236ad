#include "model/synthetic_writer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numbers>

#include <nlohmann/json.hpp>

#include "backend/cpu/thread_pool.h"

namespace mx {
namespace {

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

double unit_uniform(uint64_t bits) { return (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53; }

// A standard normal sample for element i (Box-Muller on two derived uniforms).
float normal(uint64_t key, int64_t i) {
  const uint64_t a = mix(key ^ mix(static_cast<uint64_t>(i) * 2));
  const uint64_t b = mix(key ^ mix(static_cast<uint64_t>(i) * 2 + 1));
  return static_cast<float>(std::sqrt(-2.0 * std::log(unit_uniform(a))) * std::cos(2 * std::numbers::pi * unit_uniform(b)));
}

void fill_chunk(const SyntheticFill& fill, uint64_t key, int64_t begin, int64_t end, uint8_t* out) {
  switch (fill.kind) {
    case SyntheticFill::Kind::kRandomBytes:
      for (int64_t i = begin; i < end; ++i) out[i] = static_cast<uint8_t>(mix(key ^ static_cast<uint64_t>(i)) >> 24);
      return;
    case SyntheticFill::Kind::kConstantByte:
      for (int64_t i = begin; i < end; ++i) out[i] = fill.byte;
      return;
    case SyntheticFill::Kind::kNormal: {
      auto* bf16 = reinterpret_cast<uint16_t*>(out);
      for (int64_t i = begin; i < end; ++i) bf16[i] = f32_to_bf16(fill.mean + fill.stddev * normal(key, i));
      return;
    }
  }
}

// Generates the tensors `indices` of `specs` (in that order) into one safetensors file at `path`.
Status write_shard(const std::vector<WeightSpec>& specs, const std::vector<size_t>& indices,
                   const SyntheticFillRule& rule, const std::string& path, uint64_t seed, cpu::ThreadPool& pool) {
  std::vector<TensorSpec> shard_specs;
  for (size_t i : indices) shard_specs.push_back({specs[i].name, specs[i].dtype, specs[i].shape});
  MX_ASSIGN_OR_RETURN(auto writer, SafetensorsWriter::open(path, shard_specs, {{"format", "pt"}}));
  std::vector<uint8_t> buffer;
  for (size_t i : indices) {
    const WeightSpec& spec = specs[i];
    const int64_t count = spec.shape.numel();
    buffer.resize(static_cast<size_t>(dtype_bytes(spec.dtype, count)));
    const SyntheticFill fill = rule(spec);
    const uint64_t key = mix(seed ^ mix(i + 1));
    pool.parallel_for(count, 1 << 16, [&](int64_t begin, int64_t end) { fill_chunk(fill, key, begin, end, buffer.data()); });
    MX_RETURN_IF_ERROR(writer->write_next(buffer.data(), static_cast<int64_t>(buffer.size())));
  }
  return writer->close();
}

}  // namespace

Status write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return io_error("cannot write " + path);
  return Status::ok();
}

int64_t synthetic_total_bytes(const std::vector<WeightSpec>& specs) {
  int64_t total = 0;
  for (const WeightSpec& s : specs) total += dtype_bytes(s.dtype, s.shape.numel());
  return total;
}

Status write_synthetic_checkpoint(const std::vector<WeightSpec>& specs, const SyntheticFillRule& rule,
                                  const SyntheticConfigFiles& files, const std::string& dir,
                                  const SyntheticOptions& options) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return io_error("cannot create " + dir + ": " + ec.message());
  MX_RETURN_IF_ERROR(write_text_file((fs::path(dir) / "config.json").string(), files.config_json));
  MX_RETURN_IF_ERROR(write_text_file((fs::path(dir) / "generation_config.json").string(), files.generation_config_json));

  // Shards in checkpoint order, each closed once it passes the size cap.
  std::vector<std::vector<size_t>> shards(1);
  int64_t shard_size = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const int64_t bytes = dtype_bytes(specs[i].dtype, specs[i].shape.numel());
    if (shard_size > 0 && shard_size + bytes > options.max_shard_bytes) {
      shards.emplace_back();
      shard_size = 0;
    }
    shards.back().push_back(i);
    shard_size += bytes;
  }

  cpu::ThreadPool pool(options.threads);
  nlohmann::json weight_map = nlohmann::json::object();
  char name[64];
  for (size_t s = 0; s < shards.size(); ++s) {
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    for (size_t i : shards[s]) weight_map[specs[i].name] = name;
    MX_RETURN_IF_ERROR(write_shard(specs, shards[s], rule, (fs::path(dir) / name).string(), options.seed, pool));
  }
  nlohmann::json index = {{"metadata", {{"total_size", synthetic_total_bytes(specs)}}}, {"weight_map", weight_map}};
  return write_text_file((fs::path(dir) / "model.safetensors.index.json").string(), index.dump(2) + "\n");
}

Result<Checkpoint> synthetic_tensors_in_memory(const std::vector<WeightSpec>& specs, const SyntheticFillRule& rule,
                                               const SyntheticOptions& options) {
  // An anonymous in-memory file: one shard, mapped like any checkpoint file once written.
  const int fd = ::memfd_create("mxserve-synthetic-checkpoint", MFD_CLOEXEC);
  if (fd < 0) return io_error(std::string("memfd_create: ") + std::strerror(errno));
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  std::vector<size_t> all(specs.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  cpu::ThreadPool pool(options.threads);
  Status written = write_shard(specs, all, rule, path, options.seed, pool);
  Result<Checkpoint> checkpoint = written.is_ok() ? Checkpoint::open_file(path) : Result<Checkpoint>(written);
  ::close(fd);  // the mapping keeps the memory alive
  return checkpoint;
}

}  // namespace mx
