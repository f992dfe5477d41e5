// with-redis [--cluster] CMD [ARGS...]: starts a throwaway redis-server on a free loopback port
// (with --cluster: a Redis Cluster of 3 primaries), runs CMD with REDLIMIT_URI=redis://127.0.0.1:<port>
// (redis-cluster://127.0.0.1:<p1>,...) in its environment, stops the server(s), and exits with
// CMD's exit status. Used by `make demo` and the example tests.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <spawn.h>
#include <sys/wait.h>

#include <memory>
#include <string>

#include "redlimit_test/redis_cluster.hpp"
#include "redlimit_test/redis_server.hpp"

extern char** environ;

int main(int argc, char** argv) {
  const bool cluster = argc >= 2 && std::string(argv[1]) == "--cluster";
  char** command = argv + (cluster ? 2 : 1);
  if (*command == nullptr) {
    std::fprintf(stderr, "usage: with-redis [--cluster] CMD [ARGS...]\n");
    return 2;
  }
  try {
    std::unique_ptr<redlimit::test::RedisServer> server;
    std::unique_ptr<redlimit::test::RedisCluster> nodes;
    std::string uri;
    if (cluster) {
      nodes = std::make_unique<redlimit::test::RedisCluster>(3);
      uri = nodes->seeds();
    } else {
      server = std::make_unique<redlimit::test::RedisServer>();
      uri = server->uri();
    }
    ::setenv("REDLIMIT_URI", uri.c_str(), 1);
    std::fprintf(stderr, "with-redis: %s on %s\n", cluster ? "a 3-primary cluster" : "redis-server", uri.c_str());
    pid_t pid = -1;
    int rc = ::posix_spawnp(&pid, command[0], nullptr, nullptr, command, environ);
    if (rc != 0) {
      std::fprintf(stderr, "with-redis: cannot run %s\n", command[0]);
      return 127;
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    server.reset();
    nodes.reset();
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    std::fprintf(stderr, "with-redis: %s ended by signal %d\n", command[0], WTERMSIG(status));
    return 128 + WTERMSIG(status);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "with-redis: %s\n", e.what());
    return 1;
  }
}
