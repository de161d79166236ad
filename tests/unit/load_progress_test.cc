// Weight-loading progress: a line with layers, bytes and rate at the end (and at most every 2 s before),
// nothing when disabled (the CPU backend maps the checkpoint instead of copying it).
#include <gtest/gtest.h>

#include "core/log.h"
#include "model/load_progress.h"

namespace mx {
namespace {

TEST(LoadProgress, LogsTheFinalLineWithBytesAndRate) {
  set_log_level(LogLevel::kInfo);
  testing::internal::CaptureStderr();
  LoadProgress progress("weights to gpu", 3, true);
  progress.step(1, 1 << 20);  // under 2 s since the start: no line yet
  progress.step(3, int64_t{3} << 30);
  LoadProgress quiet("weights", 2, false);
  quiet.step(2, 1 << 30);
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("loaded weights to gpu: 3/3 layers, 3.00 GiB in "), std::string::npos) << log;
  EXPECT_NE(log.find("GiB/s)"), std::string::npos) << log;
  EXPECT_EQ(log.find("loading "), std::string::npos) << log;
  EXPECT_EQ(log.find("weights: 2/2"), std::string::npos) << log;
  EXPECT_EQ(format_gib(int64_t{3} << 29), "1.50 GiB");
}

}  // namespace
}  // namespace mx
