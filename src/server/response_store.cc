#include "server/response_store.h"

namespace mx::server {

using Json = nlohmann::json;

void ResponseStore::put(const std::string& id, Json input_items, Json output_items) {
  Stored s{std::move(input_items), std::move(output_items), 0};
  s.bytes = s.input.dump().size() + s.output.dump().size() + id.size();
  std::lock_guard<std::mutex> lock(mu_);
  if (s.bytes > max_bytes_ || responses_.count(id)) return;
  for (size_t i = 0; i < s.output.size(); ++i) {
    const Json& item = s.output[i];
    if (item.is_object() && item.contains("id") && item["id"].is_string()) items_[item["id"].get<std::string>()] = {id, i};
  }
  bytes_ += s.bytes;
  responses_.emplace(id, std::move(s));
  order_.push_back(id);
  while (!order_.empty() && (responses_.size() > max_responses_ || bytes_ > max_bytes_)) evict_oldest();
}

void ResponseStore::evict_oldest() {
  const std::string id = order_.front();
  order_.pop_front();
  auto it = responses_.find(id);
  if (it == responses_.end()) return;
  for (const Json& item : it->second.output) {
    if (!item.is_object() || !item.contains("id") || !item["id"].is_string()) continue;
    auto ref = items_.find(item["id"].get<std::string>());
    if (ref != items_.end() && ref->second.first == id) items_.erase(ref);
  }
  bytes_ -= it->second.bytes;
  responses_.erase(it);
}

size_t ResponseStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return responses_.size();
}

std::optional<ApiError> ResponseStore::expand(Json* body, std::string* previous_id) const {
  previous_id->clear();
  Json items = Json::array();
  std::lock_guard<std::mutex> lock(mu_);
  if (body->contains("previous_response_id") && !(*body)["previous_response_id"].is_null()) {
    const Json& prev = (*body)["previous_response_id"];
    if (!prev.is_string()) {
      return ApiError::invalid_request("'previous_response_id' must be a string.", "previous_response_id");
    }
    *previous_id = prev.get<std::string>();
    auto it = responses_.find(*previous_id);
    if (it == responses_.end()) {
      return ApiError::invalid_request("Previous response with id '" + *previous_id +
                                           "' not found (unknown, stored with store=false, or evicted from this "
                                           "server's bounded store).",
                                       "previous_response_id");
    }
    for (const Json& item : it->second.input) items.push_back(item);
    for (const Json& item : it->second.output) items.push_back(item);
  }
  body->erase("previous_response_id");
  if (!body->contains("input")) {
    if (items.empty()) return std::nullopt;  // the parser reports the missing input
    (*body)["input"] = std::move(items);
    return std::nullopt;
  }
  Json& input = (*body)["input"];
  if (input.is_string()) {
    items.push_back({{"role", "user"}, {"content", input.get<std::string>()}});
  } else if (input.is_array()) {
    for (size_t i = 0; i < input.size(); ++i) {
      const Json& item = input[i];
      const bool reference = item.is_object() && item.contains("type") && item["type"] == "item_reference";
      if (!reference) {
        items.push_back(item);
        continue;
      }
      const std::string param = "input[" + std::to_string(i) + "].id";
      if (!item.contains("id") || !item["id"].is_string()) {
        return ApiError::invalid_request("An item_reference needs a string 'id'.", param);
      }
      const std::string id = item["id"].get<std::string>();
      auto ref = items_.find(id);
      if (ref == items_.end()) {
        return ApiError::invalid_request("Item with id '" + id +
                                             "' not found (unknown, from a response stored with store=false, or "
                                             "evicted from this server's bounded store).",
                                         param);
      }
      items.push_back(responses_.at(ref->second.first).output[ref->second.second]);
    }
  } else {
    return std::nullopt;  // the parser reports the wrong type
  }
  input = std::move(items);
  return std::nullopt;
}

}  // namespace mx::server
