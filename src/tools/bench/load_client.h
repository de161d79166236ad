// The load generator of `mxserve bench serve`: sends prepared streaming requests to one HTTP/1.1 server
// from a single thread of Boost.Asio/Beast, and times every token chunk as it arrives.
//
// Requests arrive as a Poisson process at `request_rate` (infinity: all at once) and wait in FIFO order for
// one of `max_concurrency` slots. Each runs on a kept-alive connection (idle ones are reused, new ones opened
// as needed), its body is read as it comes (chunked transfer decoding by Beast) and parsed incrementally as
// SSE. No thread per stream: a thousand streams are a thousand sockets on one io_context.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/status.h"
#include "tools/bench/http_url.h"

namespace mx::bench {

struct LoadRequest {
  std::string body;            // the JSON request body
  int64_t prompt_tokens = 0;   // the client's count, reported as input tokens
};

struct LoadOptions {
  HttpUrl url;
  std::string path = "/v1/completions";  // appended to url.path_prefix
  std::string api_key;                   // sent as `Authorization: Bearer` when not empty
  double request_rate = std::numeric_limits<double>::infinity();  // requests per second
  int64_t max_concurrency = 0;           // 0: no limit
  uint64_t seed = 1;                     // for the arrival times
  double idle_timeout_s = 600;           // a request fails after this long without a byte from the server
  bool progress = false;                 // a line on stderr at every 10% of completed requests
};

struct RequestResult {
  bool success = false;
  std::string error;                // why it failed (empty on success)
  double start_s = 0;               // when it was sent, from the start of the run
  double ttft_s = 0;                // send -> first chunk carrying text (0 when none came)
  double e2e_s = 0;                 // send -> end of the stream (or the failure)
  std::vector<double> itl_s;        // gaps between consecutive chunks carrying text
  int64_t prompt_tokens = 0;        // the client's count
  int64_t server_prompt_tokens = -1;  // usage.prompt_tokens, when sent
  int64_t output_tokens = 0;        // usage.completion_tokens when sent, else the chunks carrying text
  bool output_tokens_from_usage = false;
  int64_t token_chunks = 0;
};

struct LoadRun {
  std::vector<RequestResult> results;  // in the order of the requests given
  double duration_s = 0;               // first send -> last completion
  int64_t connections_opened = 0;
  double client_cpu_s = 0;             // user + system CPU of the client's thread during the run
};

// Runs every request once. Fails only when the server's address cannot be resolved; anything that goes
// wrong with one request is recorded in its RequestResult.
Result<LoadRun> run_load(const LoadOptions& options, const std::vector<LoadRequest>& requests);

// Raises the soft limit on open files to the hard limit: each concurrent stream is one socket.
void raise_open_file_limit();

}  // namespace mx::bench
