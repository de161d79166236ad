// The HTTP server on loopback with a scripted service: keep-alive, routing errors, auth, SSE framing as
// OpenAI streams it, errors after the stream started, client disconnects, admission, draining, metrics.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <regex>

#include "server/response_store.h"
#include "server_test_util.h"

namespace mx::test {
namespace {

using namespace std::chrono_literals;
using Json = nlohmann::json;

std::string chat_body(const std::string& text, const std::string& extra = "") {
  return R"({"model":"test-model","messages":[{"role":"user","content":")" + text + "\"}]" + extra + "}";
}

void expect_error_envelope(const HttpReply& r, int status, const std::string& type) {
  EXPECT_EQ(r.status, status) << r.body;
  EXPECT_EQ(r.header("content-type"), "application/json");
  const Json j = Json::parse(r.body, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << r.body;
  EXPECT_TRUE(j["error"]["message"].is_string());
  EXPECT_EQ(j["error"]["type"], type);
  EXPECT_TRUE(j["error"].contains("param"));
  EXPECT_TRUE(j["error"].contains("code"));
}

TEST(ServerHttp, KeepAliveServesManyRequestsOnOneConnection) {
  TestServer server;
  RawClient client(server.port());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(client.send(make_request("GET", "/health")));
    EXPECT_EQ(client.read_reply().status, 200);
    ASSERT_TRUE(client.send(make_request("GET", "/v1/models")));
    const HttpReply models = client.read_reply();
    EXPECT_EQ(models.status, 200);
    EXPECT_EQ(Json::parse(models.body)["data"][0]["id"], "test-model");
    ASSERT_TRUE(client.send(make_request("POST", "/v1/chat/completions", chat_body("hi"))));
    EXPECT_EQ(client.read_reply().status, 200);
  }
  // Pipelined: two requests in one write, two answers in order.
  ASSERT_TRUE(client.send(make_request("GET", "/health") + make_request("GET", "/v1/models/test-model")));
  EXPECT_EQ(client.read_reply().status, 200);
  const HttpReply model = client.read_reply();
  EXPECT_EQ(model.status, 200);
  EXPECT_EQ(Json::parse(model.body)["id"], "test-model");
}

TEST(ServerHttp, RoutingErrors) {
  TestServer server;
  expect_error_envelope(http_call(server.port(), "GET", "/v1/nope"), 404, "not_found_error");
  expect_error_envelope(http_call(server.port(), "GET", "/v1/models/other"), 404, "not_found_error");
  const HttpReply wrong_method = http_call(server.port(), "GET", "/v1/chat/completions");
  expect_error_envelope(wrong_method, 405, "invalid_request_error");
  EXPECT_EQ(wrong_method.header("allow"), "POST");
  expect_error_envelope(http_call(server.port(), "POST", "/health", "{}"), 405, "invalid_request_error");
  const HttpReply wrong_model = http_call(server.port(), "POST", "/v1/chat/completions",
                                          R"({"model":"gpt-4","messages":[{"role":"user","content":"x"}]})");
  expect_error_envelope(wrong_model, 404, "not_found_error");
  EXPECT_EQ(Json::parse(wrong_model.body)["error"]["code"], "model_not_found");
}

TEST(ServerHttp, BodyTooLargeIs413AndServerGoesOn) {
  TestServer server;
  const std::string big(100 * 1024, 'x');
  RawClient client(server.port());
  client.send(make_request("POST", "/v1/chat/completions", chat_body(big)));
  expect_error_envelope(client.read_reply(), 413, "invalid_request_error");
  EXPECT_TRUE(client.closed_by_peer());
  EXPECT_EQ(http_call(server.port(), "GET", "/health").status, 200);
}

TEST(ServerHttp, ApiKey) {
  auto options = TestServer::default_options();
  options.api_key = "sk-secret";
  TestServer server(options);
  expect_error_envelope(http_call(server.port(), "GET", "/v1/models"), 401, "authentication_error");
  expect_error_envelope(http_call(server.port(), "GET", "/v1/models", "", {"Authorization: Bearer sk-wrong"}), 401,
                        "authentication_error");
  expect_error_envelope(http_call(server.port(), "GET", "/v1/models", "", {"Authorization: Bearer sk-secret2"}), 401,
                        "authentication_error");
  expect_error_envelope(http_call(server.port(), "GET", "/v1/models", "", {"Authorization: sk-secret"}), 401,
                        "authentication_error");  // no scheme
  expect_error_envelope(http_call(server.port(), "POST", "/v1/chat/completions", chat_body("hi")), 401,
                        "authentication_error");
  EXPECT_EQ(http_call(server.port(), "GET", "/v1/models", "", {"Authorization: Bearer sk-secret"}).status, 200);
  EXPECT_EQ(http_call(server.port(), "GET", "/v1/models", "", {"authorization: bearer sk-secret"}).status, 200);
  EXPECT_EQ(http_call(server.port(), "GET", "/health").status, 200);  // open for load balancers
  EXPECT_TRUE(server::constant_time_equal("abc", "abc"));
  EXPECT_FALSE(server::constant_time_equal("abd", "abc"));
  EXPECT_FALSE(server::constant_time_equal("ab", "abc"));
  EXPECT_FALSE(server::constant_time_equal("abcd", "abc"));
  EXPECT_FALSE(server::constant_time_equal("", "abc"));
}

TEST(ServerHttp, ChatNonStreaming) {
  TestServer server;
  const HttpReply r = http_call(server.port(), "POST", "/v1/chat/completions", chat_body("hi", R"(,"n":2)"));
  ASSERT_EQ(r.status, 200) << r.body;
  const Json j = Json::parse(r.body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(j["model"], "test-model");
  ASSERT_EQ(j["choices"].size(), 2u);
  for (int c = 0; c < 2; ++c) {
    const Json& choice = j["choices"][c];
    EXPECT_EQ(choice["index"], c);
    EXPECT_EQ(choice["message"]["role"], "assistant");
    EXPECT_EQ(choice["message"]["content"], "Hello world!");
    EXPECT_EQ(choice["message"]["reasoning"], "Thinking.");
    EXPECT_EQ(choice["message"]["reasoning_content"], "Thinking.");
    EXPECT_FALSE(choice["message"].contains("tool_calls"));
    EXPECT_EQ(choice["finish_reason"], "stop");
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"], 10);
  EXPECT_EQ(j["usage"]["completion_tokens"], 8);
  EXPECT_EQ(j["usage"]["total_tokens"], 18);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
}

TEST(ServerHttp, ChatStreamingFramesLikeOpenAI) {
  TestServer server;
  const HttpReply r = http_call(server.port(), "POST", "/v1/chat/completions",
                                chat_body("hi", R"(,"stream":true,"stream_options":{"include_usage":true})"));
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.header("content-type"), "text/event-stream");
  EXPECT_EQ(r.header("transfer-encoding"), "chunked");
  // Every event is exactly `data: <payload>\n\n`.
  const auto events = sse_payloads(r.body);
  std::string rebuilt;
  for (const auto& e : events) rebuilt += "data: " + e + "\n\n";
  EXPECT_EQ(rebuilt, r.body);
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.back(), "[DONE]");
  const Json first = Json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(first.contains("usage") && first["usage"].is_null());
  std::string content, reasoning, finish;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    const Json chunk = Json::parse(events[i]);
    EXPECT_EQ(chunk["id"], first["id"]);
    const Json& delta = chunk["choices"][0]["delta"];
    if (delta.contains("content")) content += delta["content"].get<std::string>();
    if (delta.contains("reasoning")) {
      reasoning += delta["reasoning"].get<std::string>();
      EXPECT_EQ(delta["reasoning"], delta["reasoning_content"]);
    }
    if (!chunk["choices"][0]["finish_reason"].is_null()) {
      finish = chunk["choices"][0]["finish_reason"];
      EXPECT_EQ(delta, Json::object());  // the finish chunk carries an empty delta
      EXPECT_EQ(i + 3, events.size());   // and is the last before usage and [DONE]
    }
  }
  EXPECT_EQ(content, "Hello world!");  // deltas concatenate to the non-streamed text
  EXPECT_EQ(reasoning, "Thinking.");
  EXPECT_EQ(finish, "stop");
  const Json usage = Json::parse(events[events.size() - 2]);
  EXPECT_EQ(usage["choices"], Json::array());
  EXPECT_EQ(usage["usage"]["total_tokens"], 14);
}

