#include "serve_process_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <sstream>

#include <gtest/gtest.h>

namespace mx::test {

// ---- RawClient ----

RawClient::RawClient(int port, int timeout_ms) {
  timeout_ms *= kTestTimeScale;
  fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) close();
}

RawClient::~RawClient() { close(); }

void RawClient::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool RawClient::send(const std::string& bytes) {
  size_t sent = 0;
  while (fd_ >= 0 && sent < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return fd_ >= 0;
}

void RawClient::shutdown_write() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_WR);
}

std::string RawClient::read_some() {
  if (!buffered_.empty()) return std::exchange(buffered_, "");
  return recv_some();
}

std::string RawClient::recv_some() {
  if (fd_ < 0) return "";
  char buf[16384];
  ssize_t n;
  do {  // a stopped and continued process (a debugger, a throttled run) sees EINTR from a read with a timeout
    n = ::recv(fd_, buf, sizeof(buf), 0);
  } while (n < 0 && errno == EINTR);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

bool RawClient::closed_by_peer() {
  if (fd_ < 0) return true;
  char c;
  while (true) {
    const ssize_t n = ::recv(fd_, &c, 1, 0);
    if (n == 0) return true;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno == ECONNRESET;  // a timeout means the connection is still open
  }
}

HttpReply RawClient::read_head() {
  HttpReply reply;
  while (true) {
    size_t end;
    while ((end = buffered_.find("\r\n\r\n")) == std::string::npos) {
      std::string more = recv_some();
      if (more.empty()) return reply;
      buffered_ += more;
    }
    std::string head = buffered_.substr(0, end);
    buffered_.erase(0, end + 4);
    std::istringstream in(head);
    std::string line, version;
    std::getline(in, line);
    std::istringstream status_line(line);
    status_line >> version >> reply.status;
    reply.headers.clear();
    while (std::getline(in, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string name = line.substr(0, colon), value = line.substr(colon + 1);
      for (auto& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      while (!value.empty() && value.front() == ' ') value.erase(0, 1);
      reply.headers[name] = value;
    }
    if (reply.status != 100) return reply;  // skip interim "100 Continue"
  }
}

HttpReply RawClient::read_reply() {
  HttpReply reply = read_head();
  if (reply.status == 0) return reply;
  auto need = [&](size_t n) {
    while (buffered_.size() < n) {
      std::string more = recv_some();  // not read_some: that would hand back (and clear) buffered_ itself
      if (more.empty()) return false;
      buffered_ += more;
    }
    return true;
  };
  if (reply.header("transfer-encoding") == "chunked") {
    while (true) {
      size_t eol;
      while ((eol = buffered_.find("\r\n")) == std::string::npos)
        if (!need(buffered_.size() + 1)) return HttpReply{};
      const size_t size = std::stoul(buffered_.substr(0, eol), nullptr, 16);
      buffered_.erase(0, eol + 2);
      if (!need(size + 2)) return HttpReply{};
      reply.body += buffered_.substr(0, size);
      buffered_.erase(0, size + 2);
      if (size == 0) return reply;
    }
  }
  if (!reply.header("content-length").empty()) {
    const size_t size = std::stoul(reply.header("content-length"));
    if (!need(size)) return HttpReply{};
    reply.body = buffered_.substr(0, size);
    buffered_.erase(0, size);
    return reply;
  }
  while (true) {  // until the server closes
    std::string more = read_some();
    if (more.empty()) break;
    reply.body += more;
  }
  return reply;
}

std::string make_request(const std::string& method, const std::string& target, const std::string& body,
                         const std::vector<std::string>& extra_headers) {
  std::string r = method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  bool has_type = false;
  for (const auto& h : extra_headers) {
    r += h + "\r\n";
    has_type = has_type || strncasecmp(h.c_str(), "content-type:", 13) == 0;
  }
  if (!body.empty() || method == "POST") {
    if (!has_type) r += "Content-Type: application/json\r\n";
    r += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  }
  return r + "\r\n" + body;
}

HttpReply http_call(int port, const std::string& method, const std::string& target, const std::string& body,
                    const std::vector<std::string>& extra_headers) {
  RawClient client(port);
  client.send(make_request(method, target, body, extra_headers));
  return client.read_reply();
}

std::vector<std::string> sse_payloads(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) break;
    out.push_back(body.substr(pos + 6, end - pos - 6));
    pos = end + 2;
  }
  return out;
}

std::vector<std::string> sse_event_names(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = body.find("event: ", pos)) != std::string::npos) {
    const size_t end = body.find('\n', pos);
    out.push_back(body.substr(pos + 7, end - pos - 7));
    pos = end;
  }
  return out;
}

// ---- mxserve serve as a child process ----

std::pair<pid_t, int> start_serve(const std::vector<std::string>& extra, int max_open_files) {
  int out[2];
  EXPECT_EQ(pipe(out), 0);
  const std::string binary = std::string(MX_BINARY_DIR) + "/mxserve";
  std::vector<std::string> args = {binary, "serve", "--port", "0", "--log-level", "error", "--threads", "2"};
  args.insert(args.end(), extra.begin(), extra.end());
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    // The server dies with the test process, however that ends (a CTest timeout or a killed run would
    // otherwise leave it serving, reparented to init), and holds none of the test's descriptors (a lock
    // file that the test runner holds, other servers' pipes): only its stdout pipe.
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(125);
    dup2(out[1], 1);
    close_range(3, ~0u, 0);
    setenv("XDG_CACHE_HOME", (std::string(MX_BINARY_DIR) + "/test-cache").c_str(), 1);
    if (max_open_files > 0) {
      const rlimit cap{static_cast<rlim_t>(max_open_files), static_cast<rlim_t>(max_open_files)};
      if (setrlimit(RLIMIT_NOFILE, &cap) != 0) _exit(126);
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  ::close(out[1]);
  std::string line;
  char c;
  while (line.find('\n') == std::string::npos && ::read(out[0], &c, 1) == 1) line += c;
  ::close(out[0]);
  const size_t colon = line.rfind(':');
  EXPECT_NE(colon, std::string::npos) << line;
  return {pid, colon == std::string::npos ? 0 : std::stoi(line.substr(colon + 1))};
}

int wait_exit(pid_t pid) {
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}
}  // namespace mx::test
