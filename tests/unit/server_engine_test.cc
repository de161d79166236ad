// The HTTP server on the real engine: the demo model (real o200k vocabulary, random weights) on the CPU,
// with forced transcripts (RequestInput::forced_tokens) playing real Harmony outputs through the engine,
// the Harmony parser, the formatters and the socket. Checks reasoning, content and tool calls, streamed
// and not, that streamed deltas add up to the non-streamed answer, n > 1, completions, the context
// check, logprobs, disconnect -> abort, the engine's queue limit, and draining.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "chat/chat_formats.h"
#include "grammar/ebnf.h"
#include "grammar/grammar_matcher.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"
#include "model/demo_model.h"
#include "model/model_registry.h"
#include "model/synthetic_model.h"
#include "runtime/tokenizer_detokenize.h"
#include "server/content_stop.h"
#include "server/engine_completion_service.h"
#include "server_test_util.h"
#include "test_util.h"
#include "spec/reference_drafter.h"

namespace mx::test {
namespace {

using namespace std::chrono_literals;
using Json = nlohmann::json;

constexpr char kToolTranscript[] =
    "<|channel|>analysis<|message|>The user wants the weather in Paris. I should call get_weather.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    "{\"city\": \"Paris\", \"unit\": \"celsius\"}<|call|>";
constexpr char kFinalTranscript[] =
    "<|channel|>analysis<|message|>Simple greeting; answer briefly.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hello! How can I help you today?<|return|>";
// No stop token, and a header that is not one: the parser keeps the text, the transcript runs out (length).
constexpr char kMalformedTranscript[] = "<|channel|>final<|message|>Partial answer<|end|><|start|>bogus words<|message|>tail";

std::string forced_json() {
  return Json({{"transcripts",
                {{{"match", "weather"}, {"text", kToolTranscript}},
                 {{"match", "hello"}, {"text", kFinalTranscript}},
                 {{"match", "malformed"}, {"text", kMalformedTranscript}}}}})
      .dump();
}

// The demo model and tokenizer, made once per build tree and loaded once per process.
struct DemoModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::shared_ptr<const Tokenizer> tokenizer;
  std::shared_ptr<const ChatFormat> format;

  static DemoModel& get() {
    static DemoModel* demo = [] {
      auto* d = new DemoModel;
      auto dir = ensure_demo_model(std::string(MX_BINARY_DIR) + "/test-cache/mxserve/" + kDemoModelName);
      if (!dir.is_ok()) throw std::runtime_error(dir.status().to_string());
      BackendOptions options;
      options.num_threads = 2;
      d->backend = std::move(make_backend(options)).value();
      auto chat = std::move(load_chat_tokenizer(*dir, std::move(model_chat_format(*dir)).value())).value();
      d->tokenizer = chat.tokenizer;
      d->format = chat.format;
      d->model = std::move(load_model(*dir, *d->backend)).value();
      return d;
    }();
    return *demo;
  }
};

// Engine + service + server on a free port.
class EngineServer {
 public:
  explicit EngineServer(EngineConfig config = default_config(), server::ApiServerOptions options = TestServer::default_options()) {
    DemoModel& demo = DemoModel::get();
    forced_ = std::move(server::ForcedTranscripts::parse(forced_json(), *demo.tokenizer)).value();
    engine_ = std::move(Engine::start(*demo.model, config, make_detokenize_fn(demo.tokenizer))).value();
    server::EngineServiceOptions service_options;
    service_options.context_length = options.context_length;
    service_options.forced = &forced_;
    service_ = std::make_unique<server::EngineCompletionService>(*engine_, demo.format, service_options);
    server_ = std::move(server::ApiServer::start(options, service_.get())).value();
    server_->set_ready(nullptr, service_->context_length());
  }
  ~EngineServer() {
    server_.reset();
    service_.reset();
    engine_.reset();
  }
  static EngineConfig default_config() {
    EngineConfig c;
    c.num_kv_pages = 512;
    c.max_num_batched_tokens = 1024;
    c.max_running_requests = 16;
    return c;
  }
  int port() const { return server_->port(); }
  server::ApiServer& api() { return *server_; }
  Engine& engine() { return *engine_; }
  server::EngineCompletionService& service() { return *service_; }

