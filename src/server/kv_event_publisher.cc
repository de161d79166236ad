#include "server/kv_event_publisher.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include <msgpack.hpp>

#include "core/log.h"
#include "core/sha256.h"

#if MX_HAVE_ZMQ
#include <zmq.h>
#endif

namespace mx::server {

uint64_t kv_block_hash(std::optional<uint64_t> parent_hash, std::span<const int32_t> tokens) {
  std::string bytes;
  bytes.reserve(8 + tokens.size() * 4);
  if (parent_hash) {
    for (int shift = 56; shift >= 0; shift -= 8) bytes.push_back(static_cast<char>((*parent_hash >> shift) & 0xff));
  }
  for (int32_t t : tokens) {
    const auto u = static_cast<uint32_t>(t);
    for (int shift = 0; shift < 32; shift += 8) bytes.push_back(static_cast<char>((u >> shift) & 0xff));
  }
  const std::string hex = sha256_hex(bytes);
  return std::stoull(hex.substr(0, 16), nullptr, 16);
}

std::string encode_kv_event_batch(double timestamp, const std::vector<KvEvent>& events, int64_t block_size,
                                  const std::string& medium) {
  msgpack::sbuffer buffer;
  msgpack::packer<msgpack::sbuffer> pack(buffer);
  pack.pack_array(3);
  pack.pack_double(timestamp);
  pack.pack_array(static_cast<uint32_t>(events.size()));
  for (const KvEvent& e : events) {
    switch (e.kind) {
      case KvEvent::Kind::kStored:
        pack.pack_array(8);
        pack.pack(std::string("BlockStored"));
        pack.pack_array(1);
        pack.pack_uint64(e.hash);
        if (e.parent_hash) pack.pack_uint64(*e.parent_hash); else pack.pack_nil();
        pack.pack_array(static_cast<uint32_t>(e.tokens.size()));
        for (int32_t t : e.tokens) pack.pack_int32(t);
        pack.pack_int64(block_size);
        pack.pack_nil();  // lora_id
        pack.pack(medium);
        pack.pack_nil();  // lora_name
        break;
      case KvEvent::Kind::kRemoved:
        pack.pack_array(3);
        pack.pack(std::string("BlockRemoved"));
        pack.pack_array(1);
        pack.pack_uint64(e.hash);
        pack.pack(medium);
        break;
      case KvEvent::Kind::kCleared:
        pack.pack_array(1);
        pack.pack(std::string("AllBlocksCleared"));
        break;
    }
  }
  pack.pack_int(0);  // data-parallel rank
  return std::string(buffer.data(), buffer.size());
}

KvEventPublisher::~KvEventPublisher() = default;

#if MX_HAVE_ZMQ
namespace {

std::string big_endian(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i, v >>= 8) out[static_cast<size_t>(i)] = static_cast<char>(v & 0xff);
  return out;
}

class ZmqKvEventPublisher final : public KvEventPublisher {
 public:
  explicit ZmqKvEventPublisher(KvEventOptions options) : options_(std::move(options)) {}

  ~ZmqKvEventPublisher() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
    if (pub_) zmq_close(pub_);
    if (router_) zmq_close(router_);
    if (context_) zmq_ctx_term(context_);
  }

  Status open() {
    context_ = zmq_ctx_new();
    if (!context_) return internal_error("cannot create a ZeroMQ context");
    pub_ = zmq_socket(context_, ZMQ_PUB);
    const int linger = 0;
    zmq_setsockopt(pub_, ZMQ_LINGER, &linger, sizeof(linger));
    if (zmq_bind(pub_, options_.endpoint.c_str()) != 0)
      return invalid_argument("--kv-events-endpoint " + options_.endpoint + ": " + zmq_strerror(zmq_errno()));
    endpoint_ = last_endpoint(pub_);
    if (!options_.replay_endpoint.empty()) {
      router_ = zmq_socket(context_, ZMQ_ROUTER);
      zmq_setsockopt(router_, ZMQ_LINGER, &linger, sizeof(linger));
      if (zmq_bind(router_, options_.replay_endpoint.c_str()) != 0)
        return invalid_argument("--kv-events-replay-endpoint " + options_.replay_endpoint + ": " + zmq_strerror(zmq_errno()));
      replay_endpoint_ = last_endpoint(router_);
    }
    thread_ = std::thread([this] { run(); });
    return Status::ok();
  }

  std::string endpoint() const override { return endpoint_; }
  std::string replay_endpoint() const override { return replay_endpoint_; }

  void on_page_stored(int32_t page, int32_t parent_page, std::span<const int32_t> tokens) override {
    KvEvent e;
    e.kind = KvEvent::Kind::kStored;
    if (parent_page >= 0) {
      auto it = page_hash_.find(parent_page);
      if (it != page_hash_.end()) e.parent_hash = it->second;
    }
    e.hash = kv_block_hash(e.parent_hash, tokens);
    e.tokens.assign(tokens.begin(), tokens.end());
    page_hash_[page] = e.hash;
    push(std::move(e));
  }

