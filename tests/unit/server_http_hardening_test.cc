// HTTP framing and connection hardening: request smuggling shapes of Transfer-Encoding are refused and the
// connection closed (nothing after them runs), Host is required once in HTTP/1.1, absolute-form targets are
// routed by their path, HEAD answers GET routes without a body, 401 carries a challenge, and a flood of
// idle connections under a low open-file limit cannot lock a health probe out.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/resource.h>

#include <memory>
#include <vector>

#include "server/http_server.h"  // origin_form_target
#include "server_test_util.h"

namespace mx::test {
namespace {

using namespace std::chrono_literals;

// Each shape carries a second request as its "body": a server that framed the first by anything but
// chunked or Content-Length would run that second request.
TEST(ServerHttpHardening, AmbiguousTransferEncodingIs400AndCloses) {
  TestServer server;
  const std::string smuggled = make_request("GET", "/v1/models");
  const struct {
    const char* name;
    std::string head;
    int status;
  } cases[] = {
      {"identity", "Transfer-Encoding: identity\r\n", 400},
      {"gzip", "Transfer-Encoding: gzip\r\n", 400},
      {"chunked, identity", "Transfer-Encoding: chunked, identity\r\n", 400},
      {"xchunked with Content-Length", "Transfer-Encoding: xchunked\r\nContent-Length: " + std::to_string(smuggled.size()) + "\r\n", 400},
      {"chunked split over two fields, then identity", "Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n", 400},
      {"gzip, chunked (unsupported coding)", "Transfer-Encoding: gzip, chunked\r\n", 501},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    RawClient client(server.port());
    ASSERT_TRUE(client.send("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + c.head +
                            "\r\n" + smuggled));
    const HttpReply reply = client.read_reply();
    EXPECT_EQ(reply.status, c.status) << reply.body;
    EXPECT_EQ(reply.header("connection"), "close");
    EXPECT_TRUE(client.closed_by_peer()) << "a second response followed: the body ran as a request";
  }
  // The server goes on.
  EXPECT_EQ(http_call(server.port(), "GET", "/health").status, 200);
}

TEST(ServerHttpHardening, ChunkedWithContentLengthAndHttp10TransferEncodingAreRefused) {
  TestServer server;
  {
    RawClient client(server.port());
    ASSERT_TRUE(client.send("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
                            "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"));
    EXPECT_EQ(client.read_reply().status, 400);
    EXPECT_TRUE(client.closed_by_peer());
  }
  {
    RawClient client(server.port());
    ASSERT_TRUE(client.send("POST /v1/chat/completions HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"));
    EXPECT_EQ(client.read_reply().status, 400);
    EXPECT_TRUE(client.closed_by_peer());
  }
}

TEST(ServerHttpHardening, HostIsRequiredOnceInHttp11) {
  TestServer server;
  const struct {
    const char* name;
    std::string bytes;
    int status;
  } cases[] = {
      {"no Host", "GET /health HTTP/1.1\r\n\r\n", 400},
      {"two Hosts", "GET /health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400},
      {"Host with a path", "GET /health HTTP/1.1\r\nHost: a/b\r\n\r\n", 400},
      {"Host with userinfo", "GET /health HTTP/1.1\r\nHost: u@a\r\n\r\n", 400},
      {"HTTP/1.0 without Host", "GET /health HTTP/1.0\r\n\r\n", 200},
      {"Host with a port", "GET /health HTTP/1.1\r\nHost: [::1]:8000\r\nConnection: close\r\n\r\n", 200},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    RawClient client(server.port());
    ASSERT_TRUE(client.send(c.bytes));
    EXPECT_EQ(client.read_reply().status, c.status);
    if (c.status == 400) {
      EXPECT_TRUE(client.closed_by_peer());
    }
  }
}

TEST(ServerHttpHardening, AbsoluteFormTargetsAreRoutedByTheirPath) {
  TestServer server;
  EXPECT_EQ(http_call(server.port(), "GET", "http://127.0.0.1/v1/models").status, 200);
  EXPECT_EQ(http_call(server.port(), "GET", "HTTP://localhost:8000/health?probe=1").status, 200);
  EXPECT_EQ(http_call(server.port(), "GET", "https://example.com").status, 404);  // path "/"
  EXPECT_EQ(server::origin_form_target("http://h:1/a/b?c=d"), "/a/b?c=d");
  EXPECT_EQ(server::origin_form_target("http://h?x"), "/?x");
}

TEST(ServerHttpHardening, HeadAnswersGetRoutesWithoutABody) {
  TestServer server;
  RawClient client(server.port());
  ASSERT_TRUE(client.send(make_request("HEAD", "/health")));
  // Only the head comes back; the Content-Length is the GET body's.
  const HttpReply head = client.read_head();
  EXPECT_EQ(head.status, 200);
  const HttpReply get = http_call(server.port(), "GET", "/health");
  EXPECT_EQ(head.header("content-length"), std::to_string(get.body.size()));
  // The connection stays usable: the next response starts right after the head (no body bytes between).
  ASSERT_TRUE(client.send(make_request("GET", "/v1/models")));
  EXPECT_EQ(client.read_reply().status, 200);

  RawClient post_route(server.port());
  ASSERT_TRUE(post_route.send(make_request("HEAD", "/v1/chat/completions")));
  EXPECT_EQ(post_route.read_head().status, 405);
  EXPECT_EQ(http_call(server.port(), "POST", "/health", "{}").header("allow"), "GET, HEAD");
}

TEST(ServerHttpHardening, UnauthorizedCarriesABearerChallenge) {
  auto options = TestServer::default_options();
  options.api_key = "secret";
  TestServer server(options);
  const HttpReply r = http_call(server.port(), "GET", "/v1/models");
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(r.header("www-authenticate").rfind("Bearer", 0), 0u) << r.header("www-authenticate");
}

// The real binary under `ulimit -n` (soft and hard): far more idle connections than descriptors. The
// oldest idle ones are shed so that a health probe queued behind them still gets its answer.
TEST(ServerHttpHardening, IdleConnectionFloodUnderLowFileLimitLeavesHealthAnswering) {
  if (MX_TEST_SANITIZED) {
    // UBSan's vptr check probes memory through a pipe; at the descriptor limit it cannot make one and
    // reports a false "invalid vptr" (seen on the first weak_ptr::lock). The plain build runs this test.
    GTEST_SKIP() << "needs free descriptors that the sanitizer runtime takes at the limit";
  }
  rlimit own{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &own), 0);
  if (own.rlim_cur < own.rlim_max) {  // this process holds the client ends: take what the hard limit allows
    rlimit raised = own;
    raised.rlim_cur = own.rlim_max;
    setrlimit(RLIMIT_NOFILE, &raised);
    getrlimit(RLIMIT_NOFILE, &own);
  }
  // As in the issue (ulimit -n 1024, 2000 idle clients) when this process may hold that many sockets;
  // otherwise the same ratio, smaller.
  const int64_t client_budget = own.rlim_cur == RLIM_INFINITY ? 1 << 20 : static_cast<int64_t>(own.rlim_cur) - 64;
  const int server_limit = static_cast<int>(std::min<int64_t>(1024, client_budget / 2));
  const int idle_count = 2 * server_limit - 48;
  ASSERT_GT(server_limit, 64) << "the open-file limit here is too low for this test";

  auto [pid, port] = start_serve({"--max-running-requests", "2"}, server_limit);
  ASSERT_GT(port, 0);
  std::vector<std::unique_ptr<RawClient>> idle;
  idle.reserve(static_cast<size_t>(idle_count));
  for (int i = 0; i < idle_count; ++i) idle.push_back(std::make_unique<RawClient>(port, 20000));

  RawClient probe(port, 20000);
  ASSERT_TRUE(probe.send(make_request("GET", "/health")));
  EXPECT_EQ(probe.read_reply().status, 200) << "health probe locked out by " << idle_count << " idle connections";
  // And a fresh connection after that too.
  EXPECT_EQ(http_call(port, "GET", "/health").status, 200);

  idle.clear();
  kill(pid, SIGTERM);
  EXPECT_EQ(wait_exit(pid), 0);
}

}  // namespace
}  // namespace mx::test