 private:
  server::ForcedTranscripts forced_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<server::EngineCompletionService> service_;
  std::unique_ptr<server::ApiServer> server_;
};

const char kWeatherTool[] =
    R"([{"type":"function","function":{"name":"get_weather","description":"Current weather",)"
    R"("parameters":{"type":"object","properties":{"city":{"type":"string"},"unit":{"type":"string"}},"required":["city"]}}}])";

std::string chat(const std::string& text, const std::string& extra = "") {
  return R"({"model":"test-model","messages":[{"role":"user","content":")" + text + "\"}]" + extra + "}";
}

Json post_json(int port, const std::string& path, const std::string& body, int expected_status = 200) {
  const HttpReply r = http_call(port, "POST", path, body);
  EXPECT_EQ(r.status, expected_status) << r.body;
  Json j = Json::parse(r.body, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r.body;
  return j;
}

// A streamed chat answer put back together: per choice reasoning, content, tool calls and finish reason.
struct Assembled {
  std::string reasoning, content, finish;
  Json tool_calls = Json::array();
  Json usage;
  bool done = false;
};

std::vector<Assembled> assemble_chat_stream(const std::string& body, size_t choices = 1) {
  std::vector<Assembled> out(choices);
  for (const std::string& payload : sse_payloads(body)) {
    if (payload == "[DONE]") {
      for (auto& a : out) a.done = true;
      continue;
    }
    const Json chunk = Json::parse(payload);
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    if (chunk.contains("usage") && !chunk["usage"].is_null()) out[0].usage = chunk["usage"];
    for (const Json& c : chunk["choices"]) {
      Assembled& a = out.at(c["index"].get<size_t>());
      const Json& d = c["delta"];
      if (d.contains("reasoning_content")) {
        a.reasoning += d["reasoning_content"].get<std::string>();
        EXPECT_EQ(d["reasoning"], d["reasoning_content"]);
      }
      if (d.contains("content") && d["content"].is_string()) a.content += d["content"].get<std::string>();
      if (d.contains("tool_calls")) {
        for (const Json& t : d["tool_calls"]) {
          const size_t i = t["index"].get<size_t>();
          if (i == a.tool_calls.size()) {
            EXPECT_TRUE(t.contains("id") && t["id"].get<std::string>().rfind("call_", 0) == 0) << t;
            a.tool_calls.push_back({{"id", t["id"]}, {"type", "function"},
                                    {"function", {{"name", t["function"]["name"]}, {"arguments", ""}}}});
          }
          a.tool_calls[i]["function"]["arguments"] =
              a.tool_calls[i]["function"]["arguments"].get<std::string>() + t["function"]["arguments"].get<std::string>();
        }
      }
      if (!c["finish_reason"].is_null()) a.finish = c["finish_reason"];
    }
  }
  return out;
}

std::string str_or_empty(const Json& j) { return j.is_string() ? j.get<std::string>() : ""; }

TEST(ServerEngine, AnalysisThenToolCall) {
  EngineServer server;
  const std::string body = chat("What is the weather in Paris?", std::string(R"(,"tools":)") + kWeatherTool);
  const Json r = post_json(server.port(), "/v1/chat/completions", body);
  const Json& choice = r["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_EQ(choice["message"]["reasoning_content"], "The user wants the weather in Paris. I should call get_weather.");
  EXPECT_EQ(choice["message"]["reasoning"], choice["message"]["reasoning_content"]);
  EXPECT_TRUE(choice["message"]["content"].is_null()) << choice;
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u) << choice;
  const Json& call = choice["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(Json::parse(call["function"]["arguments"].get<std::string>()), Json::parse(R"({"city":"Paris","unit":"celsius"})"));
  EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_GT(r["usage"]["prompt_tokens"].get<int64_t>(), 50);  // the Harmony system + developer messages
  EXPECT_GT(r["usage"]["completion_tokens"].get<int64_t>(), 20);
  EXPECT_GT(r["usage"]["completion_tokens_details"]["reasoning_tokens"].get<int64_t>(), 5);

  // Streamed: the same answer, fragment by fragment, then the finish chunk, usage and [DONE].
  const HttpReply s = http_call(server.port(), "POST", "/v1/chat/completions",
                                body.substr(0, body.size() - 1) + R"(,"stream":true,"stream_options":{"include_usage":true}})");
  ASSERT_EQ(s.status, 200) << s.body;
  EXPECT_EQ(s.header("content-type"), "text/event-stream");
  const Assembled a = assemble_chat_stream(s.body)[0];
  EXPECT_TRUE(a.done);
  EXPECT_EQ(a.finish, "tool_calls");
  EXPECT_EQ(a.reasoning, str_or_empty(choice["message"]["reasoning_content"]));
  EXPECT_EQ(a.content, "");
  ASSERT_EQ(a.tool_calls.size(), 1u);
  EXPECT_EQ(a.tool_calls[0]["function"], call["function"]);
  EXPECT_EQ(a.usage["completion_tokens"], r["usage"]["completion_tokens"]);
}

TEST(ServerEngine, AnalysisThenFinalStreamedEqualsNonStreamed) {
  EngineServer server;
  const Json r = post_json(server.port(), "/v1/chat/completions", chat("hello there", R"(,"n":2)"));
  ASSERT_EQ(r["choices"].size(), 2u);
  for (const Json& choice : r["choices"]) {
    EXPECT_EQ(choice["finish_reason"], "stop");
    EXPECT_EQ(choice["message"]["content"], "Hello! How can I help you today?");
    EXPECT_EQ(choice["message"]["reasoning_content"], "Simple greeting; answer briefly.");
    EXPECT_FALSE(choice["message"].contains("tool_calls"));
  }
  const HttpReply s = http_call(server.port(), "POST", "/v1/chat/completions", chat("hello there", R"(,"n":2,"stream":true)"));
  ASSERT_EQ(s.status, 200);
  const auto streamed = assemble_chat_stream(s.body, 2);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(streamed[i].content, r["choices"][i]["message"]["content"]);
    EXPECT_EQ(streamed[i].reasoning, r["choices"][i]["message"]["reasoning_content"]);
    EXPECT_EQ(streamed[i].finish, "stop");
  }
  // Stop strings apply to the content only: "answer" in the reasoning does not stop it, "elp" cuts the
  // content inside a token, streamed or not.
  const std::string stop = R"(,"stop":["answer","elp"])";
  const Json cut = post_json(server.port(), "/v1/chat/completions", chat("hello there", stop));
  EXPECT_EQ(cut["choices"][0]["message"]["content"], "Hello! How can I h");
  EXPECT_EQ(cut["choices"][0]["message"]["reasoning_content"], "Simple greeting; answer briefly.");
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "stop");
  const Assembled cut_stream =
      assemble_chat_stream(http_call(server.port(), "POST", "/v1/chat/completions", chat("hello there", stop + R"(,"stream":true)")).body)[0];
  EXPECT_EQ(cut_stream.content, "Hello! How can I h");
  EXPECT_EQ(cut_stream.finish, "stop");
  EXPECT_TRUE(eventually([&] { return server.engine().num_live() == 0; }));
}

TEST(ContentStop, HoldsBackPossibleStartsAndCutsAtTheFirstMatch) {
  server::ContentStopMatcher m({"END", "\n\n"});
  EXPECT_EQ(m.feed("abc E"), "abc ");
  EXPECT_EQ(m.feed("N"), "");
  EXPECT_EQ(m.feed("x\n"), "ENx");
  EXPECT_EQ(m.feed("y\n\nEND"), "\ny");
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(m.feed("more"), "");
  server::ContentStopMatcher open({"stop"});
  EXPECT_EQ(open.feed("non-st"), "non-");
  EXPECT_EQ(open.flush(), "st");
  server::ContentStopMatcher none({});
  EXPECT_FALSE(none.active());
  EXPECT_EQ(none.feed("text"), "text");
}

TEST(ServerEngine, MalformedTranscriptKeepsTextAndEndsWithLength) {
  EngineServer server;
  const Json r = post_json(server.port(), "/v1/chat/completions", chat("malformed please"));
  const Json& choice = r["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "length");
  const std::string content = str_or_empty(choice["message"]["content"]);
  EXPECT_NE(content.find("Partial answer"), std::string::npos) << choice;
  EXPECT_NE(content.find("tail"), std::string::npos) << choice;
  const HttpReply s = http_call(server.port(), "POST", "/v1/chat/completions", chat("malformed please", R"(,"stream":true)"));
  const Assembled a = assemble_chat_stream(s.body)[0];
  EXPECT_EQ(a.content, content);
  EXPECT_EQ(a.finish, "length");
}

// Sampling (no transcript matches): the same seed gives the same tokens, streamed or not.
TEST(ServerEngine, SampledStreamMatchesNonStreamedForTheSameSeed) {
  EngineServer server;
  const std::string extra = R"(,"seed":1234,"max_tokens":16,"temperature":1.0,"top_p":0.9)";
  const Json r = post_json(server.port(), "/v1/chat/completions", chat("Tell me a story", extra));
  const Json& m = r["choices"][0]["message"];
  EXPECT_LE(r["usage"]["completion_tokens"].get<int64_t>(), 16);
  const HttpReply s = http_call(server.port(), "POST", "/v1/chat/completions", chat("Tell me a story", extra + R"(,"stream":true)"));
  const Assembled a = assemble_chat_stream(s.body)[0];
  EXPECT_EQ(a.content, str_or_empty(m["content"]));
  EXPECT_EQ(a.reasoning, str_or_empty(m["reasoning_content"]));
  EXPECT_EQ(a.finish, r["choices"][0]["finish_reason"]);
  // Another seed: (almost surely) other gibberish.
  const Json other = post_json(server.port(), "/v1/chat/completions",
                               chat("Tell me a story", R"(,"seed":99,"max_tokens":24,"temperature":1.0,"logprobs":true,"top_logprobs":2)"));
  EXPECT_NE(other["choices"][0]["message"].dump(), m.dump());
  // Logprobs cover the content tokens (Harmony headers and reasoning are not content).
  const Json& lp = other["choices"][0]["logprobs"];
  ASSERT_TRUE(lp.is_object()) << other;
  for (const Json& t : lp["content"]) {
    EXPECT_LE(t["logprob"].get<double>(), 0.0);
    EXPECT_EQ(t["top_logprobs"].size(), 2u);
  }
}

TEST(ServerEngine, CompletionsTextTokensEchoAndLogprobs) {
  EngineServer server;
  const Json r = post_json(server.port(), "/v1/completions",
                           R"({"prompt":["Once upon a time", [17, 2000, 3000]],"max_tokens":5,"n":2,"seed":5,"temperature":0,"logprobs":2,"echo":true})");
  ASSERT_EQ(r["choices"].size(), 4u) << r;
  EXPECT_EQ(r["object"], "text_completion");
  for (int i = 0; i < 4; ++i) EXPECT_EQ(r["choices"][i]["index"], i);
  EXPECT_EQ(r["choices"][0]["text"].get<std::string>().rfind("Once upon a time", 0), 0u);
  // Greedy: both samples of a prompt agree.
  EXPECT_EQ(r["choices"][0]["text"], r["choices"][1]["text"]);
  EXPECT_EQ(r["choices"][2]["text"], r["choices"][3]["text"]);
  EXPECT_EQ(r["choices"][0]["logprobs"]["tokens"].size(), 5u) << r["choices"][0];
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["completion_tokens"], 20);
  // Raw Harmony in a text prompt: the special tokens are recognised, and a forced transcript plays.
  const Json h = post_json(server.port(), "/v1/completions",
                           R"({"prompt":"<|start|>user<|message|>hello<|end|><|start|>assistant","max_tokens":100})");
  EXPECT_EQ(h["choices"][0]["text"], "analysisSimple greeting; answer briefly.assistantfinalHello! How can I help you today?");
  EXPECT_EQ(h["choices"][0]["finish_reason"], "stop");
  // A token outside the vocabulary is the client's error.
  const Json bad = post_json(server.port(), "/v1/completions", R"({"prompt":[1, 300000]})", 400);
  EXPECT_EQ(bad["error"]["param"], "prompt");
}

TEST(ServerEngine, ContextLengthExceededGivesTheNumbers) {
  auto options = TestServer::default_options();
  options.context_length = 200;
  EngineServer server(EngineServer::default_config(), options);
  const Json e = post_json(server.port(), "/v1/chat/completions", chat("hi", R"(,"max_tokens":190)"), 400);
  EXPECT_EQ(e["error"]["code"], "context_length_exceeded");
  const std::string message = e["error"]["message"];
  EXPECT_NE(message.find("maximum context length is 200 tokens"), std::string::npos) << message;
  EXPECT_NE(message.find("190 in the completion"), std::string::npos) << message;
  // Without max_tokens the answer gets what the context leaves.
  const Json ok = post_json(server.port(), "/v1/chat/completions", chat("hello"));
  EXPECT_EQ(ok["choices"][0]["finish_reason"], "stop");
}

TEST(ServerEngine, ResponsesEndpointItems) {
  EngineServer server;
  const std::string tools = R"([{"type":"function","name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}])";
  const Json r = post_json(server.port(), "/v1/responses",
                           R"({"input":"weather in Paris?","reasoning":{"effort":"low"},"tools":)" + tools + "}");
  ASSERT_EQ(r["output"].size(), 2u) << r;
  EXPECT_EQ(r["output"][0]["type"], "reasoning");
  EXPECT_EQ(r["output"][1]["type"], "function_call");
  EXPECT_EQ(r["output"][1]["name"], "get_weather");
  EXPECT_EQ(r["status"], "completed");
  const HttpReply s = http_call(server.port(), "POST", "/v1/responses", R"({"input":"hello","stream":true})");
  const auto events = sse_event_names(s.body);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.front(), "response.created");
  EXPECT_EQ(events.back(), "response.completed");
  EXPECT_NE(s.body.find("Hello! How can I help you today?"), std::string::npos);
}

