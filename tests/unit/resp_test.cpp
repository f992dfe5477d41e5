// The RESP2 codec (src/codec/resp.cpp): bytes in, replies out, no server.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <dlfcn.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include "redlimit/errors.hpp"
#include "redlimit/options.hpp"
#include "codec/resp.hpp"

using namespace redlimit;
using detail::appendCommand;
using detail::checkLimits;
using detail::Reply;
using detail::ReplyParser;
using detail::WireReply;
using namespace std::string_literals;

namespace {

// A reply as text, so that a test compares one exact string: nil, :3, $"abc", +"OK", [a, b];
// bytes outside printable ASCII as \xHH.
std::string show(const Reply& r) {
  auto quoted = [](const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
      const auto u = static_cast<unsigned char>(c);
      if (u >= 0x20 && u < 0x7f && c != '"' && c != '\\') {
        out += c;
      } else {
        out += fmt::format("\\x{:02x}", u);
      }
    }
    return out + "\"";
  };
  switch (r.type) {
    case Reply::Type::Nil:
      return "nil";
    case Reply::Type::Integer:
      return fmt::format(":{}", r.integer);
    case Reply::Type::String:
      return "$" + quoted(r.str);
    case Reply::Type::Status:
      return "+" + quoted(r.str);
    case Reply::Type::Array: {
      std::string out = "[";
      for (std::size_t i = 0; i < r.elements.size(); ++i) out += (i == 0 ? "" : ", ") + show(r.elements[i]);
      return out + "]";
    }
  }
  return "?";
}

std::string show(const WireReply& w) {
  return w.isError ? "-" + w.error + (w.value.isNil() ? "" : " (value set)") : show(w.value);
}

void feed(ReplyParser& p, std::string_view bytes) { p.feed(bytes.data(), bytes.size()); }

// Every reply `bytes` hold (fed in one chunk), shown; "..." at the end if bytes are left waiting.
std::vector<std::string> parseAll(std::string_view bytes, const ClientOptions::ReplyLimits& limits = {}) {
  ReplyParser p(limits);
  feed(p, bytes);
  std::vector<std::string> out;
  while (auto r = p.next()) out.push_back(show(*r));
  return out;
}

// The one reply `bytes` hold, shown.
std::string parseOne(std::string_view bytes, const ClientOptions::ReplyLimits& limits = {}) {
  const auto all = parseAll(bytes, limits);
  if (all.size() != 1) return fmt::format("{} replies", all.size());
  return all.front();
}

// The message of the IoError of kind Protocol `f` throws, or a note that it threw none.
std::string protocolError(const std::function<void()>& f) {
  try {
    f();
  } catch (const IoError& e) {
    if (e.kind() == ErrorKind::Protocol) return e.what();
    return fmt::format("an IoError of another kind than Protocol: {}", e.what());
  } catch (const std::exception& e) {
    return fmt::format("not an IoError of kind Protocol: {}", e.what());
  }
  return "no exception";
}

// Feeds `bytes` and reads until the parser wants more; the IoError (Protocol)'s message.
std::string parseError(std::string_view bytes, const ClientOptions::ReplyLimits& limits = {}) {
  ReplyParser p(limits);
  return protocolError([&] {
    feed(p, bytes);
    while (p.next()) {
    }
  });
}

ClientOptions::ReplyLimits limitsWith(std::size_t maxBulkBytes, std::size_t maxElements, int maxDepth) {
  ClientOptions::ReplyLimits l;
  l.maxBulkBytes = maxBulkBytes;
  l.maxElements = maxElements;
  l.maxDepth = maxDepth;
  return l;
}

std::string nested(int depth, std::string_view leaf) {
  std::string s;
  for (int i = 0; i < depth; ++i) s += "*1\r\n";
  return s += leaf;
}

}  // namespace

