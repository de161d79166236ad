#include "model/load_progress.h"

#include <algorithm>
#include <cstdio>

#include "core/log.h"

namespace mx {

std::string format_gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

LoadProgress::LoadProgress(std::string what, int64_t total_steps, bool enabled)
    : what_(std::move(what)), total_steps_(total_steps), enabled_(enabled), start_(std::chrono::steady_clock::now()),
      last_(start_) {}

void LoadProgress::step(int64_t done, int64_t bytes) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  const bool last = done >= total_steps_;
  if (!last && now - last_ < std::chrono::seconds(2)) return;
  last_ = now;
  const double seconds = std::chrono::duration<double>(now - start_).count();
  char rate[32];
  std::snprintf(rate, sizeof(rate), "%.2f GiB/s", seconds > 0 ? static_cast<double>(bytes) / (1 << 30) / seconds : 0.0);
  char elapsed[32];
  std::snprintf(elapsed, sizeof(elapsed), "%.1f s", seconds);
  std::string parts;
  if (last) {
    std::vector<std::pair<std::string, double>> sums;
    for (const auto& [part, s] : parts_) {
      auto it = std::find_if(sums.begin(), sums.end(), [&](const auto& e) { return e.first == part; });
      if (it == sums.end()) sums.emplace_back(part, s);
      else it->second += s;
    }
    for (const auto& [part, s] : sums) {
      char one[64];
      std::snprintf(one, sizeof(one), "%s%s %.1f s", parts.empty() ? "; " : ", ", part.c_str(), s);
      parts += one;
    }
  }
  MX_LOG(Info) << (last ? "loaded " : "loading ") << what_ << ": " << done << "/" << total_steps_ << " layers, "
               << format_gib(bytes) << " in " << elapsed << " (" << rate << ")" << parts;
}

}  // namespace mx
