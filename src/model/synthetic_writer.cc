#include "model/synthetic_writer.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

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

// An approximately standard normal sample for element i: the sum of four 16-bit uniforms from one 64-bit hash
// (Irwin-Hall with n = 4), centred and scaled to unit variance; bounded at +-sqrt(12) with kurtosis 2.7 where
// a normal has 3. One hash and no transcendental per element: synthesis of a 50 GB checkpoint is bound by this
// loop, and Box-Muller in double on four hashes per element made Gemma-4 26B's take ~127 s on 16 cores.
float unit_sample(uint64_t key, int64_t i) {
  const uint64_t bits = mix(key + static_cast<uint64_t>(i));
  const auto sum = static_cast<float>((bits & 0xffff) + ((bits >> 16) & 0xffff) + ((bits >> 32) & 0xffff) + (bits >> 48));
  constexpr float kSqrt3 = 1.7320508075688772f;
  return ((sum + 2.0f) * 0x1.0p-16f - 2.0f) * kSqrt3;  // each uniform (k + 1/2) / 2^16: mean 1/2, variance 1/12
}

// The loops below, 8 elements a step in vector registers: the same integer hash and the same float steps in the
// same order as unit_sample (this file is built with -ffp-contract=off: no fused multiply-add), so the bytes are
// the scalar form's on any machine. x86-64 gets an AVX-512 and an AVX2 clone picked at load time (AVX-512's
// 64-bit multiply makes the hash ~4x the scalar loop's rate on one core).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MX_SYNTHETIC_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define MX_SYNTHETIC_CLONES
#endif

using U64x8 = uint64_t __attribute__((vector_size(64)));
using U32x8 = uint32_t __attribute__((vector_size(32)));
using I32x8 = int32_t __attribute__((vector_size(32)));
using F32x8 = float __attribute__((vector_size(32)));
using U16x8 = uint16_t __attribute__((vector_size(16)));
using U8x8 = uint8_t __attribute__((vector_size(8)));

// mix on 8 lanes, in place (a reference: a 64-byte vector passed by value changes the ABI between the clones).
inline void mix8(U64x8& x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
}

constexpr U64x8 kLanes = {0, 1, 2, 3, 4, 5, 6, 7};

MX_SYNTHETIC_CLONES void fill_random_bytes(uint64_t key, int64_t begin, int64_t end, uint8_t* out) {
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    U64x8 x = key ^ (static_cast<uint64_t>(i) + kLanes);
    mix8(x);
    const U8x8 v = __builtin_convertvector(x >> 24, U8x8);
    std::memcpy(out + i, &v, sizeof(v));
  }
  for (; i < end; ++i) out[i] = static_cast<uint8_t>(mix(key ^ static_cast<uint64_t>(i)) >> 24);
}

MX_SYNTHETIC_CLONES void fill_normal_bf16(float mean, float stddev, uint64_t key, int64_t begin, int64_t end,
                                          uint16_t* out) {
  constexpr float kSqrt3 = 1.7320508075688772f;
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    U64x8 bits = key + (static_cast<uint64_t>(i) + kLanes);
    mix8(bits);
    const U64x8 sum = (bits & 0xffff) + ((bits >> 16) & 0xffff) + ((bits >> 32) & 0xffff) + (bits >> 48);
    const F32x8 unit = ((__builtin_convertvector(__builtin_convertvector(sum, I32x8), F32x8) + 2.0f) * 0x1.0p-16f - 2.0f) * kSqrt3;
    const F32x8 value = mean + stddev * unit;
    // f32_to_bf16 without its NaN case: every value is finite (|unit| <= 2 sqrt(3)).
    U32x8 u;
    std::memcpy(&u, &value, sizeof(u));
    u += 0x7fffu + ((u >> 16) & 1u);
    const U16x8 v = __builtin_convertvector(u >> 16, U16x8);
    std::memcpy(out + i, &v, sizeof(v));
  }
  for (; i < end; ++i) out[i] = f32_to_bf16(mean + stddev * unit_sample(key, i));
}

// Elements [begin, end) of one tensor; `out` points at the tensor's first byte.
void fill_chunk(const SyntheticFill& fill, uint64_t key, int64_t begin, int64_t end, uint8_t* out) {
  switch (fill.kind) {
    case SyntheticFill::Kind::kRandomBytes:
      fill_random_bytes(key, begin, end, out);
      return;
    case SyntheticFill::Kind::kConstantByte:
      std::memset(out + begin, fill.byte, static_cast<size_t>(end - begin));
      return;
    case SyntheticFill::Kind::kNormal:
      fill_normal_bf16(fill.mean, fill.stddev, key, begin, end, reinterpret_cast<uint16_t*>(out));
      return;
  }
}