TEST(Resp, EveryReplyType) {
  EXPECT_EQ(parseOne("+OK\r\n"), R"(+"OK")");
  EXPECT_EQ(parseOne("+\r\n"), R"(+"")");
  EXPECT_EQ(parseOne(":42\r\n"), ":42");
  EXPECT_EQ(parseOne(":-9223372036854775808\r\n"), ":-9223372036854775808");
  EXPECT_EQ(parseOne(":9223372036854775807\r\n"), ":9223372036854775807");
  EXPECT_EQ(parseOne("$5\r\nhello\r\n"), R"($"hello")");
  EXPECT_EQ(parseOne("$0\r\n\r\n"), R"($"")");
  EXPECT_EQ(parseOne("$6\r\na\0\r\nb\xff\r\n"s), R"($"a\x00\x0d\x0ab\xff")");
  EXPECT_EQ(parseOne("$-1\r\n"), "nil");
  EXPECT_EQ(parseOne("*3\r\n:1\r\n$1\r\nx\r\n+s\r\n"), R"([:1, $"x", +"s"])");
  EXPECT_EQ(parseOne("*0\r\n"), "[]");
  EXPECT_EQ(parseOne("*-1\r\n"), "nil");
  EXPECT_EQ(parseOne("-ERR unknown command 'FOO'\r\n"), "-ERR unknown command 'FOO'");
}

TEST(Resp, NestedReplyFedByteByByte) {
  const std::string bytes = "*4\r\n*2\r\n:1\r\n$3\r\nabc\r\n*-1\r\n*1\r\n*0\r\n$-1\r\n";
  ReplyParser p(ClientOptions::ReplyLimits{});
  std::size_t waited = 0;
  std::optional<WireReply> reply;
  for (char c : bytes) {
    ASSERT_FALSE(reply) << "a reply before the last byte";
    p.feed(&c, 1);
    reply = p.next();
    if (!reply) ++waited;
  }
  EXPECT_EQ(waited, bytes.size() - 1);
  ASSERT_TRUE(reply);
  EXPECT_EQ(show(*reply), R"([[:1, $"abc"], nil, [[]], nil])");
  EXPECT_FALSE(p.next());
}

TEST(Resp, SeveralRepliesInOneChunkComeInOrder) {
  const auto all = parseAll("+a\r\n:2\r\n$1\r\nc\r\n-ERR d\r\n*1\r\n:5\r\n$-1\r\n:7");
  EXPECT_EQ(all, (std::vector<std::string>{R"(+"a")", ":2", R"($"c")", "-ERR d", "[:5]", "nil"}));
}

TEST(Resp, WaitsForTheRestOfAReply) {
  ReplyParser p(ClientOptions::ReplyLimits{});
  feed(p, "$5\r\nhel");
  EXPECT_FALSE(p.next());
  feed(p, "lo\r");
  EXPECT_FALSE(p.next());
  feed(p, "\n*2\r\n:1");
  auto r = p.next();
  ASSERT_TRUE(r);
  EXPECT_EQ(show(*r), R"($"hello")");
  EXPECT_FALSE(p.next());
  feed(p, "\r\n:2\r\n");
  r = p.next();
  ASSERT_TRUE(r);
  EXPECT_EQ(show(*r), "[:1, :2]");
  EXPECT_FALSE(p.next());
}

TEST(Resp, TopLevelErrorReply) {
  ReplyParser p(ClientOptions::ReplyLimits{});
  feed(p, "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n+OK\r\n");
  auto r = p.next();
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->isError);
  EXPECT_EQ(r->error, "WRONGTYPE Operation against a key holding the wrong kind of value");
  EXPECT_TRUE(r->value.isNil());
  r = p.next();
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->isError);
  EXPECT_EQ(show(*r), R"(+"OK")");
}

TEST(Resp, NestedErrorMakesTheWholeReplyAnError) {
  // EXEC answers an array in which a failed command is an error reply; the first one speaks.
  const auto all = parseAll("*3\r\n:1\r\n-ERR first\r\n*1\r\n-ERR second\r\n*1\r\n*1\r\n-DEEP one\r\n:4\r\n");
  EXPECT_EQ(all, (std::vector<std::string>{"-ERR first", "-DEEP one", ":4"}));
}

TEST(Resp, NilBulkAndNilArray) {
  EXPECT_EQ(parseAll("$-1\r\n*-1\r\n*3\r\n$-1\r\n*-1\r\n$0\r\n\r\n"),
            (std::vector<std::string>{"nil", "nil", R"([nil, nil, $""])"}));
}

