// The demo model's first write is crash-safe: it is built in a temp folder and renamed into place, and the
// temp folders of writers that died mid-write (SIGKILL) are removed on the next start; a live writer's
// folder is left alone.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "model/demo_model.h"
#include "test_util.h"

namespace mx {
namespace {

namespace fs = std::filesystem;

TEST(DemoModel, AbandonedTempFoldersAreRemovedLiveOnesKept) {
  test::TempDir cache;
  const fs::path target = fs::path(cache.path()) / "demo-x";
  fs::create_directories(target);  // the model itself is there already: nothing is written
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  waitpid(dead, nullptr, 0);  // reaped: its pid names no process now
  const fs::path abandoned = fs::path(cache.path()) / ("demo-x.tmp-" + std::to_string(dead) + "-123");
  const fs::path live = fs::path(cache.path()) / ("demo-x.tmp-" + std::to_string(getpid()) + "-456");
  const fs::path unrelated = fs::path(cache.path()) / "demo-y.tmp-1-1";
  for (const auto& d : {abandoned, live, unrelated}) {
    fs::create_directories(d);
    std::ofstream(d / "model.safetensors") << "partial";
  }
  auto dir = ensure_demo_model(target.string());
  ASSERT_TRUE(dir.is_ok()) << dir.status().message();
  EXPECT_FALSE(fs::exists(abandoned));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(unrelated));
}

}  // namespace
}  // namespace mx
