// The Responses API's server-side state (OpenAI's `store`, on by default): the input and output items of
// recent responses, so that a request may continue one with `previous_response_id` or name an earlier item
// with `{"type": "item_reference", "id": ...}` instead of resending it (the Vercel AI SDK's default tool loop
// does both). Bounded in memory: the oldest responses are forgotten first; a forgotten or unknown id is a
// clear 400 naming it, never a silent gap in the conversation. Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "server/api_error.h"

namespace mx::server {

class ResponseStore {
 public:
  explicit ResponseStore(size_t max_responses = 4096, size_t max_bytes = 256u << 20)
      : max_responses_(max_responses), max_bytes_(max_bytes) {}

  // Keeps response `id`: the (expanded) input items it answered and its output items.
  void put(const std::string& id, nlohmann::json input_items, nlohmann::json output_items);

  // Rewrites a Responses request body in place: `input` becomes an array of items, with the conversation of
  // `previous_response_id` (its input, then its output) in front and every item_reference replaced by the
  // item it names; `previous_response_id` is taken out and returned in `previous_id`.
  std::optional<ApiError> expand(nlohmann::json* body, std::string* previous_id) const;

  size_t size() const;

 private:
  struct Stored {
    nlohmann::json input, output;
    size_t bytes = 0;
  };
  void evict_oldest();  // mu_ held

  size_t max_responses_, max_bytes_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Stored> responses_;  // guarded by mu_
  std::unordered_map<std::string, std::pair<std::string, size_t>> items_;  // item id -> (response id, index in output)
  std::deque<std::string> order_;  // response ids, oldest first
  size_t bytes_ = 0;
};

}  // namespace mx::server