TEST(ServerHttp, ToolCallsStreamedAndNot) {
  TestServer server;
  const std::string tools =
      R"(,"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}])";
  const HttpReply plain = http_call(server.port(), "POST", "/v1/chat/completions", chat_body("tool", tools));
  ASSERT_EQ(plain.status, 200) << plain.body;
  const Json message = Json::parse(plain.body)["choices"][0]["message"];
  EXPECT_TRUE(message["content"].is_null());
  ASSERT_EQ(message["tool_calls"].size(), 1u);
  EXPECT_EQ(message["tool_calls"][0]["type"], "function");
  EXPECT_EQ(message["tool_calls"][0]["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(message["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(Json::parse(message["tool_calls"][0]["function"]["arguments"].get<std::string>()), Json({{"city", "Paris"}}));
  EXPECT_EQ(Json::parse(plain.body)["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(server.service().last_chat().tools.at(0).name, "get_weather");

  const HttpReply streamed = http_call(server.port(), "POST", "/v1/chat/completions", chat_body("tool", tools + R"(,"stream":true)"));
  std::string arguments, id, finish;
  for (const auto& e : sse_payloads(streamed.body)) {
    if (e == "[DONE]") continue;
    const Json c = Json::parse(e)["choices"][0];
    if (c["delta"].contains("tool_calls")) {
      const Json& call = c["delta"]["tool_calls"][0];
      EXPECT_EQ(call["index"], 0);
      if (call.contains("id")) {
        id = call["id"];
        EXPECT_EQ(call["function"]["name"], "get_weather");
      }
      arguments += call["function"]["arguments"].get<std::string>();
    }
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  EXPECT_FALSE(id.empty());
  EXPECT_EQ(arguments, R"({"city":"Paris"})");
  EXPECT_EQ(finish, "tool_calls");
}

TEST(ServerHttp, ErrorAfterStreamStartIsAnSseEventThenDone) {
  TestServer server;
  const HttpReply r = http_call(server.port(), "POST", "/v1/chat/completions", chat_body("fail-late", R"(,"stream":true)"));
  EXPECT_EQ(r.status, 200);
  const auto events = sse_payloads(r.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  const Json error = Json::parse(events[events.size() - 2]);
  EXPECT_EQ(error["error"]["type"], "server_error");
  // Not streaming: the same failure is a plain 500 with the envelope.
  expect_error_envelope(http_call(server.port(), "POST", "/v1/chat/completions", chat_body("fail-late")), 500, "server_error");
  // Refused at start: the service's status and param.
  const HttpReply rejected = http_call(server.port(), "POST", "/v1/chat/completions", chat_body("reject", R"(,"stream":true)"));
  expect_error_envelope(rejected, 400, "invalid_request_error");
  EXPECT_EQ(Json::parse(rejected.body)["error"]["code"], "context_length_exceeded");
}

TEST(ServerHttp, ClientDisconnectMidStreamCancelsTheRequest) {
  TestServer server;
  {
    RawClient client(server.port());
    client.send(make_request("POST", "/v1/chat/completions", chat_body("forever", R"(,"stream":true)")));
    EXPECT_EQ(client.read_head().status, 200);
    EXPECT_NE(client.read_some().find("tick"), std::string::npos);
  }  // closes the socket mid-stream
  EXPECT_TRUE(eventually([&] { return server.service().cancellations.load() == 1; }));
  EXPECT_TRUE(eventually([&] { return server.api().in_flight() == 0; }));
  EXPECT_EQ(http_call(server.port(), "POST", "/v1/chat/completions", chat_body("hi")).status, 200);

  // Non-streaming requests are watched too: nothing is written while they run, the socket tells.
  {
    RawClient client(server.port());
    client.send(make_request("POST", "/v1/chat/completions", chat_body("forever")));
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(eventually([&] { return server.service().cancellations.load() == 2; }));
  EXPECT_TRUE(eventually([&] { return server.api().in_flight() == 0; }));
}

TEST(ServerHttp, AdmissionGivesRetryAfter503WhenFull) {
  auto options = TestServer::default_options();
  options.max_running_requests = 1;
  options.max_queued_requests = 1;
  TestServer server(options);
  RawClient a(server.port()), b(server.port());
  a.send(make_request("POST", "/v1/chat/completions", chat_body("forever", R"(,"stream":true)")));
  b.send(make_request("POST", "/v1/chat/completions", chat_body("forever", R"(,"stream":true)")));
  EXPECT_EQ(a.read_head().status, 200);
  EXPECT_EQ(b.read_head().status, 200);
  const HttpReply full = http_call(server.port(), "POST", "/v1/chat/completions", chat_body("hi"));
  expect_error_envelope(full, 503, "unavailable_error");
  EXPECT_EQ(full.header("retry-after"), "1");
  a.close();
  b.close();
  EXPECT_TRUE(eventually([&] { return server.api().in_flight() == 0; }));
  EXPECT_EQ(http_call(server.port(), "POST", "/v1/chat/completions", chat_body("hi")).status, 200);
  const std::string metrics = http_call(server.port(), "GET", "/metrics").body;
  EXPECT_NE(metrics.find("mxserve:rejected_requests_total{model_name=\"test-model\"} 1\n"), std::string::npos) << metrics;
}

TEST(ServerHttp, DrainingFinishesInFlightThenAbortsAndRefusesNewWork) {
  auto options = TestServer::default_options();
  options.shutdown_timeout = 300ms;
  TestServer server(options);
  RawClient idle(server.port());  // an open keep-alive connection: still answered while draining
  idle.send(make_request("GET", "/health"));
  EXPECT_EQ(idle.read_reply().status, 200);
  RawClient streaming(server.port());
  streaming.send(make_request("POST", "/v1/chat/completions", chat_body("forever", R"(,"stream":true)")));
  EXPECT_EQ(streaming.read_head().status, 200);

  std::thread drain([&] { server.api().drain_and_stop(); });
  EXPECT_TRUE(eventually([&] { return server.api().state() == server::ServerState::kDraining; }));
  idle.send(make_request("GET", "/health"));
  expect_error_envelope(idle.read_reply(), 503, "unavailable_error");
  idle.send(make_request("POST", "/v1/chat/completions", chat_body("hi")));
  const HttpReply refused = idle.read_reply();
  expect_error_envelope(refused, 503, "unavailable_error");
  EXPECT_EQ(refused.header("retry-after"), "1");
  // The stream outlives the timeout: it is aborted, and ends properly.
  std::string rest;
  for (std::string piece; rest.find("[DONE]") == std::string::npos && !(piece = streaming.read_some()).empty();)
    rest += piece;
  EXPECT_NE(rest.find("\"finish_reason\":\"abort\""), std::string::npos);
  EXPECT_NE(rest.find("data: [DONE]\n\n"), std::string::npos);
  drain.join();
  EXPECT_EQ(server.service().cancellations.load(), 1);
  EXPECT_EQ(server.api().in_flight(), 0);
}

TEST(ServerHttp, MetricsUseTheNamesDashboardsChart) {
  TestServer server;
  EXPECT_EQ(http_call(server.port(), "POST", "/v1/chat/completions", chat_body("hi")).status, 200);
  const HttpReply r = http_call(server.port(), "GET", "/metrics");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.header("content-type").rfind("text/plain; version=0.0.4", 0), 0u);
  for (const char* name :
       {"# TYPE mxserve:time_to_first_token_seconds histogram", "# TYPE mxserve:time_per_output_token_seconds histogram",
        "# TYPE mxserve:e2e_request_latency_seconds histogram", "mxserve:prompt_tokens_total{model_name=\"test-model\"} 10\n",
        "mxserve:generation_tokens_total{model_name=\"test-model\"} 4\n", "mxserve:num_requests_running{",
        "mxserve:num_requests_waiting{", "mxserve:kv_cache_usage_perc{", "mxserve:num_preemptions_total{",
        "mxserve:request_success_total{model_name=\"test-model\",finished_reason=\"stop\"} 1\n",
        "mxserve:e2e_request_latency_seconds_count{model_name=\"test-model\"} 1\n",
        "mxserve:time_to_first_token_seconds_bucket{model_name=\"test-model\",le=\"+Inf\"} 1\n",
        "mxserve:rejected_requests_total{"}) {
    EXPECT_NE(r.body.find(name), std::string::npos) << name;
  }
  // vLLM's names, types and labels: what endpoint pickers and dashboards read from an unlabelled pod.
  for (const char* name :
       {"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"test-model\"} ",
        "# TYPE vllm:num_requests_waiting gauge\n", "# TYPE vllm:kv_cache_usage_perc gauge\n",
        "# TYPE vllm:cache_config_info gauge\n", "# TYPE vllm:num_preemptions_total counter\n",
        "# TYPE vllm:prefix_cache_queries_total counter\n", "# TYPE vllm:prefix_cache_hits_total counter\n",
        "# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{model_name=\"test-model\"} 10\n",
        "# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total{model_name=\"test-model\"} 4\n",
        "vllm:request_success_total{model_name=\"test-model\",finished_reason=\"stop\"} 1\n",
        "vllm:request_success_total{model_name=\"test-model\",finished_reason=\"length\"} 0\n",
        "# TYPE vllm:time_to_first_token_seconds histogram\n", "# TYPE vllm:inter_token_latency_seconds histogram\n",
        "vllm:inter_token_latency_seconds_count{model_name=\"test-model\"} 3\n",
        "# TYPE vllm:e2e_request_latency_seconds histogram\n", "# TYPE vllm:request_prompt_tokens histogram\n",
        "# TYPE vllm:request_generation_tokens histogram\n",
        "vllm:time_to_first_token_seconds_bucket{model_name=\"test-model\",le=\"0.1\"} ",
        "vllm:lora_requests_info{model_name=\"test-model\",max_lora=\"0\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"} "}) {
    EXPECT_NE(r.body.find(name), std::string::npos) << name;
  }
  EXPECT_EQ(r.body.find("0.10000000000000001"), std::string::npos);
}

// The AI SDK's default tool loop: step 2 continues step 1 by previous_response_id and names its reasoning
// item by item_reference instead of resending it.
TEST(ServerHttp, ResponsesStoreContinuesByPreviousIdAndItemReference) {
  TestServer server;
  const HttpReply first = http_call(server.port(), "POST", "/v1/responses",
                                    R"({"input":[{"role":"user","content":"tool"}],
                                        "tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}}]})");
  ASSERT_EQ(first.status, 200) << first.body;
  const Json one = Json::parse(first.body);
  EXPECT_EQ(one["store"], true);
  const std::string response_id = one["id"], reasoning_id = one["output"][0]["id"];
  const std::string call_id = one["output"][1]["call_id"];

  // Step 2 as the SDK sends it: the reasoning item by reference, the call and its output in full.
  const Json step2 = {{"previous_response_id", nullptr},
                      {"input", Json::array({{{"role", "user"}, {"content", "tool"}},
                                             {{"type", "item_reference"}, {"id", reasoning_id}},
                                             one["output"][1],
                                             {{"type", "function_call_output"}, {"call_id", call_id}, {"output", "sunny"}}})}};
  const HttpReply second = http_call(server.port(), "POST", "/v1/responses", step2.dump());
  ASSERT_EQ(second.status, 200) << second.body;
  auto chat = server.service().last_chat();
  ASSERT_EQ(chat.messages.size(), 3u);
  EXPECT_EQ(chat.messages[1].role, server::ChatRole::kAssistant);
  EXPECT_EQ(chat.messages[1].reasoning, "Need the weather.") << "the referenced reasoning item's text";
  ASSERT_EQ(chat.messages[1].tool_calls.size(), 1u);
  EXPECT_EQ(chat.messages[2].role, server::ChatRole::kTool);

  // previous_response_id: the stored conversation (input, then output) comes first.
  const HttpReply third = http_call(server.port(), "POST", "/v1/responses",
                                    Json({{"previous_response_id", response_id}, {"input", "and tomorrow?"}}).dump());
  ASSERT_EQ(third.status, 200) << third.body;
  EXPECT_EQ(Json::parse(third.body)["previous_response_id"], response_id);
  chat = server.service().last_chat();
  ASSERT_EQ(chat.messages.size(), 3u);
  EXPECT_EQ(chat.messages[0].content, "tool");
  EXPECT_EQ(chat.messages[1].tool_calls.size(), 1u);
  EXPECT_EQ(chat.messages[2].content, "and tomorrow?");

  // Unknown ids are a 400 naming them; store=false keeps nothing.
  const HttpReply unknown = http_call(server.port(), "POST", "/v1/responses",
                                      R"({"input":[{"type":"item_reference","id":"rs_nope"}]})");
  EXPECT_EQ(unknown.status, 400);
  EXPECT_NE(unknown.body.find("rs_nope"), std::string::npos);
  EXPECT_EQ(Json::parse(unknown.body)["error"]["param"], "input[0].id");
  const HttpReply unstored = http_call(server.port(), "POST", "/v1/responses",
                                       R"({"input":"hi","store":false,"parallel_tool_calls":false})");
  ASSERT_EQ(unstored.status, 200);
  EXPECT_EQ(Json::parse(unstored.body)["parallel_tool_calls"], false) << "echoed as sent";
  EXPECT_EQ(one["parallel_tool_calls"], true) << "the default";
  const std::string unstored_id = Json::parse(unstored.body)["id"];
  const HttpReply gone = http_call(server.port(), "POST", "/v1/responses",
                                   Json({{"previous_response_id", unstored_id}, {"input", "x"}}).dump());
  EXPECT_EQ(gone.status, 400);
  EXPECT_EQ(Json::parse(gone.body)["error"]["param"], "previous_response_id");
  EXPECT_EQ(http_call(server.port(), "POST", "/v1/responses", R"({"input":"hi","store":"yes"})").status, 400);
}

TEST(ServerHttp, ResponseStoreForgetsTheOldestFirst) {
  server::ResponseStore store(2);
  for (const char* id : {"resp_a", "resp_b", "resp_c"}) {
    store.put(id, Json::array({{{"role", "user"}, {"content", id}}}),
              Json::array({{{"type", "message"}, {"id", std::string("msg_") + id}, {"role", "assistant"}, {"content", "x"}}}));
  }
  EXPECT_EQ(store.size(), 2u);
  std::string previous;
  Json body = {{"previous_response_id", "resp_a"}, {"input", "x"}};
  EXPECT_TRUE(store.expand(&body, &previous).has_value());
  body = {{"input", Json::array({{{"type", "item_reference"}, {"id", "msg_resp_a"}}})}};
  EXPECT_TRUE(store.expand(&body, &previous).has_value());
  body = {{"previous_response_id", "resp_c"}, {"input", Json::array({{{"type", "item_reference"}, {"id", "msg_resp_b"}}})}};
  ASSERT_FALSE(store.expand(&body, &previous).has_value());
  EXPECT_EQ(previous, "resp_c");
  ASSERT_EQ(body["input"].size(), 3u);
  EXPECT_EQ(body["input"][2]["id"], "msg_resp_b");
  EXPECT_FALSE(body.contains("previous_response_id"));
}

TEST(ServerHttp, AccessLogHasOneIsoTimestampedLinePerRequest) {
  auto options = TestServer::default_options();
  options.log_requests = true;
  TestServer server(options);
  testing::internal::CaptureStderr();
  EXPECT_EQ(http_call(server.port(), "POST", "/v1/chat/completions", chat_body("hi")).status, 200);
  EXPECT_EQ(http_call(server.port(), "GET", "/nope").status, 404);
  RawClient bad(server.port());
  bad.send("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\n\r\n");
  EXPECT_EQ(bad.read_reply().status, 400);
  // Each line is written before its response's bytes are queued, so all three are in by now.
  const std::string log = testing::internal::GetCapturedStderr();
  const std::regex iso(R"(I \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z )");
  EXPECT_TRUE(std::regex_search(log, iso)) << log;
  EXPECT_TRUE(std::regex_search(log, std::regex(R"("POST /v1/chat/completions HTTP/1.1" 200 \d+\.\d{3}s prompt_tokens=10 completion_tokens=4)")))
      << log;
  EXPECT_NE(log.find("\"GET /nope HTTP/1.1\" 404 "), std::string::npos) << log;
  EXPECT_NE(log.find("\"POST /v1/chat/completions HTTP/1.1\" 400 "), std::string::npos) << log;
  size_t lines = 0;
  for (size_t at = log.find("\" 200 "); at != std::string::npos; at = log.find("\" 200 ", at + 1)) ++lines;
  EXPECT_EQ(lines, 1u) << log;
}

TEST(ServerHttp, VersionIsOpenAndTokenizeNeedsAService) {
  auto options = TestServer::default_options();
  options.api_key = "k";
  TestServer server(options);
  const HttpReply v = http_call(server.port(), "GET", "/version");
  EXPECT_EQ(v.status, 200);
  EXPECT_TRUE(Json::parse(v.body)["version"].is_string());
  EXPECT_EQ(http_call(server.port(), "POST", "/tokenize", R"({"prompt":"x"})").status, 401);
  const std::vector<std::string> key = {"Authorization: Bearer k"};
  EXPECT_EQ(http_call(server.port(), "POST", "/tokenize", R"({"prompt":"x"})", key).status, 501);  // no tokenizer here
  EXPECT_EQ(http_call(server.port(), "POST", "/tokenize", R"({"prompt":"x","add_generation_prompt":false})", key).status, 400);
  EXPECT_EQ(http_call(server.port(), "POST", "/tokenize", R"({"nothing":1})", key).status, 400);
  EXPECT_EQ(http_call(server.port(), "POST", "/detokenize", R"({"tokens":"abc"})", key).status, 400);
  EXPECT_EQ(http_call(server.port(), "GET", "/tokenize", "", key).status, 405);
}

TEST(ServerHttp, CorsOnlyForAllowedOrigins) {
  {
    TestServer plain;  // no --allowed-origins: no CORS headers, OPTIONS reaches routing
    const HttpReply r = http_call(plain.port(), "GET", "/v1/models", "", {"Origin: https://app.example"});
    EXPECT_EQ(r.header("access-control-allow-origin"), "");
    EXPECT_EQ(http_call(plain.port(), "OPTIONS", "/v1/models", "", {"Origin: https://app.example",
                                                                     "Access-Control-Request-Method: GET"}).status, 405);
  }
  auto options = TestServer::default_options();
  options.api_key = "k";
  options.http.allowed_origins = {"https://app.example"};
  TestServer server(options);
  RawClient client(server.port());
  ASSERT_TRUE(client.send(make_request("OPTIONS", "/v1/chat/completions", "",
                                       {"Origin: https://app.example", "Access-Control-Request-Method: POST",
                                        "Access-Control-Request-Headers: authorization, content-type"})));
  const HttpReply preflight = client.read_reply();
  EXPECT_EQ(preflight.status, 204);
  EXPECT_EQ(preflight.header("access-control-allow-origin"), "https://app.example");
  EXPECT_EQ(preflight.header("access-control-allow-headers"), "authorization, content-type");
  EXPECT_NE(preflight.header("access-control-allow-methods").find("POST"), std::string::npos);
  const HttpReply chat = http_call(server.port(), "POST", "/v1/chat/completions", chat_body("hi"),
                                   {"Origin: https://app.example", "Authorization: Bearer k"});
  EXPECT_EQ(chat.status, 200);
  EXPECT_EQ(chat.header("access-control-allow-origin"), "https://app.example");
  EXPECT_EQ(chat.header("vary"), "Origin");
  const HttpReply denied = http_call(server.port(), "GET", "/health", "", {"Origin: https://evil.example"});
  EXPECT_EQ(denied.header("access-control-allow-origin"), "");
  EXPECT_EQ(http_call(server.port(), "OPTIONS", "/v1/models", "", {"Origin: https://evil.example",
                                                                    "Access-Control-Request-Method: GET"}).status, 401);
}

TEST(ServerHttp, MetricsAreOpenUnlessTheKeyIsRequired) {
  auto options = TestServer::default_options();
  options.api_key = "secret";
  {
    TestServer server(options);
    EXPECT_EQ(http_call(server.port(), "GET", "/metrics").status, 200);
    EXPECT_EQ(http_call(server.port(), "GET", "/v1/models").status, 401);
  }
  options.metrics_require_key = true;
  TestServer server(options);
  EXPECT_EQ(http_call(server.port(), "GET", "/metrics").status, 401);
  EXPECT_EQ(http_call(server.port(), "GET", "/metrics", "", {"Authorization: Bearer secret"}).status, 200);
}

TEST(ServerHttp, CompletionsTextAndTokenPrompts) {
  TestServer server;
  const HttpReply r = http_call(server.port(), "POST", "/v1/completions",
                                R"({"model":"test-model","prompt":["one","two"],"n":2,"max_tokens":2})");
  ASSERT_EQ(r.status, 200) << r.body;
  const Json j = Json::parse(r.body);
  EXPECT_EQ(j["object"], "text_completion");
  ASSERT_EQ(j["choices"].size(), 4u);
  EXPECT_EQ(j["choices"][0]["text"], " after one");
  EXPECT_EQ(j["choices"][3]["text"], " after two");
  EXPECT_EQ(j["choices"][3]["finish_reason"], "length");
  const HttpReply s = http_call(server.port(), "POST", "/v1/completions",
                                R"({"prompt":[1,2,3],"stream":true,"stream_options":{"include_usage":true}})");
  const auto events = sse_payloads(s.body);
  ASSERT_EQ(events.size(), 5u);  // two text chunks, finish, usage, [DONE]
  EXPECT_EQ(Json::parse(events[0])["choices"][0]["text"], " after");
  EXPECT_EQ(Json::parse(events[2])["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(Json::parse(events[3])["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(events[4], "[DONE]");
}

TEST(ServerHttp, ResponsesItemsAndStreamingEvents) {
  TestServer server;
  const HttpReply r = http_call(server.port(), "POST", "/v1/responses",
                                R"({"model":"test-model","input":"hi","instructions":"Be brief.","reasoning":{"effort":"high"}})");
  ASSERT_EQ(r.status, 200) << r.body;
  const Json j = Json::parse(r.body);
  EXPECT_EQ(j["object"], "response");
  EXPECT_EQ(j["status"], "completed");
  ASSERT_EQ(j["output"].size(), 2u);
  EXPECT_EQ(j["output"][0]["type"], "reasoning");
  EXPECT_EQ(j["output"][1]["type"], "message");
  EXPECT_EQ(j["output"][1]["content"][0]["text"], "Hello world!");
  EXPECT_EQ(j["usage"]["input_tokens"], 10);
  const auto chat = server.service().last_chat();
  EXPECT_EQ(chat.reasoning_effort, server::ReasoningEffort::kHigh);
  ASSERT_EQ(chat.messages.size(), 2u);
  EXPECT_EQ(chat.messages[0].role, server::ChatRole::kDeveloper);

  const HttpReply tool = http_call(server.port(), "POST", "/v1/responses",
                                   R"({"input":[{"role":"user","content":"tool"}],"stream":true,
                                       "tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}}]})");
  const std::vector<std::string> expected = {
      "response.created", "response.in_progress", "response.output_item.added", "response.reasoning_text.delta",
      "response.reasoning_text.done", "response.output_item.done", "response.output_item.added",
      "response.function_call_arguments.delta", "response.function_call_arguments.delta",
      "response.function_call_arguments.done", "response.output_item.done", "response.completed"};
  EXPECT_EQ(sse_event_names(tool.body), expected);
  const auto payloads = sse_payloads(tool.body);
  const Json done = Json::parse(payloads.back());
  EXPECT_EQ(done["sequence_number"], 11);
  EXPECT_EQ(done["response"]["output"][1]["type"], "function_call");
  EXPECT_EQ(done["response"]["output"][1]["arguments"], R"({"city":"Paris"})");
}

// Many open streams on two io threads, a third of the clients vanishing mid-stream.
TEST(ServerHttp, ManyConcurrentStreamsWithRandomDisconnects) {
  TestServer server;
  constexpr int kClients = 200;
  std::vector<std::unique_ptr<RawClient>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<RawClient>(server.port()));
    const std::string script = i % 3 == 0 ? "forever" : "hi";
    clients.back()->send(make_request("POST", "/v1/chat/completions", chat_body(script, R"(,"stream":true)")));
  }
  int completed = 0;
  for (int i = 0; i < kClients; ++i) {
    if (i % 3 == 0) {
      EXPECT_EQ(clients[i]->read_head().status, 200);
      clients[i]->close();
    } else {
      const HttpReply r = clients[i]->read_reply();
      completed += r.status == 200 && r.body.size() >= 14 && r.body.compare(r.body.size() - 14, 14, "data: [DONE]\n\n") == 0;
    }
  }
  EXPECT_EQ(completed, kClients - (kClients + 2) / 3);
  EXPECT_TRUE(eventually([&] { return server.api().in_flight() == 0; }));
  EXPECT_EQ(server.service().cancellations.load(), (kClients + 2) / 3);
  EXPECT_EQ(http_call(server.port(), "POST", "/v1/chat/completions", chat_body("hi")).status, 200);
}

}  // namespace
}  // namespace mx::test