TEST(ServerEngine, DisconnectAbortsTheEngineRequestAndMetricsShowTheEngine) {
  EngineServer server;
  {
    RawClient client(server.port());
    client.send(make_request("POST", "/v1/chat/completions",
                             chat("Tell me a story", R"(,"stream":true,"max_tokens":3000,"ignore_eos":true)")));
    EXPECT_EQ(client.read_head().status, 200);
    EXPECT_FALSE(client.read_some().empty());
    EXPECT_EQ(server.engine().num_live(), 1);
    // The engine publishes its stats after each step.
    EXPECT_TRUE(eventually([&] {
      return http_call(server.port(), "GET", "/metrics").body.find("mxserve:num_requests_running{model_name=\"test-model\"} 1") !=
             std::string::npos;
    }));
  }
  EXPECT_TRUE(eventually([&] { return server.engine().num_live() == 0; }));
  EXPECT_TRUE(eventually([&] { return server.api().in_flight() == 0 && server.service().live_jobs() == 0; }));
  EXPECT_GE(server.engine().stats().scheduler.aborted, 1);
}

TEST(ServerEngine, EngineQueueFullIs503WithRetryAfter) {
  EngineConfig config = EngineServer::default_config();
  config.max_running_requests = 1;
  config.max_queued_requests = 1;
  EngineServer server(config);
  const std::string body = chat("Tell me a story", R"(,"stream":true,"max_tokens":3000,"ignore_eos":true)");
  // a runs (its head arrives with its first token), then b waits in the queue of one. Sent together, b
  // could win the race for the running slot and a's head would wait for b's 3000 tokens.
  RawClient a(server.port()), b(server.port());
  a.send(make_request("POST", "/v1/chat/completions", body));
  EXPECT_EQ(a.read_head().status, 200);
  b.send(make_request("POST", "/v1/chat/completions", body));
  EXPECT_TRUE(eventually([&] { return server.engine().num_live() == 2; }));
  const HttpReply full = http_call(server.port(), "POST", "/v1/chat/completions", chat("hello"));
  EXPECT_EQ(full.status, 503) << full.body;
  EXPECT_EQ(full.header("retry-after"), "1");
  EXPECT_EQ(Json::parse(full.body)["error"]["code"], "queue_full");
  a.close();
  b.close();
  EXPECT_TRUE(eventually([&] { return server.engine().num_live() == 0; }));
  EXPECT_EQ(post_json(server.port(), "/v1/chat/completions", chat("hello"))["choices"][0]["finish_reason"], "stop");
}