TEST(Resp, ManyRepliesInSmallChunks) {
  // More than hiredis's 1 KiB compaction threshold and its 16 KiB maxbuf, fed 7 bytes at a time.
  std::string bytes;
  std::vector<std::string> expected;
  for (int i = 0; i < 400; ++i) {
    const std::string payload(40, static_cast<char>('a' + i % 26));
    bytes += fmt::format("$40\r\n{}\r\n*2\r\n:{}\r\n+s{}\r\n", payload, i, i);
    expected.push_back(fmt::format("$\"{}\"", payload));
    expected.push_back(fmt::format("[:{}, +\"s{}\"]", i, i));
  }
  ReplyParser p(limitsWith(40, 2, 1));  // every reply exactly at its limits
  std::vector<std::string> got;
  for (std::size_t at = 0; at < bytes.size(); at += 7) {
    p.feed(bytes.data() + at, std::min<std::size_t>(7, bytes.size() - at));
    while (auto r = p.next()) got.push_back(show(*r));
  }
  EXPECT_EQ(got, expected);
}

TEST(Resp, AnyChunkingGivesTheSameReplies) {
  const std::string bytes =
      "*3\r\n$3\r\nfoo\r\n*2\r\n:-7\r\n$-1\r\n+OK\r\n-ERR x y\r\n$10\r\n0123456789\r\n*0\r\n*-1\r\n"
      ":0\r\n*2\r\n*1\r\n-NOSCRIPT no\r\n:1\r\n$2\r\n\r\n\r\n";
  const std::vector<std::string> expected{R"([$"foo", [:-7, nil], +"OK"])",
                                          "-ERR x y",
                                          R"($"0123456789")",
                                          "[]",
                                          "nil",
                                          ":0",
                                          "-NOSCRIPT no",
                                          R"($"\x0d\x0a")"};
  ASSERT_EQ(parseAll(bytes), expected);
  std::mt19937 random(12345);
  for (int round = 0; round < 200; ++round) {
    ReplyParser p(ClientOptions::ReplyLimits{});
    std::vector<std::string> got;
    std::size_t at = 0;
    while (at < bytes.size()) {
      const std::size_t n = std::min<std::size_t>(bytes.size() - at, random() % 9 + 1);
      p.feed(bytes.data() + at, n);
      at += n;
      while (auto r = p.next()) got.push_back(show(*r));
    }
    ASSERT_EQ(got, expected) << "round " << round;
  }
}

TEST(Resp, GarbageThrowsWithHiredisText) {
  EXPECT_EQ(parseError("!oops\r\n"),
            R"(redlimit: bytes that are not RESP2: Protocol error, got "!" as reply type byte)");
  EXPECT_EQ(parseError("+OK\r\n\x16\x03\x01"),
            R"(redlimit: bytes that are not RESP2: Protocol error, got "\x16" as reply type byte)");
  EXPECT_EQ(parseError("$abc\r\n"), "redlimit: bytes that are not RESP2: Bad bulk string length");
  EXPECT_EQ(parseError("$-2\r\n"), "redlimit: bytes that are not RESP2: Bulk string length out of range");
  EXPECT_EQ(parseError(":12x\r\n"), "redlimit: bytes that are not RESP2: Bad integer value");
  EXPECT_EQ(parseError("*-2\r\n"), "redlimit: bytes that are not RESP2: Multi-bulk length out of range");
  EXPECT_EQ(parseError("*x\r\n"), "redlimit: bytes that are not RESP2: Bad multi-bulk length");
  // hiredis 0.14 does not look at the two bytes after a bulk payload; the parser does.
  EXPECT_EQ(parseError("$1\r\nab\r\n"),
            "redlimit: bytes that are not RESP2: a bulk string of 1 bytes is not followed by CRLF");
}

TEST(Resp, Resp3IsRefusedAlikeOnEveryHiredis) {
  // hiredis 0.14 refuses RESP3's type bytes; 1.x reads them and the parser refuses them with the
  // text 0.14 gives: complete, inside an array, with only the header buffered, nil or empty.
  const auto refused = [](char typeByte) {
    return fmt::format(R"(redlimit: bytes that are not RESP2: Protocol error, got "{}" as reply type byte)", typeByte);
  };
  for (const std::string_view bytes :
       {",1.5\r\n", "_\r\n", "#t\r\n", "%1\r\n:1\r\n:2\r\n", "~1\r\n:1\r\n", "|1\r\n:1\r\n:2\r\n+OK\r\n",
        ">2\r\n$7\r\nmessage\r\n:1\r\n", "(12345678901234567890\r\n", "=7\r\ntxt:abc\r\n", "%0\r\n", "~-1\r\n", ",",
        "_", "%1", "=100\r\ntxt:", "(1"}) {
    EXPECT_EQ(parseError(bytes), refused(bytes[0])) << bytes;
    EXPECT_EQ(parseError("*3\r\n:1\r\n*1\r\n$1\r\na\r\n" + std::string(bytes)), refused(bytes[0])) << bytes;
  }
  ReplyParser p(ClientOptions::ReplyLimits{});
  feed(p, "+OK\r\n_\r\n+OK\r\n");
  auto r = p.next();
  ASSERT_TRUE(r);
  EXPECT_EQ(show(*r), R"(+"OK")");
  EXPECT_EQ(protocolError([&] { (void)p.next(); }), refused('_'));
  EXPECT_EQ(
      protocolError([&] { feed(p, "+OK\r\n"); }),
      R"(redlimit: the reply stream was lost earlier: bytes that are not RESP2: Protocol error, got "_" as reply type byte)");
}

