// `mxserve serve` as users run it: binds, answers, drains on SIGTERM and exits 0; bad flags are one line.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "server_test_util.h"
#include "test_util.h"

namespace mx::test {
namespace {

TEST(ServeCli, ServesThenDrainsOnSigterm) {
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const std::string binary = std::string(MX_BINARY_DIR) + "/mxserve";
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    ::close(out[0]);
    execl(binary.c_str(), binary.c_str(), "serve", "--port", "0", "--api-key", "k", "--served-model-name", "demo",
          "--shutdown-timeout", "1", "--log-level", "error", static_cast<char*>(nullptr));
    _exit(127);
  }
  ::close(out[1]);
  std::string line;
  char c;
  while (line.find('\n') == std::string::npos && ::read(out[0], &c, 1) == 1) line += c;
  ::close(out[0]);
  const size_t colon = line.rfind(':');
  ASSERT_NE(colon, std::string::npos) << line;
  const int port = std::stoi(line.substr(colon + 1));
  EXPECT_EQ(http_call(port, "GET", "/health").status, 200);
  EXPECT_EQ(http_call(port, "GET", "/v1/models").status, 401);
  const HttpReply models = http_call(port, "GET", "/v1/models", "", {"Authorization: Bearer k"});
  EXPECT_NE(models.body.find("\"id\":\"demo\""), std::string::npos) << models.body;
  // Generation is not wired yet: validated, then 501 (never a 200 with an error inside).
  const HttpReply chat = http_call(port, "POST", "/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}]})",
                                   {"Authorization: Bearer k"});
  EXPECT_EQ(chat.status, 501) << chat.body;
  kill(pid, SIGTERM);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST(ServeCli, BadFlagsAreOneLineErrors) {
  const std::pair<std::string, std::string> cases[] = {
      {"serve --port 70000", "--port must be between 0 and 65535"},
      {"serve --backend tpu", "unknown backend 'tpu'"},
      {"serve --max-running-requests 0", "--max-running-requests must be at least 1"},
      {"serve --shutdown-timeout -1", "--shutdown-timeout must be between"},
      {"serve --model /nonexistent", "no config.json there"},
      {"serve --host 256.1.1.1 --port 0", "cannot"},
  };
  for (const auto& [args, expected] : cases) {
    const auto r = run_mxserve(args);
    EXPECT_EQ(r.exit_code, 1) << args;
    EXPECT_NE(r.stderr_text.find(expected), std::string::npos) << args << " -> " << r.stderr_text;
  }
}

}  // namespace
}  // namespace mx::test
