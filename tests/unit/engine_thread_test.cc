// The threaded Engine: requests from several threads at once give each prompt's greedy tokens; aborts
// from other threads at random moments leave no used page and nothing running; a dropped stream aborts its
// request; shutdown ends every live request with kAbort; the queue limit refuses with resource_exhausted.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "engine_test_util.h"
#include "runtime/engine.h"

namespace mx {
namespace {

using namespace std::chrono_literals;
using test::fixture_model;
using test::greedy_request;

RequestOutput read_all(RequestStream& stream) {
  RequestOutput all, delta;
  while (!all.finished())
    if (stream.wait(&delta, 50ms)) all.merge(std::move(delta));
  return all;
}

// Waits (up to 60 s: only a hang guard, as eventually()'s) for the engine thread's stats snapshot to show an idle
// engine.
EngineStats wait_idle(const Engine& engine) {
  EngineStats s;
  for (int i = 0; i < 6000; ++i) {
    s = engine.stats();
    if (s.num_running == 0 && s.num_waiting == 0 && engine.num_live() == 0) break;
    std::this_thread::sleep_for(10ms);
  }
  return s;
}

TEST(EngineThread, ConcurrentSubmittersGetTheGreedyTokens) {
  const auto& fx = fixture_model("tiny-gpt-oss");
  EngineConfig config;
  config.page_size = 4;
  config.max_num_batched_tokens = 16;
  auto engine = Engine::start(*fx.model, config);
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  std::atomic<int> mismatches{0}, notified{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      for (size_t k = 0; k < fx.prompts.size(); ++k) {
        const size_t i = (k + static_cast<size_t>(t)) % fx.prompts.size();
        auto stream = (*engine)->add_request(greedy_request(fx.prompts[i], static_cast<int64_t>(fx.greedy[i].size())));
        if (!stream.is_ok()) {
          ++mismatches;
          continue;
        }
        (*stream)->set_notify([&] { ++notified; });
        if (read_all(**stream).token_ids != fx.greedy[i]) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_GT(notified.load(), 0);
  const EngineStats s = wait_idle(**engine);
  EXPECT_EQ(s.pages_used, 0);
}

TEST(EngineThread, AbortsFromOtherThreadsFreeEverything) {
  const auto& fx = fixture_model("tiny-gpt-oss-b");
  EngineConfig config;
  config.page_size = 4;
  config.num_kv_pages = 32;
  config.max_num_batched_tokens = 24;
  config.max_running_requests = 8;
  auto engine = Engine::start(*fx.model, config);
  ASSERT_TRUE(engine.is_ok());
  std::atomic<int> aborted{0}, completed{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(77 + t));
      for (int k = 0; k < 100; ++k) {
        const auto& p = fx.prompts[rng() % fx.prompts.size()];
        auto stream = (*engine)->add_request(greedy_request(p, 1 + rng() % 16));
        if (!stream.is_ok()) {
          ++errors;
          continue;
        }
        if (rng() % 4 != 0) {
          std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
          (*engine)->abort((*stream)->id());
        }
        const RequestOutput out = read_all(**stream);
        if (out.finish == FinishReason::kAbort) ++aborted;
        else if (out.finish == FinishReason::kLength) ++completed;
        else ++errors;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(aborted.load() + completed.load(), 200);
  EXPECT_GT(aborted.load(), 0);
  const EngineStats s = wait_idle(**engine);
  EXPECT_EQ(s.pages_used, 0);
  EXPECT_EQ(s.num_running, 0);
  EXPECT_EQ(s.num_waiting, 0);
  EXPECT_EQ(s.scheduler.aborted, aborted.load());
}

TEST(EngineThread, DroppedStreamAbortsItsRequest) {
  const auto& fx = fixture_model("tiny-gpt-oss");
  auto engine = Engine::start(*fx.model, EngineConfig{});
  ASSERT_TRUE(engine.is_ok());
  {
    auto stream = (*engine)->add_request(greedy_request(fx.prompts[0], 5000));
    ASSERT_TRUE(stream.is_ok());
    RequestOutput out;
    while (!(*stream)->wait(&out, 50ms)) {
    }  // running
  }  // the reader goes away
  const EngineStats s = wait_idle(**engine);
  EXPECT_EQ((*engine)->num_live(), 0);
  EXPECT_EQ(s.scheduler.aborted, 1);
  EXPECT_EQ(s.pages_used, 0);
}

TEST(EngineThread, ShutdownAbortsLiveRequestsAndRefusesNewOnes) {
  const auto& fx = fixture_model("tiny-gpt-oss");
  EngineConfig config;
  config.max_running_requests = 2;
  auto engine = Engine::start(*fx.model, config);
  ASSERT_TRUE(engine.is_ok());
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 4; ++i) {
    auto s = (*engine)->add_request(greedy_request(fx.prompts[1], 5000));
    ASSERT_TRUE(s.is_ok());
    streams.push_back(*s);
  }
  (*engine)->shutdown();
  for (auto& s : streams) EXPECT_EQ(read_all(*s).finish, FinishReason::kAbort);
  EXPECT_EQ((*engine)->num_live(), 0);
  EXPECT_FALSE((*engine)->add_request(greedy_request(fx.prompts[1], 4)).is_ok());
}

TEST(EngineThread, QueueLimitRefusesWithResourceExhausted) {
  const auto& fx = fixture_model("tiny-gpt-oss");
  EngineConfig config;
  config.max_running_requests = 1;
  config.max_queued_requests = 1;
  auto engine = Engine::start(*fx.model, config);
  ASSERT_TRUE(engine.is_ok());
  auto a = (*engine)->add_request(greedy_request(fx.prompts[1], 5000));
  auto b = (*engine)->add_request(greedy_request(fx.prompts[1], 5000));
  auto c = (*engine)->add_request(greedy_request(fx.prompts[1], 5000));
  ASSERT_TRUE(a.is_ok());
  ASSERT_TRUE(b.is_ok());
  ASSERT_FALSE(c.is_ok());
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  // Bad input is the caller's error, checked before admission.
  EXPECT_EQ((*engine)->add_request(greedy_request({}, 4)).status().code(), StatusCode::kInvalidArgument);
  (*engine)->abort((*a)->id());
  EXPECT_EQ(read_all(**a).finish, FinishReason::kAbort);
  auto d = (*engine)->add_request(greedy_request(fx.prompts[1], 3));
  EXPECT_TRUE(d.is_ok());
}

}  // namespace
}  // namespace mx
