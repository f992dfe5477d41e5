// with-redis CMD [ARGS...]: starts a throwaway redis-server on a free loopback port, runs CMD
// with REDLIMIT_URI=redis://127.0.0.1:<port> in its environment, stops the server, and exits
// with CMD's exit status. Used by `make demo` and the example tests.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <spawn.h>
#include <sys/wait.h>

#include "redlimit_test/redis_server.hpp"

extern char** environ;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: with-redis CMD [ARGS...]\n");
    return 2;
  }
  try {
    redlimit::test::RedisServer server;
    ::setenv("REDLIMIT_URI", server.uri().c_str(), 1);
    std::fprintf(stderr, "with-redis: redis-server on %s\n", server.uri().c_str());
    pid_t pid = -1;
    int rc = ::posix_spawnp(&pid, argv[1], nullptr, nullptr, argv + 1, environ);
    if (rc != 0) {
      std::fprintf(stderr, "with-redis: cannot run %s\n", argv[1]);
      return 127;
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    server.stop();
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    std::fprintf(stderr, "with-redis: %s ended by signal %d\n", argv[1], WTERMSIG(status));
    return 128 + WTERMSIG(status);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "with-redis: %s\n", e.what());
    return 1;
  }
}
