// Routing, auth, admission and the generation endpoints' request path:
//   parse JSON (UTF-8, depth) -> typed request (400 naming the field) -> model and context checks ->
//   admission (503) -> GenerationStream with the endpoint's formatter -> CompletionService.
#include "server/api_server.h"

#include <cstdio>
#include <ctime>
#include <thread>

#include "core/log.h"
#include "core/version.h"
#include "server/http_server.h"
#include "server/openai_request.h"
#include "server/response_store.h"

namespace mx::server {

// api_server.h's name for the request: the Beast message itself.
struct ApiRequest : HttpRequest {
  explicit ApiRequest(HttpRequest&& request) : HttpRequest(std::move(request)) {}
};

bool constant_time_equal(std::string_view given, std::string_view secret) {
  unsigned char diff = given.size() != secret.size() ? 1 : 0;
  for (size_t i = 0; i < secret.size(); ++i)
    diff |= static_cast<unsigned char>((i < given.size() ? given[i] : 0) ^ secret[i]);
  return diff == 0;
}

namespace {

// Generation bodies are JSON (vLLM answers 415 for anything else too); a missing Content-Type is taken
// as JSON, since some clients send none.
bool is_json_content_type(std::string_view content_type) {
  std::string_view media = content_type.substr(0, content_type.find(';'));
  while (!media.empty() && (media.front() == ' ' || media.front() == '\t')) media.remove_prefix(1);
  while (!media.empty() && (media.back() == ' ' || media.back() == '\t')) media.remove_suffix(1);
  return media.empty() || beast::iequals(beast::string_view(media.data(), media.size()), "application/json");
}

}  // namespace

// State that requests reach from their end callbacks, which may run after the server object is gone.
// The registry of live streams is the one lock of the server: shutdown must reach every request to cancel
// it, and requests come and go on every io thread.
struct ApiServer::Shared {
  Shared(const std::string& model, int64_t speculative_positions) : registry(model), metrics(&registry, speculative_positions) {}
  MetricsRegistry registry;
  ServerMetrics metrics;
  ResponseStore responses;
  std::atomic<int64_t> in_flight{0};
  std::mutex mu;
  uint64_t next_key = 0;                                                  // guarded by mu
  std::unordered_map<uint64_t, std::weak_ptr<GenerationStream>> streams;  // guarded by mu
};

ApiServer::ApiServer(const ApiServerOptions& options, CompletionService* service)
    : options_(options), service_(service), context_length_(options.context_length),
      max_running_requests_(options.max_running_requests), shared_(std::make_shared<Shared>(options.served_model_name, options.speculative_draft_tokens)),
      created_(static_cast<int64_t>(std::time(nullptr))) {}

Result<std::unique_ptr<ApiServer>> ApiServer::start(const ApiServerOptions& options, CompletionService* service) {
  if (options.served_model_name.empty()) return invalid_argument("the served model name must not be empty");
  if (options.context_length < 1) return invalid_argument("the context length must be at least 1");
  if (options.max_running_requests < 0 || options.max_queued_requests < 0)
    return invalid_argument("max running requests and max queued requests must be >= 0");
  std::unique_ptr<ApiServer> server(new ApiServer(options, service));
  ApiServer* self = server.get();
  HttpServerOptions http = options.http;
  if (options.log_requests) {
    http.access_log = [](const AccessRecord& r) {
      char seconds[32];
      std::snprintf(seconds, sizeof(seconds), "%.3fs", r.seconds);
      MX_LOG(Info) << r.client << " \"" << r.method << " " << r.target << " HTTP/" << r.version / 10 << "." << r.version % 10
                   << "\" " << r.status << " " << seconds << (r.note.empty() ? "" : " " + r.note);
    };
  }
  MX_ASSIGN_OR_RETURN(server->http_, HttpServer::start(http, [self](HttpRequest&& r, std::shared_ptr<ResponseChannel> c) {
                        self->handle(ApiRequest(std::move(r)), std::move(c));
                      }));
  return server;
}

ApiServer::~ApiServer() { drain_and_stop(); }

int ApiServer::port() const { return http_->port(); }

void ApiServer::set_ready(CompletionService* service, int64_t context_length, int64_t max_running_requests) {
  if (service) service_.store(service);
  if (context_length > 0) context_length_.store(context_length);
  if (max_running_requests > 0) max_running_requests_.store(max_running_requests);
  ServerState expected = ServerState::kLoading;
  state_.compare_exchange_strong(expected, ServerState::kReady);
}

int64_t ApiServer::in_flight() const { return shared_->in_flight.load(); }
MetricsRegistry& ApiServer::registry() { return shared_->registry; }

bool ApiServer::authorized(const ApiRequest& request) const {
  if (options_.api_key.empty()) return true;
  const std::string_view header = to_std(request[http::field::authorization]);
  constexpr std::string_view kBearer = "bearer ";
  if (header.size() < kBearer.size() || !beast::iequals(beast::string_view(header.data(), kBearer.size()), beast::string_view(kBearer.data(), kBearer.size()))) return false;
  return constant_time_equal(header.substr(kBearer.size()), options_.api_key);
}

std::string ApiServer::metrics_text() {
  const ServiceStats stats = service_.load()->stats();
  ServerMetrics& m = shared_->metrics;
  m.requests_running->set(static_cast<double>(stats.running));
  m.requests_waiting->set(static_cast<double>(stats.waiting));
  m.kv_cache_usage->set(stats.kv_cache_usage);
  m.preemptions->set(static_cast<double>(stats.preemptions_total));
  m.prefix_cache_queries->set(static_cast<double>(stats.prefix_query_tokens));
  m.prefix_cache_hits->set(static_cast<double>(stats.prefix_hit_tokens));
  if (m.spec_drafts) {
    m.spec_drafts->set(static_cast<double>(stats.spec_drafts));
    m.spec_draft_tokens->set(static_cast<double>(stats.spec_draft_tokens));
    m.spec_accepted_tokens->set(static_cast<double>(stats.spec_accepted_tokens));
    for (size_t i = 0; i < m.spec_accepted_per_pos.size() && i < stats.spec_accepted_per_pos.size(); ++i)
      m.spec_accepted_per_pos[i]->set(static_cast<double>(stats.spec_accepted_per_pos[i]));
  }
  m.lora_requests_info->set(static_cast<double>(std::time(nullptr)));
  if (stats.num_pages > 0) {
    set_cache_config(&shared_->registry, m,
                     {stats.page_size, stats.num_pages, stats.kv_cache_dtype, stats.prefix_caching, stats.mem_fraction});
  }
  return shared_->registry.render();
}

void ApiServer::handle(ApiRequest&& request, std::shared_ptr<ResponseChannel> channel) {
  const unsigned version = request.version();
  const std::string_view target = to_std(request.target());
  const std::string path(target.substr(0, target.find('?')));
  const std::string method(request.method_string());
  auto reply = [&](const ApiError& error, const std::string& allow = "") {
    channel->respond(make_error_response(error, version, allow));
  };
  auto require = [&](http::verb verb) {  // GET routes answer HEAD too (the HTTP layer drops the body)
    const bool head_of_get = verb == http::verb::get && request.method() == http::verb::head;
    if (request.method() == verb || head_of_get) return true;
    reply(ApiError::method_not_allowed(method, path), verb == http::verb::get ? "GET, HEAD" : std::string(http::to_string(verb)));
    return false;
  };

  if (path == "/health" || path == "/v1/health") {  // open even with an API key: load balancers probe it
    if (!require(http::verb::get)) return;
    const ServerState state = state_.load();
    if (state == ServerState::kLoading) return reply(ApiError::unavailable("Loading model", "loading"));
    if (state == ServerState::kDraining) return reply(ApiError::unavailable("Server is shutting down", "draining"));
    return channel->respond(make_json_response(http::status::ok, R"({"status":"ok"})", version));
  }
  if (path == "/metrics") {  // Prometheus scrapers hold no API key: open unless --metrics-require-key
    if (!options_.metrics_require_key || authorized(request)) {
      if (!require(http::verb::get)) return;
      HttpResponse res = make_json_response(http::status::ok, metrics_text(), version);
      res.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      return channel->respond(std::move(res));
    }
  }
  if (path == "/version") {  // open, as vLLM serves it
    if (!require(http::verb::get)) return;
    return channel->respond(make_json_response(http::status::ok, json_text(Json{{"version", kMxserveVersion}}), version));
  }
  if (!authorized(request)) return reply(ApiError::unauthorized());
  if (path == "/tokenize" || path == "/detokenize") {
    if (!require(http::verb::post)) return;
    return tokenize(path == "/detokenize", request, channel);
  }

  const ModelCard card{options_.served_model_name, created_, context_length_.load()};
  if (path == "/v1/models") {
    if (!require(http::verb::get)) return;
    return channel->respond(make_json_response(http::status::ok, models_body({card}), version));
  }
  if (path.rfind("/v1/models/", 0) == 0) {
    if (!require(http::verb::get)) return;
    const std::string id = path.substr(std::string("/v1/models/").size());
    if (id != card.id) return reply(ApiError::not_found("The model `" + id + "` does not exist.", "model_not_found"));
    return channel->respond(make_json_response(http::status::ok, json_text(model_json(card)), version));
  }
  const std::pair<const char*, Endpoint> kGeneration[] = {
      {"/v1/chat/completions", Endpoint::kChat}, {"/v1/completions", Endpoint::kCompletions}, {"/v1/responses", Endpoint::kResponses}};
  for (const auto& [route, endpoint] : kGeneration) {
    if (path != route) continue;
    if (!require(http::verb::post)) return;
    return generate(endpoint, request, channel);
  }
  reply(ApiError::not_found("Unknown route: " + method + " " + path, "unknown_route"));
}

void ApiServer::tokenize(bool detokenize, const ApiRequest& request, const std::shared_ptr<ResponseChannel>& channel) {
  const unsigned version = request.version();
  auto reply = [&](const ApiError& error) { channel->respond(make_error_response(error, version)); };
  if (state_.load() == ServerState::kLoading) return reply(ApiError::unavailable("The model is still loading.", "loading"));
  const std::string_view content_type = to_std(request[http::field::content_type]);
  if (!is_json_content_type(content_type))
    return reply(ApiError::unsupported_media_type(std::string(content_type.substr(0, 100))));
  Json body;
  if (auto error = parse_json_object(request.body(), &body)) return reply(*error);
  if (body.contains("model") && !body["model"].is_null()) {
    if (!body["model"].is_string()) return reply(ApiError::invalid_request("'model' must be a string.", "model"));
    if (body["model"] != options_.served_model_name) {
      ApiError e = ApiError::not_found("The model `" + body["model"].get<std::string>() + "` does not exist.", "model_not_found");
      e.param = "model";
      return reply(e);
    }
  }
  CompletionService* service = service_.load();
  if (detokenize) {
    if (!body.contains("tokens") || !body["tokens"].is_array())
      return reply(ApiError::invalid_request("'tokens' must be an array of token ids.", "tokens"));
    std::vector<int64_t> ids;
    for (size_t i = 0; i < body["tokens"].size(); ++i) {
      const Json& id = body["tokens"][i];
      if (!id.is_number_integer())
        return reply(ApiError::invalid_request("'tokens' must hold integers.", "tokens[" + std::to_string(i) + "]"));
      ids.push_back(id.get<int64_t>());
    }
    std::string text;
    if (auto error = service->detokenize(ids, &text)) return reply(*error);
    return channel->respond(make_json_response(http::status::ok, json_text(Json{{"prompt", text}}), version));
  }
  // vLLM's flags; ours always hold their defaults: o200k adds no BOS, and a chat render ends with the
  // assistant's turn opening.
  for (const char* key : {"add_special_tokens", "add_generation_prompt"}) {
    if (body.contains(key) && !body[key].is_boolean())
      return reply(ApiError::invalid_request("'" + std::string(key) + "' must be a boolean.", key));
  }
  if (body.value("add_generation_prompt", true) == false)
    return reply(ApiError::invalid_request("'add_generation_prompt': false is not supported: the chat format always "
                                           "opens the assistant's turn.", "add_generation_prompt"));
  std::optional<ChatRequest> chat;
  std::string prompt;
  if (body.contains("messages")) {
    chat.emplace();
    if (auto error = parse_chat_request(body, &*chat)) return reply(*error);
  } else if (body.contains("prompt") && body["prompt"].is_string()) {
    prompt = body["prompt"].get<std::string>();
  } else {
    return reply(ApiError::invalid_request("Give 'prompt' (a string) or 'messages'.", "prompt"));
  }
  std::vector<int32_t> ids;
  if (auto error = service->tokenize(chat, prompt, &ids)) return reply(*error);
  const Json out = {{"count", ids.size()}, {"max_model_len", context_length_.load()}, {"tokens", ids}};
  channel->respond(make_json_response(http::status::ok, json_text(out), version));
}

void ApiServer::generate(Endpoint endpoint, const ApiRequest& request, const std::shared_ptr<ResponseChannel>& channel) {
  const unsigned version = request.version();
  ServerMetrics& metrics = shared_->metrics;
  auto reply = [&](const ApiError& error) { channel->respond(make_error_response(error, version)); };

  const ServerState state = state_.load();
  if (state != ServerState::kReady) {
    metrics.rejected_requests->add();
    return reply(state == ServerState::kLoading ? ApiError::unavailable("The model is still loading.", "loading")
                                                : ApiError::unavailable("The server is shutting down.", "draining"));
  }

  const std::string_view content_type = to_std(request[http::field::content_type]);
  if (!is_json_content_type(content_type))
    return reply(ApiError::unsupported_media_type(std::string(content_type.substr(0, 100))));
  Json body;
  if (auto error = parse_json_object(request.body(), &body)) return reply(*error);
  ChatRequest chat;
  CompletionRequest completion;
  std::string previous_response_id;
  std::optional<ApiError> error;
  switch (endpoint) {
    case Endpoint::kChat: error = parse_chat_request(body, &chat); break;
    case Endpoint::kCompletions: error = parse_completion_request(body, &completion); break;
    case Endpoint::kResponses: {
      if ((error = shared_->responses.expand(&body, &previous_response_id))) break;
      ResponsesRequest responses;
      error = parse_responses_request(body, &responses);
      chat = std::move(responses.chat);
      break;
    }
  }
  if (error) return reply(*error);
  const bool is_chat = endpoint != Endpoint::kCompletions;
  if (is_chat) restore_tool_schema_order(request.body(), body, &chat.tools);
  const std::string& model = is_chat ? chat.model : completion.model;
  const SamplingOptions& sampling = is_chat ? chat.sampling : completion.sampling;
  const StreamOptions& stream_options = is_chat ? chat.stream : completion.stream;
  if (!model.empty() && model != options_.served_model_name) {
    ApiError e = ApiError::not_found("The model `" + model + "` does not exist.", "model_not_found");
    e.param = "model";
    return reply(e);
  }
  const int64_t context_length = context_length_.load();
  if (sampling.max_tokens && *sampling.max_tokens > context_length) {
    // Clients parse this sentence to shrink max_tokens and retry (litellm, agent frameworks).
    return reply(ApiError::invalid_request("This model's maximum context length is " + std::to_string(context_length) +
                                               " tokens. However, you requested " + std::to_string(*sampling.max_tokens) +
                                               " output tokens.",
                                           endpoint == Endpoint::kResponses ? "max_output_tokens" : "max_tokens",
                                           "context_length_exceeded"));
  }

  // Admission: take a slot first, give it back if over the limit, so concurrent arrivals never overshoot.
  const int64_t limit = max_running_requests_.load() + options_.max_queued_requests;
  if (shared_->in_flight.fetch_add(1) >= limit) {
    shared_->in_flight.fetch_sub(1);
    metrics.rejected_requests->add();
    return reply(ApiError::unavailable("The server is at capacity (" + std::to_string(limit) +
                                           " requests running or queued); retry later.",
                                       "queue_full"));
  }
  metrics.http_inflight->add(1);

  ResponseIdentity identity{"", options_.served_model_name, static_cast<int64_t>(std::time(nullptr))};
  std::unique_ptr<ResponseFormatter> formatter;
  switch (endpoint) {
    case Endpoint::kChat:
      identity.id = random_id("chatcmpl-");
      formatter = make_chat_formatter(identity, stream_options, sampling.n, sampling.logprobs);
      break;
    case Endpoint::kCompletions:
      identity.id = random_id("cmpl-");
      formatter = make_completion_formatter(identity, stream_options,
                                            static_cast<int64_t>(completion.prompts.size()) * sampling.n, sampling.logprobs);
      break;
    case Endpoint::kResponses:
    {
      identity.id = random_id("resp_");
      ResponsesOptions options;
      options.store = !body.contains("store") || body["store"] != false;
      options.previous_response_id = previous_response_id;
      if (options.store) {
        // The expanded input (previous conversation and references resolved) and the output are what a
        // later previous_response_id continues from.
        options.on_complete = [shared = shared_, id = identity.id, input = body["input"]](const Json& response) {
          if (response.contains("output")) shared->responses.put(id, input, response["output"]);
        };
      }
      formatter = make_responses_formatter(identity, chat, std::move(options));
    }
      break;
  }

  std::shared_ptr<Shared> shared = shared_;
  uint64_t key;
  {
    std::lock_guard<std::mutex> lock(shared->mu);
    key = shared->next_key++;
  }
  auto stream = make_generation_stream(channel, std::move(formatter), stream_options.stream, &shared->metrics, [shared, key] {
    {
      std::lock_guard<std::mutex> lock(shared->mu);
      shared->streams.erase(key);
    }
    shared->metrics.http_inflight->add(-1);
    shared->in_flight.fetch_sub(1);
  });
  {
    std::lock_guard<std::mutex> lock(shared->mu);
    shared->streams.emplace(key, stream);
  }
  CompletionService* service = service_.load();
  error = is_chat ? service->start_chat(chat, stream) : service->start_completion(completion, stream);
  if (error) stream->fail(std::move(*error));
}

void ApiServer::cancel_all() {
  std::vector<std::shared_ptr<GenerationStream>> live;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    for (auto& [key, weak] : shared_->streams)
      if (auto s = weak.lock()) live.push_back(std::move(s));
  }
  for (auto& s : live) s->cancel();
}

void ApiServer::drain_and_stop() {
  if (stopped_.exchange(true) || !http_) return;
  state_.store(ServerState::kDraining);
  http_->stop_accepting();
  using Clock = std::chrono::steady_clock;
  auto wait_until_idle = [this](Clock::time_point deadline) {
    while (shared_->in_flight.load() > 0 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return shared_->in_flight.load() == 0;
  };
  if (!wait_until_idle(Clock::now() + options_.shutdown_timeout)) {
    MX_LOG(Warning) << "shutdown: " << shared_->in_flight.load() << " requests still running after "
                    << options_.shutdown_timeout.count() << " ms; aborting them";
    cancel_all();
    if (!wait_until_idle(Clock::now() + std::chrono::seconds(5))) {
      MX_LOG(Warning) << "shutdown: " << shared_->in_flight.load() << " requests did not end after the abort";
    }
  }
  // The last responses were queued on their strands; let the io threads write them out.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  http_->stop();
}

}  // namespace mx::server
