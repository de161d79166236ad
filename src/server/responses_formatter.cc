// /v1/responses output: items (reasoning, message, function_call) built from the same deltas as chat.
// Streaming opens an item when its kind of output starts and closes it when another kind begins, with
// the typed events OpenAI's SDKs expect (output_item.added, *.delta, *.done, output_item.done), each with
// a sequence_number, framed as `event: <type>` + `data: <json>`.
#include <optional>

#include "server/openai_response.h"

namespace mx::server {
namespace {

struct Item {
  enum class Kind { kReasoning, kMessage, kFunctionCall };
  Kind kind;
  std::string id;
  std::string text;  // reasoning text, message text, or call arguments
  std::string call_id;
  std::string name;
  int64_t tool_index = -1;  // which call of the choice (kFunctionCall)
};

class ResponsesFormatter final : public ResponseFormatter {
 public:
  ResponsesFormatter(ResponseIdentity identity, const ChatRequest& request, ResponsesOptions options)
      : id_(std::move(identity)), options_(std::move(options)) {
    tool_choice_ = request.tool_choice.mode == ToolChoice::Mode::kNamed
                       ? Json({{"type", "function"}, {"name", request.tool_choice.name}})
                       : Json(request.tool_choice.mode == ToolChoice::Mode::kNone       ? "none"
                              : request.tool_choice.mode == ToolChoice::Mode::kRequired ? "required"
                                                                                        : "auto");
    tools_ = Json::array();
    for (const auto& t : request.tools)
      tools_.push_back({{"type", "function"}, {"name", t.name}, {"description", t.description}, {"parameters", t.parameters}});
    parallel_tool_calls_ = request.parallel_tool_calls;
    temperature_ = request.sampling.temperature;
    top_p_ = request.sampling.top_p;
    effort_ = reasoning_effort_name(request.reasoning_effort);
  }

  void delta(const GenerationDelta& d, std::string* sse) override {
    if (d.choice != 0 || finished_) return;
    begin(sse);
    if (!d.reasoning.empty()) append(Item::Kind::kReasoning, -1, d.reasoning, "", "", sse);
    if (!d.content.empty()) append(Item::Kind::kMessage, -1, d.content, "", "", sse);
    for (const auto& t : d.tool_calls) append(Item::Kind::kFunctionCall, t.index, t.arguments, t.id, t.name, sse);
  }

  void finish(int64_t choice, FinishReason reason, std::string* sse) override {
    if (choice != 0 || finished_) return;
    begin(sse);
    close_open(sse);
    finished_ = true;
    reason_ = reason;
  }

  void done(const GenerationUsage& usage, std::string* sse) override {
    if (!finished_) finish(0, FinishReason::kStop, sse);
    const bool complete = reason_ != FinishReason::kLength && reason_ != FinishReason::kAbort;
    Json response = response_json(&usage);
    if (options_.on_complete) options_.on_complete(response);
    event(complete ? "response.completed" : "response.incomplete", {{"response", std::move(response)}}, sse);
  }

  std::string body(const GenerationUsage& usage) const override { return json_text(response_json(&usage)); }

  std::string stream_error(const ApiError& error) override {
    std::string sse;
    event("error", {{"code", error.code.empty() ? Json(nullptr) : Json(error.code)}, {"message", error.message},
                    {"param", error.param.empty() ? Json(nullptr) : Json(error.param)}}, &sse);
    return sse;
  }

 private:
  void begin(std::string* sse) {
    if (begun_) return;
    begun_ = true;
    event("response.created", {{"response", response_json(nullptr)}}, sse);
    event("response.in_progress", {{"response", response_json(nullptr)}}, sse);
  }

  // Adds text to the open item of this kind, or closes the open one and opens a new item.
  void append(Item::Kind kind, int64_t tool_index, const std::string& text, const std::string& call_id,
              const std::string& name, std::string* sse) {
    if (!open_ || items_.back().kind != kind || items_.back().tool_index != tool_index) {
      if (kind == Item::Kind::kFunctionCall && tool_index != next_tool_index_) return;  // calls arrive in order
      close_open(sse);
      open(kind, tool_index, call_id, name, sse);
    }
    Item& item = items_.back();
    item.text += text;
    if (text.empty()) return;
    const int64_t output_index = static_cast<int64_t>(items_.size()) - 1;
    Json e = {{"item_id", item.id}, {"output_index", output_index}, {"delta", text}};
    if (kind != Item::Kind::kFunctionCall) e["content_index"] = 0;
    event(kind == Item::Kind::kReasoning ? "response.reasoning_text.delta"
          : kind == Item::Kind::kMessage ? "response.output_text.delta"
                                         : "response.function_call_arguments.delta",
          std::move(e), sse);
  }

