// Malformed and hostile requests against the server on loopback: each gets the right status (and, where
// the server can still speak HTTP, the OpenAI error envelope with the offending `param`), and the server
// answers a normal request afterwards.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server_test_util.h"

namespace mx::test {
namespace {

using namespace std::chrono_literals;
using Json = nlohmann::json;

struct BadCase {
  std::string name;
  std::string raw;    // exact bytes sent
  int status;         // expected HTTP status
  std::string param;  // expected error.param ("" = not checked)
};

std::string post(const std::string& target, const std::string& body) { return make_request("POST", target, body); }
std::string chat(const std::string& fields) {
  return post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}])" + fields + "}");
}

std::vector<BadCase> bad_cases() {
  const std::string deep_array = std::string(30000, '[') + std::string(30000, ']');  // under the 64 KiB limit
  std::string deep_objects;
  for (int i = 0; i < 70; ++i) deep_objects += R"({"a":)";
  deep_objects += "1" + std::string(70, '}');
  std::string many_headers = "GET /health HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 1000; ++i) many_headers += "X-H" + std::to_string(i) + ": v\r\n";
  std::string stops = "[";
  for (int i = 0; i < 100; ++i) stops += std::string(i ? "," : "") + "\"s" + std::to_string(i) + "\"";
  stops += "]";
  return {
      // ---- HTTP framing ----
      {"garbage request line", "GARBAGE\r\n\r\n", 400, ""},
      {"bad HTTP version", "GET /health HTTP/9.9\r\nHost: x\r\n\r\n", 400, ""},
      {"header line without colon", "GET /health HTTP/1.1\r\nHost: x\r\nNoColonHere\r\n\r\n", 400, ""},
      {"non-numeric content-length", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400, ""},
      {"bad chunk size", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400, ""},
      {"unknown method on known route", make_request("BREW", "/v1/models"), 405, ""},
      {"DELETE on chat", make_request("DELETE", "/v1/chat/completions"), 405, ""},
      {"GET on completions", make_request("GET", "/v1/completions"), 405, ""},
      {"POST on models", post("/v1/models", "{}"), 405, ""},
      {"unknown route", make_request("GET", "/v2/everything"), 404, ""},
      {"path traversal", make_request("GET", "/../../etc/passwd"), 404, ""},
      {"huge header", make_request("GET", "/health", "", {"X-Big: " + std::string(20000, 'a')}), 431, ""},
      {"too many headers", many_headers + "\r\n", 431, ""},
      {"huge target", make_request("GET", "/" + std::string(20000, 'p')), 431, ""},
      {"declared body over the limit",
       "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n{", 413, ""},
      {"chunked body over the limit",
       "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n20000\r\n" +
           std::string(0x20000, 'a') + "\r\n0\r\n\r\n",
       413, ""},
      {"Content-Type text/plain", make_request("POST", "/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}]})",
                                                {"Content-Type: text/plain"}),
       415, ""},
      {"Content-Type form-urlencoded (curl -d without -H)",
       make_request("POST", "/v1/completions", R"({"prompt":"hi"})", {"Content-Type: application/x-www-form-urlencoded"}), 415, ""},
      {"Content-Type multipart", make_request("POST", "/v1/responses", R"({"input":"hi"})", {"Content-Type: multipart/form-data; boundary=x"}),
       415, ""},
      // ---- bytes and JSON ----
      {"empty body", post("/v1/chat/completions", ""), 400, ""},
      {"truncated JSON", post("/v1/chat/completions", R"({"messages":[{"role":"user")"), 400, ""},
      {"JSON array body", post("/v1/chat/completions", "[1,2]"), 400, ""},
      {"JSON number body", post("/v1/chat/completions", "42"), 400, ""},
      {"JSON null body", post("/v1/chat/completions", "null"), 400, ""},
      {"invalid UTF-8 byte", post("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}"), 400, ""},
      {"overlong UTF-8", post("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"\xc0\xaf\"}]}"), 400, ""},
      {"UTF-8 surrogate", post("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"\xed\xa0\x80\"}]}"), 400, ""},
      {"truncated UTF-8 at the end", post("/v1/chat/completions", "{\"model\":\"\xe2\x82"), 400, ""},
      {"NUL byte outside strings", post("/v1/chat/completions", std::string("{\"messages\":\0[]}", 16)), 400, ""},
      {"30k nested arrays", post("/v1/chat/completions", R"({"messages":)" + deep_array + "}"), 400, ""},
      {"70 nested objects", post("/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"metadata":)" +
                                                            deep_objects + "}"),
       400, ""},
      {"number overflow", chat(R"(,"temperature":1e999)"), 400, ""},
      // ---- chat fields ----
      {"messages missing", post("/v1/chat/completions", R"({"model":"test-model"})"), 400, "messages"},
      {"messages empty", post("/v1/chat/completions", R"({"messages":[]})"), 400, "messages"},
      {"messages not an array", post("/v1/chat/completions", R"({"messages":"hi"})"), 400, "messages"},
      {"message not an object", post("/v1/chat/completions", R"({"messages":[42]})"), 400, "messages[0]"},
      {"unknown role", post("/v1/chat/completions", R"({"messages":[{"role":"wizard","content":"x"}]})"), 400, "messages[0].role"},
      {"content a number", post("/v1/chat/completions", R"({"messages":[{"role":"user","content":5}]})"), 400, "messages[0].content"},
      {"user content missing", post("/v1/chat/completions", R"({"messages":[{"role":"user"}]})"), 400, "messages[0].content"},
      {"image part", post("/v1/chat/completions", R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})"),
       400, "messages[0].content[0].type"},
      {"tool call without name",
       post("/v1/chat/completions", R"({"messages":[{"role":"assistant","tool_calls":[{"id":"c","function":{"arguments":"{}"}}]}]})"),
       400, "messages[0].tool_calls[0].function.name"},
      {"negative temperature", chat(R"(,"temperature":-1)"), 400, "temperature"},
      {"temperature a string", chat(R"(,"temperature":"hot")"), 400, "temperature"},
      {"temperature absurd", chat(R"(,"temperature":1e308)"), 400, "temperature"},
      {"top_p zero", chat(R"(,"top_p":0)"), 400, "top_p"},
      {"top_k a float", chat(R"(,"top_k":2.5)"), 400, "top_k"},
      {"min_p above one", chat(R"(,"min_p":1.5)"), 400, "min_p"},
      {"max_tokens zero", chat(R"(,"max_tokens":0)"), 400, "max_tokens"},
      {"max_tokens negative", chat(R"(,"max_tokens":-5)"), 400, "max_tokens"},
      {"max_tokens float", chat(R"(,"max_tokens":1e30)"), 400, "max_tokens"},
      {"max_tokens beyond uint64", chat(R"(,"max_tokens":18446744073709551615)"), 400, "max_tokens"},
      {"max_completion_tokens beyond context", chat(R"(,"max_completion_tokens":1000000000)"), 400, "max_tokens"},
      {"n zero", chat(R"(,"n":0)"), 400, "n"},
      {"n absurd", chat(R"(,"n":100000)"), 400, "n"},
      {"stop with 100 strings", chat(R"(,"stop":)" + stops), 400, "stop"},
      {"stop a number", chat(R"(,"stop":[1])"), 400, "stop[0]"},
      {"penalty out of range", chat(R"(,"presence_penalty":3)"), 400, "presence_penalty"},
      {"seed a string", chat(R"(,"seed":"abc")"), 400, "seed"},
      {"stream a string", chat(R"(,"stream":"yes")"), 400, "stream"},
      {"stream_options without stream", chat(R"(,"stream_options":{"include_usage":true})"), 400, "stream_options"},
      {"top_logprobs without logprobs", chat(R"(,"top_logprobs":5)"), 400, "top_logprobs"},
      {"top_logprobs absurd", chat(R"(,"logprobs":true,"top_logprobs":1000)"), 400, "top_logprobs"},
      {"reasoning_effort unknown", chat(R"(,"reasoning_effort":"extreme")"), 400, "reasoning_effort"},
      {"thinking_token_budget negative", chat(R"(,"thinking_token_budget":-1)"), 400, "thinking_token_budget"},
      {"thinking_token_budget text", chat(R"(,"thinking_token_budget":"8")"), 400, "thinking_token_budget"},
      {"tool of another type", chat(R"(,"tools":[{"type":"retrieval"}])"), 400, "tools[0].type"},
      {"tool name with spaces", chat(R"(,"tools":[{"type":"function","function":{"name":"bad name!"}}])"), 400,
       "tools[0].function.name"},
      {"tool parameters not an object", chat(R"(,"tools":[{"type":"function","function":{"name":"f","parameters":[]}}])"), 400,
       "tools[0].function.parameters"},
      {"tool_choice names a missing tool",
       chat(R"(,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}})"),
       400, "tool_choice"},
      {"tool_choice required without tools", chat(R"(,"tool_choice":"required")"), 400, "tool_choice"},
      {"tool_choice unknown word", chat(R"(,"tool_choice":"sometimes")"), 400, "tool_choice"},
      {"unknown model", chat(R"(,"model":"gpt-4")"), 404, "model"},
      // ---- completions ----
      {"completions prompt missing", post("/v1/completions", R"({"max_tokens":5})"), 400, "prompt"},
      {"completions prompt empty array", post("/v1/completions", R"({"prompt":[]})"), 400, "prompt"},
      {"completions empty string", post("/v1/completions", R"({"prompt":""})"), 400, "prompt"},
      {"completions negative token id", post("/v1/completions", R"({"prompt":[-1]})"), 400, "prompt[0]"},
      {"completions token id beyond int32", post("/v1/completions", R"({"prompt":[4294967296]})"), 400, "prompt[0]"},
      {"completions mixed token array", post("/v1/completions", R"({"prompt":[[1,"a"]]})"), 400, "prompt[0][1]"},
      {"completions logprobs too many", post("/v1/completions", R"({"prompt":"x","logprobs":10})"), 400, "logprobs"},
      // ---- responses ----
      {"responses input missing", post("/v1/responses", R"({"model":"test-model"})"), 400, "input"},
      {"responses previous_response_id", post("/v1/responses", R"({"input":"x","previous_response_id":"resp_1"})"), 400,
       "previous_response_id"},
      {"responses unknown item", post("/v1/responses", R"({"input":[{"type":"image","url":"x"}]})"), 400, "input[0].type"},
      {"responses effort unknown", post("/v1/responses", R"({"input":"x","reasoning":{"effort":"max"}})"), 400, "reasoning.effort"},
      {"responses nested tool shape", post("/v1/responses", R"({"input":"x","tools":[{"type":"function","function":{"name":"f"}}]})"),
       400, "tools[0].name"},
  };
}