TEST(Resp, LineWithALoneCrOrLfIsRefusedOnEveryHiredis) {
  // hiredis 0.14 passes "a\rb" through as a status; 1.x refuses it with its own text.
#if HIREDIS_MAJOR >= 1
  const auto refused = [](const char*) {
    return std::string("redlimit: bytes that are not RESP2: Bad simple string value");
  };
#else
  const auto refused = [](const char* kind) {
    return fmt::format("redlimit: bytes that are not RESP2: {} holds a CR or LF byte", kind);
  };
#endif
  EXPECT_EQ(parseError("+a\rb\r\n"), refused("a status line"));
  EXPECT_EQ(parseError("+a\nb\r\n"), refused("a status line"));
  EXPECT_EQ(parseError("*2\r\n:1\r\n-ERR a\rb\r\n"), refused("an error line"));
  EXPECT_EQ(parseError("-ERR \n\r\n"), refused("an error line"));
  EXPECT_EQ(parseOne("$3\r\na\rb\r\n"), R"($"a\x0db")");  // bulk strings hold any byte
}

TEST(Resp, StaysFailedAfterAnError) {
  ReplyParser p(ClientOptions::ReplyLimits{});
  feed(p, "+OK\r\n!");
  auto r = p.next();
  ASSERT_TRUE(r);
  EXPECT_EQ(show(*r), R"(+"OK")");
  EXPECT_EQ(protocolError([&] { (void)p.next(); }),
            R"(redlimit: bytes that are not RESP2: Protocol error, got "!" as reply type byte)");
  const std::string later =
      R"(redlimit: the reply stream was lost earlier: bytes that are not RESP2: Protocol error, got "!" as reply type byte)";
  EXPECT_EQ(protocolError([&] { (void)p.next(); }), later);
  EXPECT_EQ(protocolError([&] { feed(p, "+OK\r\n"); }), later);
  EXPECT_EQ(protocolError([&] { (void)p.next(); }), later);
}

TEST(Resp, StaysFailedAfterALimit) {
  ReplyParser p(limitsWith(4, 4, 1));
  feed(p, "$5\r\n");
  const std::string first = protocolError([&] { (void)p.next(); });
  EXPECT_EQ(
      first,
      "redlimit: reply announces a bulk string of 5 bytes, more than ClientOptions::ReplyLimits::maxBulkBytes (4)");
  const std::string later =
      "redlimit: the reply stream was lost earlier: reply announces a bulk string of 5 bytes, more than "
      "ClientOptions::ReplyLimits::maxBulkBytes (4)";
  EXPECT_EQ(protocolError([&] { feed(p, "hello\r\n+OK\r\n"); }), later);
  EXPECT_EQ(protocolError([&] { (void)p.next(); }), later);
}

TEST(Resp, AppendCommandEncodesExactBytes) {
  std::string out = "before|";
  const std::string_view argv[] = {"SET", "", std::string_view("k\0\r\n\xff", 5)};
  appendCommand(out, argv, 3);
  EXPECT_EQ(out, "before|*3\r\n$3\r\nSET\r\n$0\r\n\r\n$5\r\nk\0\r\n\xff\r\n"s);

  // More arguments than the encoder keeps on its stack.
  std::vector<std::string> words;
  std::vector<std::string_view> many;
  std::string expected = "*20\r\n";
  for (int i = 0; i < 20; ++i) words.push_back(fmt::format("w{}", i));
  for (const auto& w : words) {
    many.emplace_back(w);
    expected += fmt::format("${}\r\n{}\r\n", w.size(), w);
  }
  std::string big;
  appendCommand(big, many.data(), many.size());
  EXPECT_EQ(big, expected);

  EXPECT_THROW(appendCommand(out, argv, 0), InvalidArgument);
}

