#include "server_test_util.h"

#include <chrono>

#include <gtest/gtest.h>

namespace mx::test {

using namespace std::chrono_literals;
using server::ApiError;
using server::FinishReason;
using server::GenerationDelta;
using server::GenerationUsage;

// ---- ScriptedService ----

ScriptedService::~ScriptedService() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    threads.swap(threads_);
  }
  for (auto& t : threads) t.join();
}

void ScriptedService::spawn(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  threads_.emplace_back(std::move(fn));
}

server::ChatRequest ScriptedService::last_chat() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_chat_;
}

server::ServiceStats ScriptedService::stats() const {
  server::ServiceStats s;
  s.running = running.load();
  return s;
}

namespace {

GenerationDelta text_delta(int64_t choice, std::string content, std::string reasoning = "") {
  GenerationDelta d;
  d.choice = choice;
  d.content = std::move(content);
  d.reasoning = std::move(reasoning);
  d.num_tokens = 1;
  return d;
}

}  // namespace

std::optional<ApiError> ScriptedService::start_chat(const server::ChatRequest& request,
                                                    std::shared_ptr<server::GenerationStream> stream) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_chat_ = request;
  }
  const std::string script = request.messages.back().content;
  const int64_t n = request.sampling.n;
  if (script == "reject")
    return ApiError::invalid_request("This model's maximum context length is 64 tokens.", "messages", "context_length_exceeded");
  running.fetch_add(1);
  if (script == "forever") {
    stream->on_cancel([this] { cancellations.fetch_add(1); });
    spawn([this, stream] {
      while (!stream->cancelled()) {
        stream->delta(text_delta(0, "tick "));
        std::this_thread::sleep_for(5ms);
      }
      stream->finish_choice(0, FinishReason::kAbort);
      stream->done({5, 1, 0, 0});
      running.fetch_sub(1);
    });
    return std::nullopt;
  }
  spawn([this, stream, script, n] {
    if (script == "slow") std::this_thread::sleep_for(300ms);
    if (script == "fail-late") {
      stream->delta(text_delta(0, "partial"));
      std::this_thread::sleep_for(20ms);
      stream->fail(ApiError::internal("The engine failed this request."));
    } else if (script == "tool") {
      stream->delta(text_delta(0, "", "Need the weather."));
      GenerationDelta call;
      call.tool_calls.push_back({0, "", "get_weather", "{\"city\":"});
      call.num_tokens = 3;
      stream->delta(call);
      GenerationDelta rest;
      rest.tool_calls.push_back({0, "", "", "\"Paris\"}"});
      rest.num_tokens = 2;
      stream->delta(rest);
      stream->finish_choice(0, FinishReason::kStop);
      stream->done({20, 6, 0, 1});
    } else if (script == "slow") {
      stream->delta(text_delta(0, "ok"));
      stream->done({3, 1, 0, 0});
    } else {
      for (int64_t c = 0; c < n; ++c) {
        stream->delta(text_delta(c, "", "Thinking."));
        for (const char* piece : {"Hello", " world", "!"}) stream->delta(text_delta(c, piece));
        stream->finish_choice(c, FinishReason::kStop);
      }
      stream->done({10, 4 * n, 2, n});
    }
    running.fetch_sub(1);
  });
  return std::nullopt;
}

std::optional<ApiError> ScriptedService::start_completion(const server::CompletionRequest& request,
                                                          std::shared_ptr<server::GenerationStream> stream) {
  running.fetch_add(1);
  spawn([this, request, stream] {
    const int64_t n = request.sampling.n;
    int64_t prompt_tokens = 0;
    for (size_t p = 0; p < request.prompts.size(); ++p) {
      const auto& prompt = request.prompts[p];
      prompt_tokens += prompt.is_tokens ? static_cast<int64_t>(prompt.token_ids.size()) : 1;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t choice = static_cast<int64_t>(p) * n + i;
        stream->delta(text_delta(choice, " after"));
        stream->delta(text_delta(choice, prompt.is_tokens ? " ids" : " " + prompt.text));
        stream->finish_choice(choice, FinishReason::kLength);
      }
    }
    stream->done({prompt_tokens, 2 * n * static_cast<int64_t>(request.prompts.size()), 0, 0});
    running.fetch_sub(1);
  });
  return std::nullopt;
}

// ---- TestServer ----

server::ApiServerOptions TestServer::default_options() {
  server::ApiServerOptions o;
  o.http.port = 0;
  o.http.io_threads = 2;
  o.http.max_body_bytes = 64 * 1024;
  o.http.max_header_bytes = 8 * 1024;
  o.http.request_timeout = std::chrono::milliseconds(3000);
  o.served_model_name = "test-model";
  o.log_requests = false;  // the access-log test turns it on
  o.context_length = 4096;
  o.max_running_requests = 64;
  o.max_queued_requests = 512;
  o.shutdown_timeout = std::chrono::milliseconds(2000);
  return o;
}

TestServer::TestServer(server::ApiServerOptions options) {
  auto started = server::ApiServer::start(options, &service_);
  if (!started.is_ok()) throw std::runtime_error(started.status().to_string());
  server_ = std::move(started).value();
  server_->set_ready();
}

}  // namespace mx::test
