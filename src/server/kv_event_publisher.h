// KV-cache events for prefix-aware routers (llm-d, NVIDIA Dynamo, the Gateway API Inference Extension's
// endpoint picker), in vLLM's wire format: a ZeroMQ PUB socket sends multipart messages
//   [topic, sequence number (8 bytes, big-endian), msgpack([timestamp, [event, ...], data_parallel_rank])]
// with events as tagged arrays
//   ["BlockStored", [block_hash], parent_block_hash | nil, [token ids], block_size, lora_id (nil), medium, lora_name (nil)]
//   ["BlockRemoved", [block_hash], medium]
//   ["AllBlocksCleared"]
// One block is one KV page. A block's hash covers its whole prefix: the first 8 bytes (big-endian) of
// SHA-256(parent hash as 8 big-endian bytes, or none at the start, then the block's token ids as 4-byte
// little-endian integers), so equal prefixes give equal hashes on every replica. An optional ROUTER socket
// replays: a request carrying an 8-byte start sequence number is answered with every buffered batch from
// there on, each as [client, "", sequence, payload], then [client, "", 2^64-1, ""].
//
// The engine thread only appends events to a queue (PrefixCacheObserver); a publisher thread batches and
// sends them (every few milliseconds) and answers replays. Builds without ZeroMQ (the static GPU bundle)
// refuse to start one with a clear error.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "runtime/page_pool.h"

namespace mx::server {

struct KvEventOptions {
  std::string endpoint;         // PUB bind address, e.g. tcp://*:5557 (tcp://127.0.0.1:* picks a free port)
  std::string replay_endpoint;  // ROUTER bind address; empty = no replay
  std::string topic;            // first frame of every message (llm-d: kv@<pod-ip>:<port>@<model>)
  int64_t block_size = 16;      // tokens per block = the KV page size
  std::string medium = "GPU";   // where the blocks live: GPU (CUDA) or CPU
  size_t replay_batches = 10000;  // batches kept for replay
};

// One event as the wire format carries it.
struct KvEvent {
  enum class Kind { kStored, kRemoved, kCleared } kind = Kind::kStored;
  uint64_t hash = 0;
  std::optional<uint64_t> parent_hash;
  std::vector<int32_t> tokens;
};

// msgpack of [timestamp, [events...], 0] (the payload frame).
std::string encode_kv_event_batch(double timestamp, const std::vector<KvEvent>& events, int64_t block_size,
                                  const std::string& medium);
// The chained block hash (see above).
uint64_t kv_block_hash(std::optional<uint64_t> parent_hash, std::span<const int32_t> tokens);

class KvEventPublisher : public PrefixCacheObserver {
 public:
  static Result<std::shared_ptr<KvEventPublisher>> start(const KvEventOptions& options);
  ~KvEventPublisher() override;

  // The addresses actually bound (a `*` port resolved), for logs and tests.
  virtual std::string endpoint() const = 0;
  virtual std::string replay_endpoint() const = 0;
  // Sends what is queued now, on the publisher thread, and waits for it (tests; shutdown).
  virtual void flush() = 0;

 protected:
  KvEventPublisher() = default;
};

}  // namespace mx::server
