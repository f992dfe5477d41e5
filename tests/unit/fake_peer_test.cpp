// FakePeer, the misbehaving server of the transport tests, checked over raw sockets (no redlimit
// code): the greeting is answered, the request after it meets the behaviour byte for byte, and
// requests pipelined or split across writes are each seen once.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "redlimit_test/fake_peer.hpp"

using redlimit::test::FakePeer;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

namespace {

const std::string kPong = "+PONG\r\n";

/// A RESP multi-bulk request.
std::string request(std::initializer_list<std::string_view> argv) {
  std::string out = "*" + std::to_string(argv.size()) + "\r\n";
  for (auto arg : argv) out += "$" + std::to_string(arg.size()) + "\r\n" + std::string(arg) + "\r\n";
  return out;
}

FakePeer::Options behaving(FakePeer::Behaviour behaviour) {
  FakePeer::Options o;
  o.behaviour = behaviour;
  return o;
}

/// Polls `condition` every 2 ms until it holds or `limit` passes.
bool eventually(const std::function<bool()>& condition, milliseconds limit = milliseconds(1000)) {
  const auto deadline = Clock::now() + limit;
  while (!condition()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(milliseconds(2));
  }
  return true;
}

/// A blocking loopback client socket with reads bounded by a time limit. Not thread-safe.
class RawClient {
 public:
  explicit RawClient(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const int one = 1;
    if (fd_ < 0 || ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0 ||
        ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ADD_FAILURE() << "cannot connect to 127.0.0.1:" << port;
    }
  }
  ~RawClient() { ::close(fd_); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  void send(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) {
        ADD_FAILURE() << "send failed";
        return;
      }
      bytes.remove_prefix(static_cast<std::size_t>(n));
    }
  }

  /// Reads until `size` bytes have arrived, the peer closes, or `limit` passes. If `arrivals` is
  /// given, it receives the time each byte was read.
  std::string read(std::size_t size, milliseconds limit, std::vector<Clock::time_point>* arrivals = nullptr) {
    std::string out;
    const auto deadline = Clock::now() + limit;
    while (out.size() < size && !closed_) {
      const auto left = std::chrono::ceil<milliseconds>(deadline - Clock::now());
      if (left.count() <= 0 || !readable(left)) break;
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, std::min(sizeof buf, size - out.size()), 0);
      if (n <= 0) {
        closed_ = true;  // EOF, or a reset
        break;
      }
      out.append(buf, static_cast<std::size_t>(n));
      if (arrivals != nullptr) arrivals->insert(arrivals->end(), static_cast<std::size_t>(n), Clock::now());
    }
    return out;
  }

  /// True if nothing arrives, not even an EOF, within `limit`.
  bool silentFor(milliseconds limit) { return !readable(limit); }

  /// True if the peer closes the connection (EOF or reset) within `limit`, discarding any bytes.
  bool closesWithin(milliseconds limit) {
    while (!closed_) {
      if (read(4096, limit).empty() && !closed_) return false;
    }
    return true;
  }

 private:
  bool readable(milliseconds limit) {
    pollfd p{fd_, POLLIN, 0};
    return ::poll(&p, 1, static_cast<int>(limit.count())) > 0;
  }

  int fd_ = -1;
  bool closed_ = false;
};

/// Connects, greets with PING and checks the +PONG.
std::unique_ptr<RawClient> greeted(const FakePeer& peer) {
  auto client = std::make_unique<RawClient>(peer.port());
  client->send(request({"PING"}));
  EXPECT_EQ(client->read(kPong.size(), milliseconds(1000)), kPong);
  return client;
}

}  // namespace

TEST(FakePeer, UriNamesTheLoopbackPort) {
  FakePeer peer(behaving(FakePeer::Behaviour::Garbage));
  EXPECT_GT(peer.port(), 0);
  EXPECT_EQ(peer.uri(), "redis://127.0.0.1:" + std::to_string(peer.port()));
}

TEST(FakePeer, NeverAnswerAnswersTheGreetingThenNothing) {
  FakePeer peer(behaving(FakePeer::Behaviour::NeverAnswer));
  auto client = greeted(peer);
  client->send(request({"PING"}));
  EXPECT_TRUE(eventually([&] { return peer.requestsSeen() == 2; }));
  EXPECT_TRUE(client->silentFor(milliseconds(300)));  // no byte and no EOF
}

TEST(FakePeer, NeverAnswerWithoutGreetingAnswersNotEvenThePing) {
  FakePeer::Options o = behaving(FakePeer::Behaviour::NeverAnswer);
  o.answerGreeting = false;
  FakePeer peer(o);
  RawClient client(peer.port());
  client.send(request({"PING"}));
  EXPECT_TRUE(eventually([&] { return peer.requestsSeen() == 1; }));
  EXPECT_TRUE(client.silentFor(milliseconds(150)));
}