TEST(ServerEngine, DrainFinishesShortRequestsAndAbortsLongOnes) {
  auto options = TestServer::default_options();
  options.shutdown_timeout = 4000ms;  // the short answer needs 4 steps, the long one thousands
  EngineServer server(EngineServer::default_config(), options);
  RawClient long_client(server.port());
  long_client.send(make_request("POST", "/v1/chat/completions",
                                chat("Tell me a story", R"(,"stream":true,"max_tokens":3900,"ignore_eos":true)")));
  EXPECT_EQ(long_client.read_head().status, 200);
  RawClient short_client(server.port());
  short_client.send(make_request("POST", "/v1/chat/completions", chat("hello", R"(,"max_tokens":4)")));
  ASSERT_TRUE(eventually([&] { return server.api().in_flight() == 2; }));
  std::thread drain([&] { server.api().drain_and_stop(); });
  const HttpReply finished = short_client.read_reply();
  EXPECT_EQ(finished.status, 200);
  EXPECT_NE(finished.body.find("\"finish_reason\":\"length\""), std::string::npos) << finished.body;
  std::string rest;
  for (std::string piece; rest.find("[DONE]") == std::string::npos && !(piece = long_client.read_some()).empty();)
    rest += piece;
  EXPECT_NE(rest.find("\"finish_reason\":\"abort\""), std::string::npos) << rest.substr(rest.size() > 400 ? rest.size() - 400 : 0);
  drain.join();
  EXPECT_TRUE(eventually([&] { return server.engine().num_live() == 0; }));
  EXPECT_EQ(server.api().in_flight(), 0);
}