// The unit fill_chunk counts in: elements for kNormal (bf16), bytes otherwise.
int64_t fill_units(const SyntheticFill& fill, const WeightSpec& spec) {
  const int64_t bytes = dtype_bytes(spec.dtype, spec.shape.numel());
  return fill.kind == SyntheticFill::Kind::kNormal ? bytes / 2 : bytes;
}

uint64_t tensor_key(uint64_t seed, size_t index) { return mix(seed ^ mix(index + 1)); }

// Generates the tensors `indices` of `specs` (in that order) into one safetensors file at `path`.
Status write_shard(const std::vector<WeightSpec>& specs, const std::vector<size_t>& indices,
                   const SyntheticFillRule& rule, const std::string& path, uint64_t seed, cpu::ThreadPool& pool) {
  std::vector<TensorSpec> shard_specs;
  for (size_t i : indices) shard_specs.push_back({specs[i].name, specs[i].dtype, specs[i].shape});
  MX_ASSIGN_OR_RETURN(auto writer, SafetensorsWriter::open(path, shard_specs, {{"format", "pt"}}));
  std::vector<uint8_t> buffer;
  for (size_t i : indices) {
    const WeightSpec& spec = specs[i];
    buffer.resize(static_cast<size_t>(dtype_bytes(spec.dtype, spec.shape.numel())));
    const SyntheticFill fill = rule(spec);
    const uint64_t key = tensor_key(seed, i);
    pool.parallel_for(fill_units(fill, spec), 1 << 16,
                      [&](int64_t begin, int64_t end) { fill_chunk(fill, key, begin, end, buffer.data()); });
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
  // One safetensors file's bytes in anonymous memory, made in place (no staging buffer, no copy) by all threads
  // over the whole file at once, so small tensors do not leave threads idle between large ones. Anonymous memory
  // with huge pages rather than a memfd: first-touch faults were most of the synthesis (an H200 host, 16 threads:
  // 4.1 GB/s into a memfd, 14.7 into anonymous 4 KiB pages, 37 with MADV_HUGEPAGE), and the tensors are read
  // where they were written (no second mapping to fault in).
  std::vector<TensorSpec> file_specs;
  for (const WeightSpec& s : specs) file_specs.push_back({s.name, s.dtype, s.shape});
  MX_ASSIGN_OR_RETURN(const std::string header, safetensors_header(file_specs, {{"format", "pt"}}));
  const auto data_offset = static_cast<int64_t>(header.size());
  const int64_t file_bytes = data_offset + synthetic_total_bytes(specs);
  void* map = ::mmap(nullptr, static_cast<size_t>(file_bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (map == MAP_FAILED) return io_error(std::string("mapping the synthetic checkpoint: ") + std::strerror(errno));
  ::madvise(map, static_cast<size_t>(file_bytes), MADV_HUGEPAGE);  // a hint: without huge pages it only runs slower
  std::memcpy(map, header.data(), header.size());

  // Each tensor's fill, key, first byte and its first unit in one flat range over every tensor.
  struct Part {
    SyntheticFill fill;
    uint64_t key;
    uint8_t* data;
    int64_t first_unit;
  };
  std::vector<Part> parts;
  int64_t units = 0, offset = data_offset;
  for (size_t i = 0; i < specs.size(); ++i) {
    const SyntheticFill fill = rule(specs[i]);
    parts.push_back({fill, tensor_key(options.seed, i), static_cast<uint8_t*>(map) + offset, units});
    units += fill_units(fill, specs[i]);
    offset += dtype_bytes(specs[i].dtype, specs[i].shape.numel());
  }
  cpu::ThreadPool pool(options.threads);
  pool.parallel_for(units, 1 << 16, [&](int64_t begin, int64_t end) {
    auto it = std::upper_bound(parts.begin(), parts.end(), begin,
                               [](int64_t u, const Part& part) { return u < part.first_unit; });
    for (size_t t = static_cast<size_t>(it - parts.begin()) - 1; t < parts.size() && parts[t].first_unit < end; ++t) {
      const int64_t last = t + 1 < parts.size() ? parts[t + 1].first_unit : units;
      const int64_t b = std::max(begin, parts[t].first_unit), e = std::min(end, last);
      if (b < e) fill_chunk(parts[t].fill, parts[t].key, b - parts[t].first_unit, e - parts[t].first_unit, parts[t].data);
    }
  });
  ::mprotect(map, static_cast<size_t>(file_bytes), PROT_READ);
  return Checkpoint::from_mapping(
      MappedFile::adopt("synthetic checkpoint (in memory)", static_cast<const uint8_t*>(map), file_bytes));
}

}  // namespace mx