TEST(FakePeer, TrickleSendsTheReplyOneByteEveryInterval) {
  FakePeer::Options o = behaving(FakePeer::Behaviour::Trickle);
  o.trickleEvery = milliseconds(20);
  FakePeer peer(o);
  auto client = greeted(peer);
  const std::string& reply = o.trickleReply;

  const auto sent = Clock::now();
  client->send(request({"GET", "k"}));
  std::vector<Clock::time_point> arrivals;
  EXPECT_EQ(client->read(reply.size(), milliseconds(3000), &arrivals), reply);
  ASSERT_EQ(arrivals.size(), reply.size());
  // Byte k (from 0) leaves k intervals after the first, which leaves after the request arrives:
  // a lower bound that a slow machine cannot break.
  for (std::size_t k = 0; k < arrivals.size(); ++k) {
    EXPECT_GE(arrivals[k] - sent, o.trickleEvery * static_cast<int>(k)) << "byte " << k;
  }
  // About len * trickleEvery in all (660 ms); the upper bound is loose for a loaded machine.
  EXPECT_LT(arrivals.back() - sent, o.trickleEvery * static_cast<int>(3 * reply.size()));
  EXPECT_TRUE(client->silentFor(milliseconds(50)));
}

TEST(FakePeer, TrickleAnswersEachPipelinedRequest) {
  FakePeer::Options o = behaving(FakePeer::Behaviour::Trickle);
  o.trickleEvery = milliseconds(1);
  FakePeer peer(o);
  RawClient client(peer.port());
  client.send(request({"PING"}) + request({"GET", "a"}) + request({"GET", "b"}) + request({"GET", "c"}));
  const std::string expected = kPong + o.trickleReply + o.trickleReply + o.trickleReply;
  EXPECT_EQ(client.read(expected.size(), milliseconds(2000)), expected);
  EXPECT_EQ(peer.requestsSeen(), 4u);
  EXPECT_TRUE(client.silentFor(milliseconds(30)));
}

TEST(FakePeer, HugeArrayHeaderSendsTheHeaderOnceAndStaysOpen) {
  FakePeer peer(behaving(FakePeer::Behaviour::HugeArrayHeader));
  auto client = greeted(peer);
  client->send(request({"PING"}));
  EXPECT_EQ(client->read(13, milliseconds(1000)), "*2147483647\r\n");
  client->send(request({"GET", "k"}));
  EXPECT_TRUE(eventually([&] { return peer.requestsSeen() == 3; }));
  EXPECT_TRUE(client->silentFor(milliseconds(50)));
}

TEST(FakePeer, HugeBulkHeaderSendsTheHeaderOnceAndStaysOpen) {
  FakePeer peer(behaving(FakePeer::Behaviour::HugeBulkHeader));
  auto client = greeted(peer);
  client->send(request({"GET", "k"}));
  EXPECT_EQ(client->read(13, milliseconds(1000)), "$2147483647\r\n");
  client->send(request({"GET", "k"}));
  EXPECT_TRUE(eventually([&] { return peer.requestsSeen() == 3; }));
  EXPECT_TRUE(client->silentFor(milliseconds(50)));
}

TEST(FakePeer, GarbageAnswersEachRequest) {
  FakePeer peer(behaving(FakePeer::Behaviour::Garbage));
  auto client = greeted(peer);
  client->send(request({"PING"}) + request({"GET", "k"}));
  EXPECT_EQ(client->read(20, milliseconds(1000)), "!garbage\r\n!garbage\r\n");
  EXPECT_TRUE(client->silentFor(milliseconds(30)));
}

TEST(FakePeer, CloseMidReplySendsHalfABulkThenCloses) {
  FakePeer peer(behaving(FakePeer::Behaviour::CloseMidReply));
  auto client = greeted(peer);
  client->send(request({"PING"}));
  EXPECT_EQ(client->read(100, milliseconds(1000)), "$10\r\nabcde");  // stops at the EOF
  EXPECT_TRUE(client->closesWithin(milliseconds(1)));
}

TEST(FakePeer, DeepNestingAnswersEachRequestWithNineArrays) {
  FakePeer peer(behaving(FakePeer::Behaviour::DeepNesting));
  auto client = greeted(peer);
  const std::string nested = "*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n";
  client->send(request({"PING"}) + request({"EVALSHA", "abc", "0"}));
  EXPECT_EQ(client->read(2 * nested.size(), milliseconds(1000)), nested + nested);
  EXPECT_TRUE(client->silentFor(milliseconds(30)));
}