// Structured outputs on the random-weight demo model: whatever is valid is the masks' doing. The analysis
// is left free (a random model rarely ends it, so those choices run to max_tokens with no content); every
// choice that reaches the final channel must end with an answer that satisfies the constraint, and a
// choice cut by max_tokens must hold a prefix the grammar still accepts.
std::shared_ptr<const grammar::CompiledGrammar> byte_level(const Result<grammar::Grammar>& g) {
  EXPECT_TRUE(g.is_ok()) << g.status().to_string();
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
  return std::move(grammar::CompiledGrammar::create(*g, std::make_shared<const grammar::TokenVocabulary>(bytes))).value();
}

// Many sampled choices in one request take a while on a loaded machine: wait as long as it takes.
Json post_patiently(int port, const std::string& body) {
  RawClient client(port, 300000);
  client.send(make_request("POST", "/v1/chat/completions", body));
  const HttpReply r = client.read_reply();
  EXPECT_EQ(r.status, 200) << r.body;
  return Json::parse(r.body, nullptr, false);
}

bool grammar_accepts(const std::shared_ptr<const grammar::CompiledGrammar>& g, const std::string& text, bool whole) {
  grammar::GrammarMatcher m(g);
  if (!text.empty() && !m.accept_bytes(text)) return false;
  return !whole || m.can_end();
}

// A number in the /metrics text: the value of the series `series` (name{labels}), -1 when absent.
double metric_value(const std::string& text, const std::string& series) {
  const size_t at = text.find(series + " ");
  return at == std::string::npos ? -1 : std::stod(text.substr(at + series.size() + 1));
}

// POST /v1/completions with a long read timeout: non-streamed replies come whole after every step, which on
// a loaded machine can pass a 10 s read.
HttpReply patient_completion(int port, const std::string& body) {
  RawClient client(port, 300000);
  client.send(make_request("POST", "/v1/completions", body));
  return client.read_reply();
}

// A streamed completion's text per choice index, its deltas joined (speculation sends accepted runs in
// other deltas than plain decoding: only the sums compare).
std::map<int64_t, std::string> streamed_texts(const HttpReply& reply) {
  std::map<int64_t, std::string> texts;
  for (const std::string& p : sse_payloads(reply.body))
    if (p != "[DONE]")
      for (const Json& c : Json::parse(p)["choices"]) texts[c["index"].get<int64_t>()] += c["text"].get<std::string>();
  return texts;
}

// The speculative server's reply `x` to `body` against the plain server's `y`: streamed, the same text per
// choice; else the same choices (text, finish reason, logprobs) and usage.
void expect_same_answer(const HttpReply& x, const HttpReply& y, const std::string& body) {
  ASSERT_EQ(x.status, 200) << x.body;
  ASSERT_EQ(y.status, 200) << y.body;
  if (body.find("\"stream\":true") != std::string::npos) {
    EXPECT_EQ(streamed_texts(x), streamed_texts(y)) << body;
    return;
  }
  const Json a = Json::parse(x.body), p = Json::parse(y.body);
  ASSERT_EQ(a["choices"].size(), p["choices"].size()) << a;
  for (size_t i = 0; i < a["choices"].size(); ++i) {
    EXPECT_EQ(a["choices"][i]["text"], p["choices"][i]["text"]) << body;
    EXPECT_EQ(a["choices"][i]["finish_reason"], p["choices"][i]["finish_reason"]) << body;
    EXPECT_EQ(a["choices"][i]["logprobs"].dump(), p["choices"][i]["logprobs"].dump()) << body;
  }
  EXPECT_EQ(a["usage"], p["usage"]);
}