TEST(Resp, AppendCommandMatchesHiredisEncoder) {
  // Our encoder against hiredis's redisFormatCommandArgv, on arguments of every length class
  // (0, one digit, several digits of length) and of arbitrary bytes.
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    std::vector<std::string> words(1 + rng() % 12);
    for (auto& w : words) {
      const std::size_t len = (rng() % 4 == 0) ? rng() % 2000 : rng() % 12;
      for (std::size_t i = 0; i < len; ++i) w.push_back(static_cast<char>(rng() % 256));
    }
    std::vector<std::string_view> views(words.begin(), words.end());
    std::vector<const char*> pointers;
    std::vector<std::size_t> lengths;
    for (const auto& w : words) {
      pointers.push_back(w.data());
      lengths.push_back(w.size());
    }
    char* raw = nullptr;
    // int in hiredis 0.14, long long in 1.x.
    const auto size = redisFormatCommandArgv(&raw, static_cast<int>(words.size()), pointers.data(), lengths.data());
    ASSERT_GT(size, 0);
    const std::string theirs(raw, static_cast<std::size_t>(size));
    redisFreeCommand(raw);
    std::string ours;
    appendCommand(ours, views.data(), views.size());
    ASSERT_EQ(ours, theirs) << "round " << round;
  }
}

TEST(RespLimits, BulkOverLimitThrowsNamingTheLimit) {
  const auto limits = limitsWith(4, 8, 7);
  EXPECT_EQ(parseOne("$4\r\nabcd\r\n", limits), R"($"abcd")");
  EXPECT_EQ(
      parseError("$5\r\nhello\r\n", limits),
      "redlimit: reply announces a bulk string of 5 bytes, more than ClientOptions::ReplyLimits::maxBulkBytes (4)");
  EXPECT_EQ(
      parseError("*2\r\n$1\r\na\r\n$5\r\nhello\r\n", limits),
      "redlimit: reply announces a bulk string of 5 bytes, more than ClientOptions::ReplyLimits::maxBulkBytes (4)");
}

TEST(RespLimits, HugeBulkHeaderFailsWithoutThePayload) {
  EXPECT_EQ(parseError("$99999999999\r\n"),
            "redlimit: reply announces a bulk string of 99999999999 bytes, more than "
            "ClientOptions::ReplyLimits::maxBulkBytes "
            "(67108864)");
  EXPECT_EQ(
      parseError("$2000000000\r\n"),
      "redlimit: reply announces a bulk string of 2000000000 bytes, more than ClientOptions::ReplyLimits::maxBulkBytes "
      "(67108864)");
  EXPECT_EQ(parseError("$9223372036854775807\r\n"),
            "redlimit: reply announces a bulk string of 9223372036854775807 bytes, more than "
            "ClientOptions::ReplyLimits::maxBulkBytes (67108864)");
  // Behind replies and elements that are complete.
  EXPECT_EQ(parseError("+OK\r\n*2\r\n$1\r\na\r\n$99999999999\r\n"),
            "redlimit: reply announces a bulk string of 99999999999 bytes, more than "
            "ClientOptions::ReplyLimits::maxBulkBytes "
            "(67108864)");
  // At the limit, the parser waits for the payload.
  ReplyParser p(ClientOptions::ReplyLimits{});
  feed(p, "$67108864\r\n");
  EXPECT_FALSE(p.next());
}

TEST(RespLimits, BulkHeaderFailsAsSoonAsItsDigitsExceedTheLimit) {
  ReplyParser p(limitsWith(100, 8, 7));
  feed(p, "$10");
  EXPECT_FALSE(p.next());
  feed(p, "0");
  EXPECT_FALSE(p.next());
  feed(p, "0");
  EXPECT_EQ(protocolError([&] { (void)p.next(); }),
            "redlimit: reply announces a bulk string of at least 1000 bytes, more than "
            "ClientOptions::ReplyLimits::maxBulkBytes (100)");
  EXPECT_EQ(parseError("$99999999999"),
            "redlimit: reply announces a bulk string of at least 99999999999 bytes, more than "
            "ClientOptions::ReplyLimits::maxBulkBytes (67108864)");
  // Past what 64 bits hold: the first 21 digits are shown.
  EXPECT_EQ(parseError("$" + std::string(26, '9')),
            fmt::format("redlimit: reply announces a bulk string of at least {} bytes, more than "
                        "ClientOptions::ReplyLimits::maxBulkBytes (67108864)",
                        std::string(21, '9')));
}