TEST(FakePeer, GreetingCommandsAreAnsweredUntilTheFirstOtherRequest) {
  FakePeer peer(behaving(FakePeer::Behaviour::Garbage));
  RawClient client(peer.port());
  client.send(request({"AUTH", "user", "secret"}) + request({"select", "3"}) + request({"CLIENT", "SETNAME", "me"}) +
              request({"PING", "hi"}) + request({"PING"}) + request({"HELLO", "2"}));
  const std::string greeting = "+OK\r\n+OK\r\n+OK\r\n$2\r\nhi\r\n" + kPong;
  EXPECT_EQ(client.read(greeting.size(), milliseconds(1000)), greeting);
  EXPECT_EQ(client.read(5, milliseconds(1000)), "*14\r\n");  // HELLO's map as a RESP2 array
  EXPECT_TRUE(eventually([&] { return peer.requestsSeen() == 6; }));
  client.read(4096, milliseconds(30));  // the rest of HELLO's reply

  // A non-greeting request ends the greeting: PING and AUTH meet the behaviour from then on.
  client.send(request({"GET", "k"}) + request({"PING", "new"}) + request({"AUTH", "other"}));
  EXPECT_EQ(client.read(30, milliseconds(1000)), "!garbage\r\n!garbage\r\n!garbage\r\n");
}

TEST(FakePeer, HelloThreeIsRefused) {
  FakePeer peer(behaving(FakePeer::Behaviour::Garbage));
  RawClient client(peer.port());
  client.send(request({"HELLO", "3"}));
  const std::string refusal = "-NOPROTO sorry, this protocol version is not supported.\r\n";
  EXPECT_EQ(client.read(refusal.size(), milliseconds(1000)), refusal);
}

TEST(FakePeer, RequestsSplitAcrossWritesAreAnsweredWhenComplete) {
  FakePeer peer(behaving(FakePeer::Behaviour::Garbage));
  RawClient client(peer.port());
  const std::string both = request({"PING"}) + request({"GET", "key"});
  // Cut inside the first header, inside a bulk header, inside a bulk and inside the final "\r\n".
  const std::size_t cuts[] = {1, 5, 10, 17, 26, both.size() - 1, both.size()};
  const std::string expected = kPong + "!garbage\r\n";
  std::size_t from = 0;
  std::string got;
  for (std::size_t cut : cuts) {
    client.send(std::string_view(both).substr(from, cut - from));
    from = cut;
    got += client.read(expected.size() - got.size(), milliseconds(cut == both.size() ? 1000 : 15));
    // A request counts (and is answered) once its last byte is in, not before.
    const std::size_t complete = cut < 14 ? 0 : cut < both.size() ? 1 : 2;
    EXPECT_TRUE(eventually([&] { return peer.requestsSeen() >= complete; }));
    EXPECT_EQ(peer.requestsSeen(), complete) << "after " << cut << " bytes";
  }
  EXPECT_EQ(got, expected);
}

TEST(FakePeer, InlineCommandsAreRequestsToo) {
  FakePeer peer(behaving(FakePeer::Behaviour::Garbage));
  RawClient client(peer.port());
  client.send("PING\r\n\r\nGET k\n");  // the blank line is no request
  EXPECT_EQ(client.read(17, milliseconds(1000)), kPong + "!garbage\r\n");
  EXPECT_EQ(peer.requestsSeen(), 2u);
}

TEST(FakePeer, MalformedRequestClosesTheConnection) {
  FakePeer peer(behaving(FakePeer::Behaviour::NeverAnswer));
  RawClient client(peer.port());
  client.send("*1\r\n#4\r\nPING\r\n");
  EXPECT_TRUE(client.closesWithin(milliseconds(1000)));
  EXPECT_EQ(peer.requestsSeen(), 0u);
}

TEST(FakePeer, CountsConnectionsAndRequests) {
  FakePeer peer(behaving(FakePeer::Behaviour::NeverAnswer));
  EXPECT_EQ(peer.connectionsAccepted(), 0u);
  EXPECT_EQ(peer.requestsSeen(), 0u);
  auto first = greeted(peer);
  auto second = greeted(peer);
  RawClient silent(peer.port());
  first->send(request({"GET", "a"}) + request({"GET", "b"}));
  EXPECT_TRUE(eventually([&] { return peer.connectionsAccepted() == 3 && peer.requestsSeen() == 4; }));
  EXPECT_EQ(peer.connectionsAccepted(), 3u);
  EXPECT_EQ(peer.requestsSeen(), 4u);
}

TEST(FakePeer, DestructorClosesEveryConnectionPromptly) {
  auto peer = std::make_unique<FakePeer>(behaving(FakePeer::Behaviour::NeverAnswer));
  auto first = greeted(*peer);
  auto second = greeted(*peer);
  const auto start = Clock::now();
  peer.reset();
  EXPECT_LT(Clock::now() - start, milliseconds(500));
  EXPECT_TRUE(first->closesWithin(milliseconds(1000)));
  EXPECT_TRUE(second->closesWithin(milliseconds(1000)));
}
