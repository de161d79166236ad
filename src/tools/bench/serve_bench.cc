#include "tools/bench/serve_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "tools/bench/openai_stream.h"

namespace mx::bench {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

std::string endpoint_path(const std::string& endpoint) {
  return endpoint == "chat" ? "/v1/chat/completions" : "/v1/completions";
}

Result<std::string> fetch_model_id(const HttpUrl& url, const std::string& api_key, double timeout_s) {
  const std::string where = url.to_string() + "/v1/models";
  net::io_context ioc;
  tcp::resolver resolver(ioc);
  beast::tcp_stream stream(ioc);
  beast::error_code ec;
  auto endpoints = resolver.resolve(url.host, std::to_string(url.port), ec);
  if (ec) return io_error("cannot resolve " + url.host + ": " + ec.message());
  stream.expires_after(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  stream.connect(endpoints, ec);
  if (ec) return io_error("cannot connect to " + url.host_header + ": " + ec.message());
  http::request<http::empty_body> request(http::verb::get, url.target("/v1/models"), 11);
  request.set(http::field::host, url.host_header);
  request.set(http::field::user_agent, "mxserve-bench");
  if (!api_key.empty()) request.set(http::field::authorization, "Bearer " + api_key);
  http::write(stream, request, ec);
  beast::flat_buffer buffer;
  http::response<http::string_body> response;
  if (!ec) http::read(stream, buffer, response, ec);
  if (ec) return io_error("GET " + where + ": " + ec.message());
  if (response.result_int() != 200)
    return io_error("GET " + where + ": HTTP " + std::to_string(response.result_int()) + ": " +
                    error_message_from_body(response.body()) + " (pass --model to skip this)");
  const auto list = nlohmann::json::parse(response.body(), nullptr, /*allow_exceptions=*/false);
  if (list.is_object() && list.contains("data") && list["data"].is_array() && !list["data"].empty() &&
      list["data"][0].is_object() && list["data"][0].contains("id") && list["data"][0]["id"].is_string())
    return list["data"][0]["id"].get<std::string>();
  return io_error("GET " + where + " lists no model (pass --model)");
}

std::string make_request_body(const ServeBenchOptions& options, const std::string& prompt, int64_t max_tokens) {
  nlohmann::json body = {
      {"model", options.model},
      {"max_tokens", max_tokens},
      {"temperature", 0.0},
      {"stream", true},
      {"stream_options", {{"include_usage", true}}},
  };
  if (options.ignore_eos) body["ignore_eos"] = true;
  if (options.endpoint == "chat") {
    body["messages"] = nlohmann::json::array({{{"role", "user"}, {"content", prompt}}});
  } else {
    body["prompt"] = prompt;
  }
  if (options.extra_body.is_object()) body.merge_patch(options.extra_body);
  return body.dump();
}

Result<ServeBenchRun> run_serve_bench(const ServeBenchOptions& options, const std::vector<BenchPrompt>& prompts,
                                      const std::vector<BenchPrompt>& warmup_prompts) {
  LoadOptions load;
  load.url = options.url;
  load.path = endpoint_path(options.endpoint);
  load.api_key = options.api_key;
  load.idle_timeout_s = options.idle_timeout_s;
  ServeBenchRun out;
  if (options.warmup_requests > 0 && warmup_prompts.empty())
    return invalid_argument("warm-up requests need their own prompts (a measured prompt sent as warm-up would be a "
                            "prefix-cache hit when measured)");
  if (options.warmup_requests > 0) {
    std::vector<LoadRequest> warmup;
    for (int64_t i = 0; i < options.warmup_requests; ++i) {
      const BenchPrompt& w = warmup_prompts[static_cast<size_t>(i) % warmup_prompts.size()];
      warmup.push_back({make_request_body(options, w.text, std::min<int64_t>(w.output_len, 32)), w.prompt_tokens});
    }
    MX_ASSIGN_OR_RETURN(LoadRun warm, run_load(load, warmup));
    for (const RequestResult& r : warm.results) {
      if (r.success) continue;
      if (out.warmup_failed++ == 0) out.warmup_error = r.error;
    }
    if (options.progress && out.warmup_failed > 0)
      std::fprintf(stderr, "warning: %lld of %lld warm-up requests failed: %s\n", static_cast<long long>(out.warmup_failed),
                   static_cast<long long>(options.warmup_requests), out.warmup_error.c_str());
  }
  std::vector<LoadRequest> requests;
  requests.reserve(prompts.size());
  for (const BenchPrompt& p : prompts) requests.push_back({make_request_body(options, p.text, p.output_len), p.prompt_tokens});
  load.request_rate = options.request_rate;
  load.max_concurrency = options.max_concurrency;
  load.seed = options.seed;
  load.progress = options.progress;
  MX_ASSIGN_OR_RETURN(out.run, run_load(load, requests));
  return out;
}

}  // namespace mx::bench
