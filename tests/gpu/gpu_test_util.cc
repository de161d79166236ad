#include "gpu_test_util.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "backend/cpu/thread_pool.h"
#include "core/dtype.h"

namespace mx::gpu_test {

std::vector<Row>& rows() {
  static std::vector<Row> r;
  return r;
}

void record(const std::string& test, const std::string& detail, double rel_l2, double max_abs, double tol, bool pass) {
  rows().push_back({test, detail, rel_l2, max_abs, tol, pass});
}

Errors compare(const std::vector<float>& got, const std::vector<float>& want) {
  Errors e;
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    if (!std::isfinite(got[i])) {
      ++e.non_finite;
      continue;
    }
    const double d = static_cast<double>(got[i]) - want[i];
    diff += d * d;
    norm += static_cast<double>(want[i]) * want[i];
    e.max_abs = std::max(e.max_abs, std::fabs(d));
  }
  if (got.size() != want.size()) e.non_finite += 1;
  e.rel_l2 = std::sqrt(diff / std::max(norm, 1e-30));
  return e;
}

void check(const std::string& test, const std::string& detail, const std::vector<float>& got,
           const std::vector<float>& want, double tol) {
  const Errors e = compare(got, want);
  const bool pass = e.non_finite == 0 && e.rel_l2 <= tol;
  record(test, detail + (e.non_finite ? " NON-FINITE x" + std::to_string(e.non_finite) : ""), e.rel_l2, e.max_abs, tol,
         pass);
  EXPECT_TRUE(pass) << test << " " << detail << ": rel-L2 " << e.rel_l2 << " (tol " << tol << "), max abs " << e.max_abs
                    << ", non-finite " << e.non_finite;
}

Bf16Data random_bf16(std::mt19937& rng, int64_t n, float stddev) {
  std::normal_distribution<float> dist(0.0f, stddev);
  Bf16Data d;
  d.bits.resize(static_cast<size_t>(n));
  d.values.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    d.bits[i] = f32_to_bf16(dist(rng));
    d.values[i] = bf16_to_f32(d.bits[i]);
  }
  return d;
}

namespace {

// The host's cores for the large tables' loops (a pool of their own: the CPU backend's runs the twins).
cpu::ThreadPool& table_pool() {
  static auto* pool = new cpu::ThreadPool();
  return *pool;
}

}  // namespace

std::vector<uint16_t> quick_random_bf16_bits(std::mt19937_64& rng, int64_t n, float stddev) {
  std::vector<uint16_t> bits(static_cast<size_t>(n));
  const float scale = stddev * 1.7320508075688772f;  // each uniform has variance 1/12: sum of 4 -> 1/3
  // Blocks of 2^20 values, each from a generator of its own seeded by one draw of `rng` and the block's index: the
  // values depend on the seed alone, not on how many threads fill the blocks.
  constexpr int64_t kBlock = int64_t{1} << 20;
  const uint64_t seed = rng();
  auto fill = [&](int64_t first, int64_t last) {
    for (int64_t block = first; block < last; ++block) {
      std::mt19937_64 r(seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(block + 1));
      for (int64_t i = block * kBlock, end = std::min(n, i + kBlock); i < end; ++i) {
        const uint64_t v = r();
        const auto sum = static_cast<float>((v & 0xffff) + ((v >> 16) & 0xffff) + ((v >> 32) & 0xffff) + (v >> 48));
        bits[static_cast<size_t>(i)] = f32_to_bf16(((sum + 2.0f) * 0x1.0p-16f - 2.0f) * scale);
      }
    }
  };
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  if (blocks <= 1) fill(0, blocks);
  else table_pool().parallel_for(blocks, 1, fill);
  return bits;
}

Bf16Data quick_random_bf16(std::mt19937& rng, int64_t n, float stddev) {
  std::mt19937_64 wide(rng());
  Bf16Data d{quick_random_bf16_bits(wide, n, stddev), std::vector<float>(static_cast<size_t>(n))};
  table_pool().parallel_for(n, int64_t{1} << 20, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) d.values[static_cast<size_t>(i)] = bf16_to_f32(d.bits[static_cast<size_t>(i)]);
  });
  return d;
}