  void on_page_removed(int32_t page) override {
    auto it = page_hash_.find(page);
    if (it == page_hash_.end()) return;
    KvEvent e;
    e.kind = KvEvent::Kind::kRemoved;
    e.hash = it->second;
    page_hash_.erase(it);
    push(std::move(e));
  }

  void on_cleared() override {
    page_hash_.clear();
    KvEvent e;
    e.kind = KvEvent::Kind::kCleared;
    push(std::move(e));
  }

  void flush() override {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t target = queued_total_;
    sent_cv_.wait(lock, [&] { return sent_total_ >= target || stop_; });
  }

 private:
  static std::string last_endpoint(void* socket) {
    char buffer[256] = {};
    size_t size = sizeof(buffer);
    zmq_getsockopt(socket, ZMQ_LAST_ENDPOINT, buffer, &size);
    return buffer;
  }

  void push(KvEvent e) {  // engine thread
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(std::move(e));
    ++queued_total_;
  }

  void run() {  // publisher thread: owns both sockets
    while (true) {
      zmq_pollitem_t items[] = {{router_, 0, ZMQ_POLLIN, 0}};
      if (router_) zmq_poll(items, 1, 5);
      else std::this_thread::sleep_for(std::chrono::milliseconds(5));
      if (router_ && (items[0].revents & ZMQ_POLLIN)) answer_replay();
      std::vector<KvEvent> batch;
      bool stop = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        batch.swap(pending_);
        stop = stop_;
      }
      if (!batch.empty()) send(batch);
      {
        std::lock_guard<std::mutex> lock(mu_);
        sent_total_ += batch.size();
      }
      sent_cv_.notify_all();
      if (stop) return;
    }
  }

  void send(const std::vector<KvEvent>& batch) {
    const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    std::string payload = encode_kv_event_batch(now, batch, options_.block_size, options_.medium);
    const uint64_t seq = next_seq_++;
    const std::string seq_bytes = big_endian(seq);
    zmq_send(pub_, options_.topic.data(), options_.topic.size(), ZMQ_SNDMORE);
    zmq_send(pub_, seq_bytes.data(), seq_bytes.size(), ZMQ_SNDMORE);
    zmq_send(pub_, payload.data(), payload.size(), 0);
    if (router_) {
      replay_.emplace_back(seq, std::move(payload));
      while (replay_.size() > options_.replay_batches) replay_.pop_front();
    }
  }

  void answer_replay() {
    std::vector<std::string> frames;
    while (true) {
      zmq_msg_t msg;
      zmq_msg_init(&msg);
      if (zmq_msg_recv(&msg, router_, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&msg);
        break;
      }
      frames.emplace_back(static_cast<const char*>(zmq_msg_data(&msg)), zmq_msg_size(&msg));
      const bool more = zmq_msg_more(&msg);
      zmq_msg_close(&msg);
      if (!more) break;
    }
    // [client identity, (empty delimiter), 8-byte start sequence]
    if (frames.size() < 2 || frames.back().size() != 8) return;
    uint64_t start = 0;
    for (unsigned char c : frames.back()) start = (start << 8) | c;
    const std::string& client = frames.front();
    auto send_reply = [&](const std::string& seq, const std::string& payload) {
      zmq_send(router_, client.data(), client.size(), ZMQ_SNDMORE);
      zmq_send(router_, "", 0, ZMQ_SNDMORE);
      zmq_send(router_, seq.data(), seq.size(), ZMQ_SNDMORE);
      zmq_send(router_, payload.data(), payload.size(), 0);
    };
    for (const auto& [seq, payload] : replay_) {
      if (seq >= start) send_reply(big_endian(seq), payload);
    }
    send_reply(big_endian(~uint64_t{0}), "");
  }

  KvEventOptions options_;
  void* context_ = nullptr;
  void* pub_ = nullptr;
  void* router_ = nullptr;
  std::string endpoint_, replay_endpoint_;
  std::thread thread_;
  std::unordered_map<int32_t, uint64_t> page_hash_;  // engine thread: each cached page's block hash
  std::mutex mu_;
  std::condition_variable sent_cv_;
  std::vector<KvEvent> pending_;  // guarded by mu_
  uint64_t queued_total_ = 0, sent_total_ = 0;  // guarded by mu_
  bool stop_ = false;                           // guarded by mu_
  uint64_t next_seq_ = 0;                                // publisher thread
  std::deque<std::pair<uint64_t, std::string>> replay_;  // publisher thread
};

}  // namespace

Result<std::shared_ptr<KvEventPublisher>> KvEventPublisher::start(const KvEventOptions& options) {
  if (options.endpoint.empty()) return invalid_argument("KV events need an endpoint");
  if (options.block_size < 1) return invalid_argument("the KV event block size must be positive");
  auto publisher = std::make_shared<ZmqKvEventPublisher>(options);
  MX_RETURN_IF_ERROR(publisher->open());
  return std::shared_ptr<KvEventPublisher>(std::move(publisher));
}
#else
Result<std::shared_ptr<KvEventPublisher>> KvEventPublisher::start(const KvEventOptions& options) {
  (void)options;
  return unimplemented("KV-cache events need ZeroMQ, which this build was made without (rebuild with libzmq3-dev "
                       "installed and MX_KV_EVENTS on)");
}
#endif

}  // namespace mx::server