TEST(ServerBadInput, EachHostileRequestGetsItsStatusAndTheServerGoesOn) {
  TestServer server;
  const auto cases = bad_cases();
  EXPECT_GE(cases.size(), 30u);
  for (const auto& c : cases) {
    RawClient client(server.port());
    client.send(c.raw);
    const HttpReply r = client.read_reply();
    EXPECT_EQ(r.status, c.status) << c.name << ": " << r.body;
    const Json j = Json::parse(r.body, nullptr, false);
    EXPECT_TRUE(j.is_object() && j.contains("error") && j["error"]["message"].is_string()) << c.name << ": " << r.body;
    if (!c.param.empty() && j.is_object() && j.contains("error")) {
      EXPECT_EQ(j["error"]["param"], c.param) << c.name << ": " << r.body;
    }
    // The server is still there, on a fresh connection.
    EXPECT_EQ(http_call(server.port(), "GET", "/health").status, 200) << "after " << c.name;
  }
  EXPECT_EQ(http_call(server.port(), "POST", "/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}]})").status, 200);
  EXPECT_EQ(server.api().in_flight(), 0);
}

TEST(ServerBadInput, UnknownFieldsAndNullsAreAccepted) {
  TestServer server;
  const std::string body = R"({"model":"test-model","messages":[{"role":"user","content":"hi","name":"bob"}],
      "user":"u1","metadata":{"k":"v"},"store":false,"service_tier":"auto","parallel_tool_calls":true,
      "stop":null,"tools":null,"seed":null,"logit_bias":{},"some_future_field":[1,2,3],
      "chat_template_kwargs":{"x":1},"top_k":-1,"reasoning_effort":"minimal"})";
  const HttpReply r = http_call(server.port(), "POST", "/v1/chat/completions", body);
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(server.service().last_chat().reasoning_effort, server::ReasoningEffort::kLow);
  EXPECT_FALSE(server.service().last_chat().thinking_token_budget.has_value());
  const std::string budget = R"({"messages":[{"role":"user","content":"hi"}],"thinking_token_budget":12})";
  EXPECT_EQ(http_call(server.port(), "POST", "/v1/chat/completions", budget).status, 200);
  EXPECT_EQ(server.service().last_chat().thinking_token_budget, 12);
  const std::string responses = R"({"input":"hi","thinking_token_budget":0})";
  EXPECT_EQ(http_call(server.port(), "POST", "/v1/responses", responses).status, 200);
  EXPECT_EQ(server.service().last_chat().thinking_token_budget, 0);
}