TEST(ServerEngine, SpeculativeDecodingAnswersAsPlainDecodingAndCountsDrafts) {
  EngineServer plain;
  // Forced acceptance: the drafts are the plain engine's own greedy tokens for these token-id prompts, so
  // every step verifies (and, greedy, accepts) k drafts; sampled requests verify them too (and reject).
  const std::vector<std::vector<int32_t>> prompts = {{17, 2000, 3000, 4000, 17, 2000}, {9, 8, 7, 6, 5, 4, 3}};
  std::vector<ReferenceDrafter::Reference> refs;
  for (const auto& p : prompts) {
    RequestInput in;
    in.prompt = p;
    in.max_tokens = 40;
    in.ignore_eos = true;
    auto stream = plain.engine().add_request(in);
    ASSERT_TRUE(stream.is_ok());
    RequestOutput out, delta;
    while (!out.finished())
      if ((*stream)->wait(&delta, 100ms)) out.merge(std::move(delta));
    refs.push_back({p, out.token_ids});
  }
  EngineConfig spec = EngineServer::default_config();
  spec.speculative.algorithm = SpeculativeAlgorithm::kExternal;
  spec.speculative.num_draft_tokens = 3;
  spec.speculative.external = std::make_shared<const ReferenceDrafter>(std::move(refs));
  auto options = TestServer::default_options();
  options.speculative_draft_tokens = 3;
  EngineServer fast(spec, options);
  const std::vector<std::string> bodies = {
      R"({"prompt":[[17, 2000, 3000, 4000, 17, 2000], [9, 8, 7, 6, 5, 4, 3]],"max_tokens":40,"temperature":0,"logprobs":2,"ignore_eos":true})",
      R"({"prompt":[9, 8, 7, 6, 5, 4, 3],"max_tokens":33,"n":2,"seed":3,"temperature":0.9,"top_p":0.9,"top_k":40,"logprobs":1,"ignore_eos":true})",
      R"({"prompt":[17, 2000, 3000, 4000, 17, 2000],"max_tokens":17,"temperature":0,"ignore_eos":true})",
  };
  for (const std::string& body : bodies) {
    for (bool stream : {false, true}) {
      const std::string b = stream ? body.substr(0, body.size() - 1) + R"(,"stream":true})" : body;
      expect_same_answer(patient_completion(fast.port(), b), patient_completion(plain.port(), b), b);
    }
  }
  // A constrained request is decoded plainly (no drafts): the same answer as the plain server's.
  const std::string constrained = chat("Pick one", R"(,"guided_choice":["yes","no"],"max_tokens":64,"seed":5,"temperature":1.0)");
  EXPECT_EQ(post_json(fast.port(), "/v1/chat/completions", constrained)["choices"].dump(),
            post_json(plain.port(), "/v1/chat/completions", constrained)["choices"].dump());
  // The engine publishes its counters after each step: the last ones may land after the reply.
  std::string metrics;
  EXPECT_TRUE(eventually([&] {
    metrics = http_call(fast.port(), "GET", "/metrics").body;
    return fast.engine().stats().scheduler.spec_drafts ==
           static_cast<int64_t>(metric_value(metrics, "vllm:spec_decode_num_drafts_total{model_name=\"test-model\"}"));
  }));
  const double drafts = metric_value(metrics, "vllm:spec_decode_num_drafts_total{model_name=\"test-model\"}");
  const double draft_tokens = metric_value(metrics, "vllm:spec_decode_num_draft_tokens_total{model_name=\"test-model\"}");
  const double accepted = metric_value(metrics, "vllm:spec_decode_num_accepted_tokens_total{model_name=\"test-model\"}");
  EXPECT_GT(drafts, 0) << metrics;
  EXPECT_GE(draft_tokens, drafts);
  EXPECT_GT(accepted, 0);
  EXPECT_LE(accepted, draft_tokens);
  double per_pos = 0;
  for (int i = 0; i < 3; ++i) {
    const double v = metric_value(metrics, "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"test-model\",position=\"" +
                                               std::to_string(i) + "\"}");
    EXPECT_GE(v, 0) << "position " << i;
    per_pos += v;
  }
  EXPECT_EQ(per_pos, accepted);
  EXPECT_NE(metrics.find("mxserve:spec_decode_num_drafts_total{"), std::string::npos);
  EXPECT_EQ(http_call(plain.port(), "GET", "/metrics").body.find("spec_decode"), std::string::npos);
  std::printf("[spec] server: %.0f verify steps, %.0f/%.0f draft tokens accepted\n", drafts, accepted, draft_tokens);
}

