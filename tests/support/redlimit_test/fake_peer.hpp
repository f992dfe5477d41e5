// Test fixture: a fake Redis server on a loopback port that lets a client connect and then
// misbehaves in one chosen way (never answers, answers slowly, sends impossible or broken replies),
// for tests of the transport's whole-request deadline and its reply limits.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <string>
#include <thread>

namespace redlimit::test {

/// A loopback TCP server that speaks just enough RESP to let a client connect, then misbehaves
/// in one chosen way. Runs its own thread; accepts any number of connections; stops and joins in
/// the destructor (closing every connection). Thread-safe to query.
///
/// Requests are RESP multi-bulk arrays (or inline commands, as redis-cli sends), parsed
/// incrementally: pipelined requests and requests split across reads are each seen once, when
/// complete. A request that is not valid RESP closes its connection without an answer.
/// The peer never blocks in a write: bytes the client's socket buffer cannot take are dropped.
///
/// The greeting: while a connection has sent only PING, AUTH, SELECT, HELLO and CLIENT requests,
/// none of them twice (the same arguments), they are answered as a server without a password
/// would (+PONG, or PING's argument as a bulk; +OK; HELLO's RESP2 map, or -NOPROTO to any version
/// but 2). The first other request, or the first repeat, ends the greeting: it and every later
/// request meet the behaviour. So a second PING misbehaves, but a PING after a greeting of AUTH
/// alone is new and still answered: to make it misbehave, send another request first or turn
/// answerGreeting off.
class FakePeer {
 public:
  enum class Behaviour {
    NeverAnswer,      // reads requests, never writes a byte (not even to the greeting unless answerGreeting)
    Trickle,          // answers each request with trickleReply, one byte every trickleEvery
    HugeArrayHeader,  // answers the first request with "*2147483647\r\n", then nothing more (stays open)
    HugeBulkHeader,   // answers the first request with "$2147483647\r\n", then nothing more (stays open)
    Garbage,          // answers each request with bytes that are not RESP ("!garbage\r\n")
    CloseMidReply,    // answers the first request with half a bulk reply ("$10\r\nabcde"), then closes
    DeepNesting,      // answers each request with 9 nested arrays ("*1\r\n" x 9, then ":1\r\n")
  };

  struct Options {
    Behaviour behaviour = Behaviour::NeverAnswer;  // what requests after the greeting meet
    bool answerGreeting = true;                    // answer the greeting as Redis would (class comment)
    std::chrono::milliseconds trickleEvery{150};   // Trickle: pause before each byte after the first, ms
    std::string trickleReply = "$26\r\nabcdefghijklmnopqrstuvwxyz\r\n";  // Trickle: the reply, raw RESP
  };

  /// Listens on 127.0.0.1 on a free port and starts serving. Throws std::runtime_error if the
  /// socket cannot be set up.
  explicit FakePeer(Options options);
  /// Stops the thread (within about 20 ms) and closes the listener and every connection.
  ~FakePeer();
  FakePeer(const FakePeer&) = delete;
  FakePeer& operator=(const FakePeer&) = delete;

  [[nodiscard]] int port() const noexcept { return port_; }
  /// redis://127.0.0.1:<port>
  [[nodiscard]] std::string uri() const;
  /// Connections accepted so far (a client's connect() can return before the peer accepts).
  [[nodiscard]] std::size_t connectionsAccepted() const noexcept { return connections_.load(); }
  /// Complete requests parsed so far on all connections, greeting included; counted before the
  /// request is answered, so a client that has read an answer sees its request counted.
  [[nodiscard]] std::size_t requestsSeen() const noexcept { return requests_.load(); }

 private:
  void run();

  Options options_;
  int listenFd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<std::size_t> connections_{0};
  std::atomic<std::size_t> requests_{0};
  std::thread thread_;
};

}  // namespace redlimit::test