TEST(RespLimits, ElementsOverLimitThrowsAtTheHeader) {
  const auto limits = limitsWith(64, 2, 7);
  EXPECT_EQ(parseOne("*2\r\n:1\r\n:2\r\n", limits), "[:1, :2]");
  EXPECT_EQ(parseError("*3\r\n", limits),
            "redlimit: reply announces an array of 3 elements, more than ClientOptions::ReplyLimits::maxElements (2)");
  EXPECT_EQ(parseError("*1\r\n*3\r\n", limits),
            "redlimit: reply announces an array of 3 elements, more than ClientOptions::ReplyLimits::maxElements (2)");
}

TEST(RespLimits, HugeArrayHeaderFailsAtOnce) {
  EXPECT_EQ(parseError("*2147483647\r\n"),
            "redlimit: reply announces an array of 2147483647 elements, more than "
            "ClientOptions::ReplyLimits::maxElements (1048576)");
  EXPECT_EQ(parseError("*99999999999"),
            "redlimit: reply announces an array of at least 99999999999 elements, more than "
            "ClientOptions::ReplyLimits::maxElements (1048576)");
}

TEST(RespLimits, DepthOverLimitThrows) {
  const auto two = limitsWith(64, 8, 2);
  EXPECT_EQ(parseOne(nested(2, ":1\r\n"), two), "[[:1]]");
  EXPECT_EQ(parseError(nested(3, ""), two),
            "redlimit: reply announces arrays nested 3 deep, more than ClientOptions::ReplyLimits::maxDepth (2)");
  EXPECT_EQ(parseOne(nested(7, ":1\r\n")), "[[[[[[[:1]]]]]]]");
  // hiredis would take one more level; the limit speaks first.
  EXPECT_EQ(parseError(nested(8, ":1\r\n")),
            "redlimit: reply announces arrays nested 8 deep, more than ClientOptions::ReplyLimits::maxDepth (7)");
  EXPECT_EQ(parseOne(nested(1, ":1\r\n"), limitsWith(64, 8, 1)), "[:1]");
}

TEST(RespLimits, StatusAndErrorLinesAreBoundedByMaxBulkBytes) {
  const auto limits = limitsWith(4, 8, 7);
  EXPECT_EQ(parseOne("+OKAY\r\n", limits), R"(+"OKAY")");
  EXPECT_EQ(parseError("+OKAYS\r\n", limits),
            "redlimit: reply has a status line of 5 bytes, more than ClientOptions::ReplyLimits::maxBulkBytes (4)");
  EXPECT_EQ(parseError("*1\r\n-ERROR\r\n", limits),
            "redlimit: reply has an error line of 5 bytes, more than ClientOptions::ReplyLimits::maxBulkBytes (4)");
  // Without their CRLF: as soon as more is buffered than the line may hold.
  EXPECT_EQ(parseAll("+OKAY\r", limits), std::vector<std::string>{});
  EXPECT_EQ(
      parseError("+OKAYS", limits),
      "redlimit: reply has a status line of at least 5 bytes, more than ClientOptions::ReplyLimits::maxBulkBytes (4)");
  EXPECT_EQ(
      parseError("-ERROR", limits),
      "redlimit: reply has an error line of at least 5 bytes, more than ClientOptions::ReplyLimits::maxBulkBytes (4)");
}

TEST(RespLimits, EndlessNumberLineFails) {
  EXPECT_EQ(parseAll(":" + std::string(20, '1')), std::vector<std::string>{});
  const std::string tooLong = "redlimit: bytes that are not RESP2: a length or integer line longer than 20 bytes";
  EXPECT_EQ(parseError(":" + std::string(21, '1')), tooLong);
  EXPECT_EQ(parseError("$-" + std::string(20, '1')), tooLong);
  EXPECT_EQ(parseError("*-" + std::string(20, '1')), tooLong);
}

