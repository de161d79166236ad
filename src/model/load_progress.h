// Start-up progress while weights are copied to the device: a 65 GB checkpoint takes tens of seconds and
// a silent server looks hung. One log line every couple of seconds (and one at the end) with bytes, layers
// and rate; nothing on the CPU backend, which maps the checkpoint instead of copying it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace mx {

class LoadProgress {
 public:
  LoadProgress(std::string what, int64_t total_steps, bool enabled);
  // After step `done` of total_steps; `bytes` copied so far.
  void step(int64_t done, int64_t bytes);

 private:
  std::string what_;
  int64_t total_steps_;
  bool enabled_;
  std::chrono::steady_clock::time_point start_, last_;
};

// "12.3 GiB"
std::string format_gib(int64_t bytes);

}  // namespace mx
