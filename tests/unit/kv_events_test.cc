// KV-cache events as a router receives them: a ZeroMQ subscriber gets BlockStored for a prompt's full pages
// (token ids, chained hashes) and BlockRemoved when pages are evicted, decoded from vLLM's msgpack layout;
// the replay socket sends the buffered batches from a sequence number on, then the end marker.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include <msgpack.hpp>
#include <zmq.h>

#include "engine_test_util.h"
#include "server/kv_event_publisher.h"

namespace mx::test {
namespace {

using server::KvEvent;

struct Received {
  uint64_t seq = 0;
  std::vector<KvEvent> events;
};

uint64_t from_big_endian(const std::string& bytes) {
  uint64_t v = 0;
  for (unsigned char c : bytes) v = (v << 8) | c;
  return v;
}

// Decodes one payload frame by vLLM's layout: [ts, [events], dp_rank], events tagged arrays.
std::vector<KvEvent> decode_batch(const std::string& payload, int64_t expected_block_size) {
  std::vector<KvEvent> out;
  const msgpack::object_handle handle = msgpack::unpack(payload.data(), payload.size());
  const msgpack::object& batch = handle.get();
  EXPECT_EQ(batch.type, msgpack::type::ARRAY);
  EXPECT_EQ(batch.via.array.size, 3u);
  EXPECT_EQ(batch.via.array.ptr[0].type, msgpack::type::FLOAT64);
  for (const auto& e : batch.via.array.ptr[1].as<std::vector<msgpack::object>>()) {
    const auto fields = e.as<std::vector<msgpack::object>>();
    const std::string tag = fields.at(0).as<std::string>();
    KvEvent event;
    if (tag == "BlockStored") {
      EXPECT_EQ(fields.size(), 8u);
      event.kind = KvEvent::Kind::kStored;
      event.hash = fields.at(1).as<std::vector<uint64_t>>().at(0);
      if (!fields.at(2).is_nil()) event.parent_hash = fields.at(2).as<uint64_t>();
      event.tokens = fields.at(3).as<std::vector<int32_t>>();
      EXPECT_EQ(fields.at(4).as<int64_t>(), expected_block_size);
      EXPECT_TRUE(fields.at(5).is_nil());
      EXPECT_EQ(fields.at(6).as<std::string>(), "CPU");
    } else if (tag == "BlockRemoved") {
      event.kind = KvEvent::Kind::kRemoved;
      event.hash = fields.at(1).as<std::vector<uint64_t>>().at(0);
    } else {
      EXPECT_EQ(tag, "AllBlocksCleared");
      event.kind = KvEvent::Kind::kCleared;
    }
    out.push_back(std::move(event));
  }
  return out;
}

std::vector<std::string> recv_frames(void* socket, int timeout_ms) {
  zmq_pollitem_t item{socket, 0, ZMQ_POLLIN, 0};
  if (zmq_poll(&item, 1, timeout_ms) <= 0) return {};
  std::vector<std::string> frames;
  while (true) {
    zmq_msg_t msg;
    zmq_msg_init(&msg);
    if (zmq_msg_recv(&msg, socket, 0) < 0) break;
    frames.emplace_back(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
    const bool more = zmq_msg_more(&msg);
    zmq_msg_close(&msg);
    if (!more) break;
  }
  return frames;
}

TEST(KvEvents, BlockHashesChainOverThePrefix) {
  const std::vector<int32_t> a = {1, 2, 3, 4}, b = {5, 6, 7, 8};
  const uint64_t ha = server::kv_block_hash(std::nullopt, a);
  EXPECT_EQ(server::kv_block_hash(std::nullopt, a), ha);
  EXPECT_NE(server::kv_block_hash(ha, b), server::kv_block_hash(std::nullopt, b));
  EXPECT_NE(server::kv_block_hash(server::kv_block_hash(std::nullopt, b), b), server::kv_block_hash(ha, b));
}

TEST(KvEvents, SubscriberSeesStoredAndRemovedBlocksAndReplayResends) {
  server::KvEventOptions options;
  options.endpoint = "tcp://127.0.0.1:*";
  options.replay_endpoint = "tcp://127.0.0.1:*";
  options.topic = "kv@test";
  options.block_size = 4;
  options.medium = "CPU";
  auto started = server::KvEventPublisher::start(options);
  ASSERT_TRUE(started.is_ok()) << started.status().message();
  std::shared_ptr<server::KvEventPublisher> publisher = *started;

  void* context = zmq_ctx_new();
  void* sub = zmq_socket(context, ZMQ_SUB);
  ASSERT_EQ(zmq_connect(sub, publisher->endpoint().c_str()), 0);
  ASSERT_EQ(zmq_setsockopt(sub, ZMQ_SUBSCRIBE, "", 0), 0);
  // A PUB socket drops what it sends before the subscription arrives: send "cleared" until one comes back.
  std::vector<std::string> frames;
  for (int i = 0; i < 500 && frames.empty(); ++i) {
    publisher->on_cleared();
    publisher->flush();
    frames = recv_frames(sub, 10);
  }
  ASSERT_EQ(frames.size(), 3u) << "no subscription after 5 s";
  while (!recv_frames(sub, 50).empty()) {}  // the other "cleared" batches in flight

  // A prompt of 10 tokens in pages of 4: two full pages are stored; a small pool evicts them later.
  const Fixture& fx = fixture_model("tiny-gpt-oss");
  EngineConfig config;
  config.page_size = 4;
  config.num_kv_pages = 6;
  config.prefix_cache_observer = publisher;
  auto core = EngineCore::create(*fx.model, config);
  ASSERT_TRUE(core.is_ok()) << core.status().message();
  const std::vector<int32_t> prompt = {11, 12, 13, 14, 15, 16, 17, 18, 19, 20};
  DriveResult first = drive(**core, {{0, greedy_request(prompt, 1)}});
  ASSERT_TRUE(first.error.empty()) << first.error;
  publisher->flush();

  std::vector<KvEvent> stored;
  for (auto got = recv_frames(sub, 2000); !got.empty(); got = recv_frames(sub, 200)) {
    ASSERT_EQ(got.size(), 3u);
    EXPECT_EQ(got[0], "kv@test");
    EXPECT_EQ(got[1].size(), 8u);
    for (auto& e : decode_batch(got[2], 4)) stored.push_back(std::move(e));
  }
  ASSERT_GE(stored.size(), 2u);
  EXPECT_EQ(stored[0].kind, KvEvent::Kind::kStored);
  EXPECT_EQ(stored[0].tokens, std::vector<int32_t>(prompt.begin(), prompt.begin() + 4));
  EXPECT_FALSE(stored[0].parent_hash.has_value());
  EXPECT_EQ(stored[1].tokens, std::vector<int32_t>(prompt.begin() + 4, prompt.begin() + 8));
  ASSERT_TRUE(stored[1].parent_hash.has_value());
  EXPECT_EQ(*stored[1].parent_hash, stored[0].hash);
  EXPECT_EQ(stored[1].hash, server::kv_block_hash(stored[0].hash, stored[1].tokens));

  // Another prompt needs every page: the cached ones are evicted and reported removed.
  const std::vector<int32_t> other = {30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50};
  DriveResult second = drive(**core, {{0, greedy_request(other, 1)}});
  ASSERT_TRUE(second.error.empty()) << second.error;
  publisher->flush();
  std::vector<uint64_t> removed;
  for (auto got = recv_frames(sub, 2000); !got.empty(); got = recv_frames(sub, 200)) {
    for (auto& e : decode_batch(got[2], 4))
      if (e.kind == KvEvent::Kind::kRemoved) removed.push_back(e.hash);
  }
  EXPECT_NE(std::find(removed.begin(), removed.end(), stored[0].hash), removed.end());
  EXPECT_NE(std::find(removed.begin(), removed.end(), stored[1].hash), removed.end());

  // Replay from sequence 1: every buffered batch from there on, in order, then the end marker.
  void* dealer = zmq_socket(context, ZMQ_DEALER);
  ASSERT_EQ(zmq_connect(dealer, publisher->replay_endpoint().c_str()), 0);
  const std::string start("\0\0\0\0\0\0\0\1", 8);
  zmq_send(dealer, "", 0, ZMQ_SNDMORE);
  zmq_send(dealer, start.data(), start.size(), 0);
  uint64_t expected_seq = 1;
  bool ended = false;
  for (auto got = recv_frames(dealer, 5000); !got.empty() && !ended; got = recv_frames(dealer, 5000)) {
    ASSERT_EQ(got.size(), 3u);  // "", sequence, payload
    const uint64_t seq = from_big_endian(got[1]);
    if (seq == ~uint64_t{0}) {
      EXPECT_TRUE(got[2].empty());
      ended = true;
      break;
    }
    EXPECT_EQ(seq, expected_seq++);
    decode_batch(got[2], 4);
  }
  EXPECT_TRUE(ended);
  EXPECT_GT(expected_seq, 2u);

  zmq_close(dealer);
  zmq_close(sub);
  zmq_ctx_term(context);
}

}  // namespace
}  // namespace mx::test