TEST(RespLimits, CheckLimitsRejectsEachField) {
  EXPECT_NO_THROW(checkLimits(ClientOptions::ReplyLimits{}));
  EXPECT_NO_THROW(checkLimits(limitsWith(1, 1, 1)));
  auto message = [](const ClientOptions::ReplyLimits& l) {
    try {
      checkLimits(l);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no InvalidArgument");
  };
  EXPECT_EQ(message(limitsWith(0, 1, 1)), "redlimit: ClientOptions::ReplyLimits::maxBulkBytes must be >= 1, got 0");
  EXPECT_EQ(message(limitsWith(1, 0, 1)), "redlimit: ClientOptions::ReplyLimits::maxElements must be >= 1, got 0");
  EXPECT_EQ(message(limitsWith(1, 1, 0)), "redlimit: ClientOptions::ReplyLimits::maxDepth must be in 1..7, got 0");
  EXPECT_EQ(message(limitsWith(1, 1, 8)), "redlimit: ClientOptions::ReplyLimits::maxDepth must be in 1..7, got 8");
  EXPECT_EQ(message(limitsWith(1, 1, -1)), "redlimit: ClientOptions::ReplyLimits::maxDepth must be in 1..7, got -1");
  EXPECT_THROW(ReplyParser{limitsWith(1, 1, 8)}, InvalidArgument);
}

// 70 bytes of "*1048576\r\n" nested 7 deep made the parser reserve each
// level's announced count (about 600 MB of address space); a client under `ulimit -v` then got
// std::bad_alloc rather than a redlimit::Error. Memory must grow with the bytes received.
TEST(RespLimits, AnnouncedArrayCountsAllocateNothing) {
  std::string bytes;
  for (int i = 0; i < 7; ++i) bytes += "*1048576\r\n";
  ASSERT_EQ(bytes.size(), 70u);
  ReplyParser p{ClientOptions::ReplyLimits{}};
  feed(p, bytes);
  EXPECT_FALSE(p.next().has_value());  // waiting for the innermost array's first element
  EXPECT_EQ(p.elementCapacity(), 0u) << "no element arrived yet (the old parser reserved 1048576 per level)";
  // Elements arriving grow the arrays with the bytes: 1000 integers, about 4 bytes each.
  std::string more;
  for (int i = 0; i < 1000; ++i) more += ":1\r\n";
  feed(p, more);
  EXPECT_FALSE(p.next().has_value());
  EXPECT_GE(p.elementCapacity(), 1000u);
  EXPECT_LE(p.elementCapacity(), 2048u);
}

TEST(RespLimits, NestedArraysBuiltIncrementallyKeepTheirShape) {
  // Arrays closing at every level, empty arrays, nils and errors between them: the open arrays
  // move into their parents in order.
  EXPECT_EQ(parseOne("*3\r\n*2\r\n*1\r\n:1\r\n:2\r\n*0\r\n*2\r\n$-1\r\n*-1\r\n"), "[[[:1], :2], [], [nil, nil]]");
  EXPECT_EQ(parseOne("*2\r\n*1\r\n*1\r\n*1\r\n+deep\r\n$3\r\nend\r\n"), R"([[[[+"deep"]]], $"end"])");
  EXPECT_EQ(parseOne(nested(7, ":7\r\n")), "[[[[[[[:7]]]]]]]");
  // Two replies in one feed, the first ending inside its deepest array.
  ReplyParser p{ClientOptions::ReplyLimits{}};
  feed(p, "*1\r\n*1\r\n:1\r\n*2\r\n:2\r\n*1\r\n:3\r\n");
  auto first = p.next();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(show(first->value), "[[:1]]");
  auto second = p.next();
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(show(second->value), "[:2, [:3]]");
  EXPECT_FALSE(p.next().has_value());
}

// The hiredis configure found (tests/CMakeLists.txt) is the one compiled against and loaded:
// scripts/ci-hiredis12.sh builds against a hiredis of its own beside the system's.
TEST(Hiredis, HeaderAndLibraryAreTheOnesConfigureFound) {
  EXPECT_EQ(fmt::format("{}.{}.{}", HIREDIS_MAJOR, HIREDIS_MINOR, HIREDIS_PATCH), REDLIMIT_HIREDIS_VERSION);
  Dl_info loaded{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&redisReaderCreateWithFunctions), &loaded), 0);
  ASSERT_NE(loaded.dli_fname, nullptr);
  EXPECT_EQ(std::filesystem::canonical(loaded.dli_fname), std::filesystem::canonical(REDLIMIT_HIREDIS_LIBRARY));
  fmt::print("hiredis {}: header {}.{}.{}, loaded from {}\n", REDLIMIT_HIREDIS_VERSION, HIREDIS_MAJOR, HIREDIS_MINOR,
             HIREDIS_PATCH, loaded.dli_fname);
}