  void open(Item::Kind kind, int64_t tool_index, const std::string& call_id, const std::string& name, std::string* sse) {
    Item item{kind, "", "", "", name, tool_index};
    item.id = random_id(kind == Item::Kind::kReasoning ? "rs_" : kind == Item::Kind::kMessage ? "msg_" : "fc_");
    if (kind == Item::Kind::kFunctionCall) {
      item.call_id = call_id.empty() ? random_id("call_") : call_id;
      ++next_tool_index_;
    }
    items_.push_back(std::move(item));
    open_ = true;
    const int64_t output_index = static_cast<int64_t>(items_.size()) - 1;
    event("response.output_item.added", {{"output_index", output_index}, {"item", item_json(items_.back(), false)}}, sse);
    if (kind == Item::Kind::kMessage) {
      event("response.content_part.added",
            {{"item_id", items_.back().id}, {"output_index", output_index}, {"content_index", 0},
             {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", Json::array()}}}},
            sse);
    }
  }

  void close_open(std::string* sse) {
    if (!open_) return;
    open_ = false;
    const Item& item = items_.back();
    const int64_t output_index = static_cast<int64_t>(items_.size()) - 1;
    Json base = {{"item_id", item.id}, {"output_index", output_index}};
    if (item.kind == Item::Kind::kReasoning) {
      Json e = base;
      e["content_index"] = 0;
      e["text"] = item.text;
      event("response.reasoning_text.done", std::move(e), sse);
    } else if (item.kind == Item::Kind::kMessage) {
      Json e = base;
      e["content_index"] = 0;
      e["text"] = item.text;
      event("response.output_text.done", e, sse);
      e.erase("text");
      e["part"] = {{"type", "output_text"}, {"text", item.text}, {"annotations", Json::array()}};
      event("response.content_part.done", std::move(e), sse);
    } else {
      Json e = base;
      e["arguments"] = item.text;
      event("response.function_call_arguments.done", std::move(e), sse);
    }
    event("response.output_item.done", {{"output_index", output_index}, {"item", item_json(item, true)}}, sse);
  }

  Json item_json(const Item& item, bool done) const {
    const char* status = done ? "completed" : "in_progress";
    switch (item.kind) {
      case Item::Kind::kReasoning:
        return {{"type", "reasoning"}, {"id", item.id}, {"summary", Json::array()},
                {"content", done ? Json::array({{{"type", "reasoning_text"}, {"text", item.text}}}) : Json::array()}};
      case Item::Kind::kMessage:
        return {{"type", "message"}, {"id", item.id}, {"status", status}, {"role", "assistant"},
                {"content", done ? Json::array({{{"type", "output_text"}, {"text", item.text}, {"annotations", Json::array()}}})
                                 : Json::array()}};
      case Item::Kind::kFunctionCall:
        return {{"type", "function_call"}, {"id", item.id}, {"call_id", item.call_id}, {"name", item.name},
                {"arguments", done ? item.text : ""}, {"status", status}};
    }
    return Json::object();
  }

  // The response object; `usage` null while in progress.
  Json response_json(const GenerationUsage* usage) const {
    Json output = Json::array();
    if (usage)
      for (const auto& item : items_) output.push_back(item_json(item, true));
    const bool incomplete = usage && (reason_ == FinishReason::kLength || reason_ == FinishReason::kAbort);
    Json r = {{"id", id_.id}, {"object", "response"}, {"created_at", id_.created}, {"model", id_.model},
              {"status", !usage ? "in_progress" : incomplete ? "incomplete" : "completed"},
              {"output", std::move(output)}, {"error", nullptr},
              {"incomplete_details", incomplete ? Json({{"reason", reason_ == FinishReason::kLength ? "max_output_tokens"
                                                                                                    : "aborted"}})
                                                : Json(nullptr)},
              {"tools", tools_}, {"tool_choice", tool_choice_}, {"parallel_tool_calls", parallel_tool_calls_},
              {"temperature", temperature_}, {"top_p", top_p_}, {"reasoning", {{"effort", effort_}, {"summary", nullptr}}},
              {"store", options_.store},
              {"previous_response_id", options_.previous_response_id.empty() ? Json(nullptr) : Json(options_.previous_response_id)}};
    if (usage) {
      r["usage"] = {{"input_tokens", usage->prompt_tokens},
                    {"input_tokens_details", {{"cached_tokens", usage->cached_tokens}}},
                    {"output_tokens", usage->completion_tokens},
                    {"output_tokens_details", {{"reasoning_tokens", usage->reasoning_tokens}}},
                    {"total_tokens", usage->prompt_tokens + usage->completion_tokens}};
    } else {
      r["usage"] = nullptr;
    }
    return r;
  }

  void event(const char* type, Json data, std::string* sse) {
    data["type"] = type;
    data["sequence_number"] = sequence_++;
    *sse += std::string("event: ") + type + "\n" + sse_data(data);
  }

  ResponseIdentity id_;
  ResponsesOptions options_;
  Json tool_choice_, tools_;
  bool parallel_tool_calls_ = true;  // echoed as sent (formats that end a turn at its first call make one either way)
  double temperature_ = 1.0, top_p_ = 1.0;
  const char* effort_ = "medium";
  std::vector<Item> items_;
  bool open_ = false, begun_ = false, finished_ = false;
  int64_t next_tool_index_ = 0;
  int64_t sequence_ = 0;
  FinishReason reason_ = FinishReason::kStop;
};

}  // namespace

std::unique_ptr<ResponseFormatter> make_responses_formatter(ResponseIdentity identity, const ChatRequest& request,
                                                            ResponsesOptions options) {
  return std::make_unique<ResponsesFormatter>(std::move(identity), request, std::move(options));
}

}  // namespace mx::server
