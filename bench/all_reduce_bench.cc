// Latency of the CUDA communicator's all-reduce per message size, one-shot over peer memory against NCCL, on
// devices 0..N-1 of one process (as tensor parallel runs them): the numbers behind one_shot_default_max_bytes
// (all_reduce_config.cc). For each size, path and group size: every rank captures `calls` all-reduces of one
// bf16 buffer in a graph, the graphs are replayed together (launched from one thread, as the tensor-parallel
// model replays) after a warm-up, and the wall time over `replays` replays divided by the calls is the time
// per all-reduce (NCCL's kernels and ours alike run back to back on each rank's stream).
// The last column says which path the default (one_shot_default_max_bytes) takes at that size.
// Usage: mx_all_reduce_bench [--ranks 2,4] [out.json]   (group sizes past the visible devices are skipped)
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "backend/cuda/all_reduce_config.h"
#include "backend/cuda/nccl_communicator.h"
#include "core/dtype.h"
#include "bench_check.h"

namespace mx {
namespace {

constexpr int kCalls = 64, kWarmup = 5, kReplays = 40;

struct Measured {
  int ranks;
  int64_t bytes;
  std::string path;
  double us;
};

// Microseconds per all-reduce of `bytes` of bf16 over `ranks` devices, with the path forced by one_shot_max_bytes.
double time_all_reduce(const std::vector<Backend*>& raw, int64_t bytes, int64_t one_shot_max_bytes) {
  const int ranks = static_cast<int>(raw.size());
  std::vector<Buffer> buffers;
  std::vector<TensorView> xs;
  for (int r = 0; r < ranks; ++r) {
    CHECK_OK(raw[static_cast<size_t>(r)]->make_current());
    auto buf = raw[static_cast<size_t>(r)]->allocate(bytes);
    CHECK_OK(buf.status());
    std::vector<uint16_t> host(static_cast<size_t>(bytes / 2), f32_to_bf16(1.0f / 1024));
    xs.push_back(buf->view(DType::kBF16, {bytes / 2}));
    CHECK_OK(raw[static_cast<size_t>(r)]->copy_from_host(xs.back(), host.data()));
    buffers.push_back(std::move(buf).value());
  }
  auto comms = make_nccl_communicators(raw, AllReduceOptions{one_shot_max_bytes});
  CHECK_OK(comms.status());
  std::vector<std::unique_ptr<ReplayGraph>> graphs(static_cast<size_t>(ranks));
  std::vector<Status> st(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      const auto i = static_cast<size_t>(r);
      st[i] = raw[i]->make_current();
      // NCCL connects on a group's first collective, which a capture cannot hold: one eager call first.
      if (st[i].is_ok()) st[i] = (*comms)[i]->all_reduce_sum(xs[i]);
      if (st[i].is_ok()) st[i] = raw[i]->synchronize();
      if (!st[i].is_ok()) return;
      auto g = raw[i]->capture([&]() -> Status {
        for (int c = 0; c < kCalls; ++c) MX_RETURN_IF_ERROR((*comms)[i]->all_reduce_sum(xs[i]));
        return Status::ok();
      });
      st[i] = g.status();
      if (g.is_ok()) graphs[i] = std::move(g).value();
    });
  for (auto& t : threads) t.join();
  for (const Status& s : st) CHECK_OK(s);
  auto replay_all = [&](int times) {
    for (int k = 0; k < times; ++k)
      for (int r = 0; r < ranks; ++r) {
        CHECK_OK(raw[static_cast<size_t>(r)]->make_current());
        CHECK_OK(graphs[static_cast<size_t>(r)]->replay());
      }
    for (int r = 0; r < ranks; ++r) {
      CHECK_OK(raw[static_cast<size_t>(r)]->make_current());
      CHECK_OK(raw[static_cast<size_t>(r)]->synchronize());
    }
  };
  replay_all(kWarmup);
  const auto t0 = std::chrono::steady_clock::now();
  replay_all(kReplays);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  graphs.clear();
  return seconds * 1e6 / (kReplays * kCalls);
}

int run(int argc, char** argv) {
  std::vector<int> group_sizes = {2, 4};
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--ranks" && i + 1 < argc) {
      group_sizes.clear();
      std::stringstream ss(argv[++i]);
      for (std::string part; std::getline(ss, part, ',');) group_sizes.push_back(std::stoi(part));
    } else if (!a.empty() && a[0] != '-') {
      json_path = a;
    } else {
      std::fprintf(stderr, "usage: mx_all_reduce_bench [--ranks 2,4] [out.json]\n");
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  cudaDeviceProp prop{};
  if (devices > 0) cudaGetDeviceProperties(&prop, 0);
  std::printf("all-reduce of bf16, %d calls per graph, %d replays; %d x %s\n", kCalls, kReplays, devices, prop.name);
  std::printf("%5s %10s %12s %12s %8s\n", "ranks", "bytes", "one-shot us", "nccl us", "auto");
  std::vector<Measured> rows;
  // One row of 20b (2880 bf16), 8 and 64 rows, and powers of two around the crossover up to the slot.
  const std::vector<int64_t> sizes = {5760, 46080, 65536, 131072, 184320, 262144, 368640, cuda::kOneShotSlotBytes};
  for (int ranks : group_sizes) {
    if (ranks > devices) {
      std::printf("%5d skipped: %d devices visible\n", ranks, devices);
      continue;
    }
    std::vector<std::unique_ptr<Backend>> backends;
    std::vector<Backend*> raw;
    for (int r = 0; r < ranks; ++r) {
      auto b = make_backend(BackendOptions{"cuda", 0, r});
      CHECK_OK(b.status());
      raw.push_back(b->get());
      backends.push_back(std::move(b).value());
    }
    for (int64_t bytes : sizes) {
      const double one_shot = time_all_reduce(raw, bytes, cuda::kOneShotSlotBytes);
      const double nccl = time_all_reduce(raw, bytes, 0);
      std::printf("%5d %10lld %12.2f %12.2f %8s\n", ranks, static_cast<long long>(bytes), one_shot, nccl,
                  cuda::use_one_shot_all_reduce(bytes, ranks, true, cuda::kOneShotAutoMaxBytes) ? "one-shot" : "nccl");
      std::fflush(stdout);
      rows.push_back({ranks, bytes, "one-shot", one_shot});
      rows.push_back({ranks, bytes, "nccl", nccl});
    }
  }
  if (!json_path.empty()) {
    nlohmann::json j;
    j["gpu"] = prop.name;
    j["devices"] = devices;
    j["calls_per_graph"] = kCalls;
    j["replays"] = kReplays;
    for (const Measured& m : rows)
      j["rows"].push_back({{"ranks", m.ranks}, {"bytes", m.bytes}, {"path", m.path}, {"us", m.us}});
    std::ofstream(json_path) << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace mx

int main(int argc, char** argv) { return mx::run(argc, argv); }
