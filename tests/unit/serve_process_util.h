// Talking to servers from tests without the server's headers (Boost.Beast): `mxserve serve` as a child process
// on a free port, and a raw HTTP client that sends exact bytes and reads whole responses (chunked too).
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <sys/types.h>

namespace mx::test {

// Starts the `mxserve` binary's `serve` on a free port with the demo model (cached under the build tree,
// shared with the engine tests) plus `extra` flags; returns its pid and port (0 if it printed none) once it
// serves. `max_open_files` > 0 caps the child's RLIMIT_NOFILE, soft and hard (as `ulimit -n` does). The server is
// killed when the calling thread ends (PR_SET_PDEATHSIG): call it from the test's own thread.
std::pair<pid_t, int> start_serve(const std::vector<std::string>& extra, int max_open_files = 0);
// Waits for the process and returns its exit code (-1 when a signal ended it).
int wait_exit(pid_t pid);

struct HttpReply {
  int status = 0;  // 0: no response (connection closed or timed out)
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? "" : it->second;
  }
};

// How much slower this build runs than a plain one (sanitizers): client timeouts and waits are scaled by it.
inline constexpr int kTestTimeScale = MX_TEST_TIME_SCALE;

// Polls `pred` every 5 ms for up to `limit` (scaled by kTestTimeScale); returns whether it came true. The limit only
// stops a hang (it costs nothing when `pred` comes true): on a loaded two-core machine an engine step takes a
// second or more, and an abort or a stats update lands a step or two later.
template <typename Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit = std::chrono::milliseconds(60000)) {
  limit *= kTestTimeScale;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

class RawClient {
 public:
  // `timeout_ms` (per read and write) is scaled by kTestTimeScale. It only stops a hang: a non-streamed answer
  // comes whole after its last step, which took 7-8 s for ServerMtp's 3 x 24 tokens at a load of 13 on this
  // project's two-core machine (the old 10 s failed there under heavier load; docs/TESTING.md).
  explicit RawClient(int port, int timeout_ms = 120000);
  ~RawClient();
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  bool send(const std::string& bytes);
  void shutdown_write();
  // Reads one whole response (status 0 if the connection ends or times out first).
  HttpReply read_reply();
  // Reads the status line and headers only; the body (SSE) follows through read_some.
  HttpReply read_head();
  // Raw bytes as they arrive (empty on close/timeout).
  std::string read_some();
  // True when the server has closed the connection (reads EOF within the timeout).
  bool closed_by_peer();
  void close();

 private:
  std::string recv_some();  // bytes from the socket only (empty on close/timeout)

  int fd_ = -1;
  std::string buffered_;
};

// One request on a fresh connection. `extra_headers` are full lines without CRLF.
HttpReply http_call(int port, const std::string& method, const std::string& target, const std::string& body = "",
                    const std::vector<std::string>& extra_headers = {});
std::string make_request(const std::string& method, const std::string& target, const std::string& body = "",
                         const std::vector<std::string>& extra_headers = {});
// The payloads of `data:` events in an SSE body, in order ("[DONE]" included).
std::vector<std::string> sse_payloads(const std::string& body);
// The `event:` names in an SSE body, in order.
std::vector<std::string> sse_event_names(const std::string& body);

}  // namespace mx::test