TensorView Arena::allocate(DType dtype, Shape shape) {
  auto buf = b_.allocate(dtype_bytes(dtype, shape.numel()));
  MX_CHECK(buf.is_ok()) << buf.status().to_string();
  TensorView v = buf->view(dtype, shape);
  buffers_.push_back(std::move(*buf));
  return v;
}

TensorView Arena::make(DType dtype, Shape shape) {
  TensorView v = allocate(dtype, shape);
  std::vector<uint8_t> poison(static_cast<size_t>(v.bytes()), 0xff);
  MX_CHECK_OK(b_.copy_from_host(v, poison.data()));
  return v;
}

TensorView Arena::upload(DType dtype, Shape shape, const void* host) {
  TensorView v = allocate(dtype, shape);  // every byte written: no poison first (1.5 GB of expert tables took it twice)
  MX_CHECK_OK(b_.copy_from_host(v, host));
  return v;
}

std::vector<uint8_t> Arena::download_bytes(const TensorView& t) {
  std::vector<uint8_t> out(static_cast<size_t>(t.bytes()));
  MX_CHECK_OK(b_.copy_to_host(out.data(), t));
  return out;
}

std::vector<float> Arena::download_f32(const TensorView& t) {
  const std::vector<uint8_t> raw = download_bytes(t);
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::kF32) {
    std::memcpy(out.data(), raw.data(), raw.size());
  } else {
    MX_CHECK(t.dtype() == DType::kBF16);
    for (int64_t i = 0; i < t.numel(); ++i) {
      uint16_t b;
      std::memcpy(&b, raw.data() + 2 * i, 2);
      out[i] = bf16_to_f32(b);
    }
  }
  return out;
}

Pair upload_activation(Arena& cpu, Arena& cuda, const Bf16Data& d, Shape shape) {
  return {cpu.upload(DType::kF32, shape, d.values.data()), cuda.upload(DType::kBF16, shape, d.bits.data())};
}

uint32_t test_seed() {
  static const uint32_t seed = [] {
    const char* env = std::getenv("MX_GPU_TEST_SEED");
    const uint32_t s = env && *env ? static_cast<uint32_t>(std::strtoul(env, nullptr, 10)) : std::random_device{}();
    std::printf("[gpu tests] seed %u (replay with MX_GPU_TEST_SEED=%u)\n", s, s);
    return s;
  }();
  return seed;
}

Backend& cuda_backend() {
  static std::unique_ptr<Backend> b = [] {
    auto r = make_backend(BackendOptions{"cuda", 0, 0});
    MX_CHECK(r.is_ok()) << r.status().to_string();
    return std::move(*r);
  }();
  return *b;
}

Backend& cpu_backend() {
  static std::unique_ptr<Backend> b = make_cpu_backend();
  return *b;
}

Status run_eager_or_replayed(Backend& b, bool replay, const std::function<Status()>& op) {
  if (!replay) return op();
  auto graph = b.capture(op);
  if (!graph.is_ok()) return graph.status();
  return (*graph)->replay();
}

namespace {

// Prints the table after all tests and writes it to $MX_GPU_REPORT.
class ReportEnvironment : public ::testing::Environment {
 public:
  void TearDown() override {
    std::string text = "\n=== GPU test table ===\n";
    char line[512];
    std::snprintf(line, sizeof line, "%-4s  %-28s  %-58s  %10s  %10s  %9s\n", "ok", "test", "case", "rel-L2", "max|err|",
                  "tol");
    text += line;
    int failed = 0;
    for (const Row& r : rows()) {
      std::snprintf(line, sizeof line, "%-4s  %-28s  %-58s  %10.3e  %10.3e  %9.2e\n", r.pass ? "PASS" : "FAIL",
                    r.test.c_str(), r.detail.c_str(), r.rel_l2, r.max_abs, r.tol);
      text += line;
      failed += r.pass ? 0 : 1;
    }
    std::snprintf(line, sizeof line, "=== %zu checks, %d failed ===\n", rows().size(), failed);
    text += line;
    std::fputs(text.c_str(), stdout);
    if (const char* path = std::getenv("MX_GPU_REPORT")) {
      std::ofstream out(path);
      out << text;
    }
  }
};

const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new ReportEnvironment);

}  // namespace
}  // namespace mx::gpu_test