// EAGLE-3 through the server: a random-weight draft of the demo model's shapes (the demo-eagle3 preset)
// drafts for every request (mostly rejected: the draft's rollback runs); the answers, greedy (not streamed)
// and seeded (streamed), are the plain server's.
TEST(ServerEngine, Eagle3SpeculationAnswersAsPlainDecoding) {
  TempDir draft;
  ASSERT_TRUE(write_synthetic_model("demo-eagle3", draft.path(), SyntheticOptions{}).is_ok());
  EngineConfig spec = EngineServer::default_config();
  spec.speculative.algorithm = SpeculativeAlgorithm::kEagle3;
  spec.speculative.num_draft_tokens = 3;
  spec.speculative.draft_model = draft.path();
  auto options = TestServer::default_options();
  options.speculative_draft_tokens = 3;
  EngineServer plain, fast(spec, options);
  const std::vector<std::string> bodies = {
      R"({"prompt":[[17, 2000, 3000, 4000, 17, 2000], [9, 8, 7, 6, 5, 4, 3]],"max_tokens":16,"temperature":0,"ignore_eos":true})",
      R"({"prompt":[9, 8, 7, 6, 5, 4, 3],"max_tokens":16,"n":2,"seed":3,"temperature":0.9,"top_k":40,"ignore_eos":true,"stream":true})",
  };
  for (const std::string& b : bodies)
    expect_same_answer(patient_completion(fast.port(), b), patient_completion(plain.port(), b), b);
  EXPECT_GT(fast.engine().stats().scheduler.spec_drafts, 0);
}

TEST(ServerEngine, StructuredOutputsForceValidAnswers) {
  EngineServer server;
  const char* schema = R"({"type":"object","properties":{"name":{"type":"string","maxLength":6},)"
                       R"("age":{"type":"integer","minimum":0,"maximum":150},"color":{"enum":["red","green","blue"]},)"
                       R"("tags":{"type":"array","items":{"type":"boolean"},"maxItems":3}},)"
                       R"("required":["name","age","color","tags"],"additionalProperties":false})";
  struct Case {
    std::string field;
    std::shared_ptr<const grammar::CompiledGrammar> grammar;
  };
  const std::vector<Case> cases = {
      {std::string(R"("response_format":{"type":"json_schema","json_schema":{"name":"p","strict":true,"schema":)") + schema + "}}",
       byte_level(grammar::json_schema_grammar(Json::parse(schema)))},
      {R"("structured_outputs":{"regex":"[a-z]{1,5}-[0-9]{2}"})", byte_level(grammar::regex_grammar("[a-z]{1,5}-[0-9]{2}"))},
      {R"("guided_choice":["yes","no","maybe"])", byte_level(grammar::parse_ebnf("root ::= \"yes\" | \"no\" | \"maybe\""))},
      {R"("response_format":{"type":"json_object"})", byte_level(Result<grammar::Grammar>(grammar::any_json_grammar(true)))},
  };
  int finals = 0;
  for (const Case& c : cases) {
    for (bool stream : {false, true}) {
      const std::string body = chat("Describe a person", ",\"n\":6,\"seed\":11,\"max_tokens\":64," + c.field +
                                                               (stream ? ",\"stream\":true" : ""));
      std::vector<Assembled> answers;
      if (stream) {
        RawClient client(server.port(), 300000);
        client.send(make_request("POST", "/v1/chat/completions", body));
        const HttpReply s = client.read_reply();
        ASSERT_EQ(s.status, 200) << s.body;
        answers = assemble_chat_stream(s.body, 6);
      } else {
        const Json r = post_patiently(server.port(), body);
        for (const Json& choice : r["choices"]) {
          Assembled a;
          a.content = str_or_empty(choice["message"]["content"]);
          a.finish = choice["finish_reason"];
          answers.push_back(a);
        }
      }
      ASSERT_EQ(answers.size(), 6u);
      for (const Assembled& a : answers) {
        if (a.finish == "stop") {
          ++finals;
          EXPECT_TRUE(grammar_accepts(c.grammar, a.content, true)) << c.field << ": " << a.content;
          if (c.field.find("json") != std::string::npos) {
            EXPECT_FALSE(Json::parse(a.content, nullptr, false).is_discarded()) << a.content;
          }
        } else {
          EXPECT_EQ(a.finish, "length") << c.field;
          EXPECT_TRUE(grammar_accepts(c.grammar, a.content, false)) << c.field << ": " << a.content;
        }
      }
    }
  }
  EXPECT_GT(finals, 0);  // the seeds reach the final channel often enough to test something
}

TEST(ServerEngine, ToolChoiceRequiredAndNamedCallAToolWithValidArguments) {
  EngineServer server;
  const std::string tools =
      R"(,"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":)"
      R"({"city":{"enum":["Paris","Oslo"]},"days":{"type":"integer","minimum":1,"maximum":7}},"required":["city","days"]}}},)"
      R"({"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":)"
      R"({"zone":{"type":"string","maxLength":4}},"required":["zone"]}}}])";
  // The reasoning is bounded (half of max_tokens by default, or thinking_token_budget), so every choice
  // calls, on a random-weight model that left alone would reason to the end.
  int calls = 0;
  for (const std::string& choice : {std::string(R"("required")"), std::string(R"({"type":"function","function":{"name":"get_time"}})")}) {
    for (const std::string& budget : {std::string(), std::string(",\"thinking_token_budget\":4")}) {
    const Json r = post_patiently(server.port(), chat("Plan a trip", tools + ",\"n\":8,\"seed\":3,\"max_tokens\":128,\"tool_choice\":" +
                                                                       choice + budget));
    for (const Json& c : r["choices"]) {
      ++calls;
      ASSERT_EQ(c["finish_reason"], "tool_calls") << c;  // never a final answer, never cut off
      if (!budget.empty()) {
        EXPECT_LE(str_or_empty(c["message"]["reasoning"]).size(), 4u * 64) << c;
      }
      const Json& call = c["message"]["tool_calls"][0]["function"];
      const Json args = Json::parse(call["arguments"].get<std::string>(), nullptr, false);
      ASSERT_TRUE(args.is_object()) << call;
      if (choice != R"("required")") {
        EXPECT_EQ(call["name"], "get_time");
      }
      if (call["name"] == "get_weather") {
        EXPECT_TRUE(args["city"] == "Paris" || args["city"] == "Oslo") << args;
        EXPECT_TRUE(args["days"].is_number_integer() && args["days"] >= 1 && args["days"] <= 7) << args;
      } else {
        EXPECT_EQ(call["name"], "get_time");
        EXPECT_TRUE(args["zone"].is_string() && args["zone"].get<std::string>().size() <= 16) << args;
      }
    }
    }
  }
  EXPECT_EQ(calls, 32);
}