TEST(ServerBadInput, JsonContentTypesWithParametersOrNoneAreAccepted) {
  TestServer server;
  const std::string body = R"({"messages":[{"role":"user","content":"hi"}]})";
  for (const std::string type : {"Content-Type: application/json; charset=utf-8", "Content-Type: Application/JSON",
                                 "Content-Type:  application/json ;charset=UTF-8"}) {
    EXPECT_EQ(http_call(server.port(), "POST", "/v1/chat/completions", body, {type}).status, 200) << type;
  }
  RawClient client(server.port());  // no Content-Type at all
  client.send("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  EXPECT_EQ(client.read_reply().status, 200);
}

TEST(ServerBadInput, TruncatedBodyThenHalfClose) {
  TestServer server;
  RawClient client(server.port());
  client.send("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"messages\"");
  client.shutdown_write();
  const HttpReply r = client.read_reply();
  EXPECT_TRUE(r.status == 400 || r.status == 0) << r.status;  // the client said it will send no more
  EXPECT_EQ(http_call(server.port(), "GET", "/health").status, 200);
}

// Two servers, a request timeout of 300 ms and one of an hour, each get a request's head without its blank line.
// The first closes its connection; the same pause (until that close, however long a loaded machine makes it)
// leaves the other's open: its client then ends the head and is answered. So the timeout is what cut it off.
TEST(ServerBadInput, SlowClientIsCutOffByTheRequestTimeout) {
  auto options = TestServer::default_options();
  options.http.request_timeout = 300ms;
  TestServer server(options);
  options.http.request_timeout = 1h;
  TestServer patient(options);
  RawClient client(server.port()), kept(patient.port());
  const std::string head = "GET /health HTTP/1.1\r\nHost: x\r\n";  // and not yet the blank line
  kept.send(head);
  client.send(head);
  EXPECT_TRUE(client.closed_by_peer());
  kept.send("\r\n");
  EXPECT_EQ(kept.read_reply().status, 200);
  EXPECT_EQ(http_call(server.port(), "GET", "/health").status, 200);
}

TEST(ServerBadInput, ExpectContinueAndHttp10) {
  TestServer server;
  const std::string body = R"({"messages":[{"role":"user","content":"hi"}]})";
  RawClient client(server.port());
  client.send("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: " +
              std::to_string(body.size()) + "\r\n\r\n");
  EXPECT_NE(client.read_some().find("100 Continue"), std::string::npos);
  client.send(body);
  EXPECT_EQ(client.read_reply().status, 200);

  RawClient old(server.port());
  old.send("GET /health HTTP/1.0\r\n\r\n");
  EXPECT_EQ(old.read_reply().status, 200);
  EXPECT_TRUE(old.closed_by_peer());  // HTTP/1.0 without keep-alive: closed after the answer
  // Streaming to an HTTP/1.0 client: no chunked encoding, the end of the body is the close.
  RawClient old_stream(server.port());
  const std::string stream_body = body.substr(0, body.size() - 1) + R"(,"stream":true})";
  old_stream.send("POST /v1/chat/completions HTTP/1.0\r\nContent-Length: " + std::to_string(stream_body.size()) +
                  "\r\n\r\n" + stream_body);
  const HttpReply r = old_stream.read_reply();
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.header("transfer-encoding"), "");
  EXPECT_NE(r.body.find("data: [DONE]\n\n"), std::string::npos);
}

}  // namespace
}  // namespace mx::test
