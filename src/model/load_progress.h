// Start-up progress while weights are copied to the device: a 65 GB checkpoint takes tens of seconds and
// a silent server looks hung. One log line every couple of seconds (and one at the end) with bytes, layers
// and rate; nothing on the CPU backend, which maps the checkpoint instead of copying it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mx {

class LoadProgress {
 public:
  LoadProgress(std::string what, int64_t total_steps, bool enabled);
  // After step `done` of total_steps; `bytes` copied so far. The last step's line also names the seconds of each
  // part timed().
  void step(int64_t done, int64_t bytes);
  // f() (a Status or Result), its seconds added to `part` (e.g. "dense" or "experts": where a big model's load goes).
  template <typename F>
  auto timed(const std::string& part, F&& f) {
    const auto t = std::chrono::steady_clock::now();
    auto r = f();
    parts_.emplace_back(part, std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count());
    return r;
  }

 private:
  std::string what_;
  int64_t total_steps_;
  bool enabled_;
  std::chrono::steady_clock::time_point start_, last_;
  std::vector<std::pair<std::string, double>> parts_;  // in call order; summed per part at the last step
};

// "12.3 GiB"
std::string format_gib(int64_t bytes);

}  // namespace mx