// /v1/completions: the whole text follows the constraint, then the model's eos; a bounded constraint
// always finishes (only eos is allowed once nothing else may follow), streamed and not.
TEST(ServerEngine, CompletionsFollowTheirConstraint) {
  EngineServer server;
  const char* schema = R"({"type":"object","properties":{"ok":{"type":"boolean"},"n":{"type":"integer","minimum":1,"maximum":9}},)"
                       R"("required":["ok","n"],"additionalProperties":false})";
  struct Case {
    std::string field;
    std::shared_ptr<const grammar::CompiledGrammar> grammar;
  };
  const std::vector<Case> cases = {
      {R"("guided_choice":["yes","no","maybe"])", byte_level(grammar::parse_ebnf("root ::= \"yes\" | \"no\" | \"maybe\""))},
      {R"("structured_outputs":{"regex":"[a-z]{1,5}-[0-9]{2}"})", byte_level(grammar::regex_grammar("[a-z]{1,5}-[0-9]{2}"))},
      {std::string(R"("guided_json":)") + schema, byte_level(grammar::json_schema_grammar(Json::parse(schema)))},
  };
  constexpr int kN = 6;
  for (const Case& c : cases) {
    for (bool stream : {false, true}) {
      const std::string body = std::string(R"({"model":"test-model","prompt":"Answer:","n":6,"seed":5,"max_tokens":48,)") +
                               c.field + (stream ? R"(,"stream":true})" : "}");
      RawClient client(server.port(), 300000);
      client.send(make_request("POST", "/v1/completions", body));
      const HttpReply r = client.read_reply();
      ASSERT_EQ(r.status, 200) << r.body;
      std::vector<std::string> text(kN), finish(kN);
      if (stream) {
        for (size_t at = r.body.find("data: "); at != std::string::npos; at = r.body.find("data: ", at + 1)) {
          const size_t end = r.body.find("\n", at);
          const Json event = Json::parse(r.body.substr(at + 6, end - at - 6), nullptr, false);
          if (event.is_discarded()) continue;  // [DONE]
          for (const Json& ch : event["choices"]) {
            const int64_t i = ch["index"];
            text[i] += ch["text"].get<std::string>();
            if (!ch["finish_reason"].is_null()) finish[i] = ch["finish_reason"];
          }
        }
      } else {
        const Json reply = Json::parse(r.body);
        for (const Json& ch : reply["choices"]) {
          text[ch["index"].get<int64_t>()] = ch["text"];
          finish[ch["index"].get<int64_t>()] = ch["finish_reason"];
        }
      }
      for (int i = 0; i < kN; ++i) {
        EXPECT_EQ(finish[i], "stop") << c.field << (stream ? " streamed" : "") << ": " << text[i];
        EXPECT_TRUE(grammar_accepts(c.grammar, text[i], true)) << c.field << ": '" << text[i] << "'";
      }
    }
  }
}

TEST(ServerEngine, StructuredOutputErrorsAre400sNamingTheField) {
  EngineServer server;
  auto expect_400 = [&](const std::string& path, const std::string& body, const std::string& param) {
    const Json r = post_json(server.port(), path, body, 400);
    EXPECT_EQ(r["error"]["param"], param) << r;
  };
  expect_400("/v1/chat/completions",
             chat("x", R"(,"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"object","patternProperties":{}}}})"),
             "response_format.json_schema.schema");
  expect_400("/v1/chat/completions", chat("x", R"(,"guided_regex":"(a")"), "guided_regex");
  expect_400("/v1/chat/completions", chat("x", R"(,"structured_outputs":{"grammar":"root ::= undefined_rule"})"),
             "structured_outputs.grammar");
  expect_400("/v1/chat/completions", chat("x", R"(,"guided_json":{"type":"string"},"guided_regex":"a")"), "guided_regex");
  expect_400("/v1/completions", R"({"model":"test-model","prompt":"x","guided_regex":"(a"})", "guided_regex");
  expect_400("/v1/completions", R"({"model":"test-model","prompt":"x","guided_json":{"type":"object","patternProperties":{}}})", "guided_json");
  const Json ok = post_json(server.port(), "/v1/chat/completions", chat("x", R"(,"max_tokens":4,"response_format":{"type":"text"})"));
  EXPECT_EQ(ok["choices"][0]["finish_reason"], "length");
}

}  // namespace
}  // namespace mx::test
