// The transport's pure decisions, without a socket: what a plain-text probe's answer means.
#include <string_view>

#include <gtest/gtest.h>

#include "transport/connector.hpp"

using redlimit::detail::isPlainRedisAnswer;

TEST(TransportDecisions, PlainRedisAnswersToAPing) {
  EXPECT_TRUE(isPlainRedisAnswer("+P"));  // +PONG
  EXPECT_TRUE(isPlainRedisAnswer("-N"));  // -NOAUTH Authentication required.
  EXPECT_TRUE(isPlainRedisAnswer("-E"));  // -ERR ...
}

TEST(TransportDecisions, NotPlainRedis) {
  EXPECT_FALSE(isPlainRedisAnswer(""));
  EXPECT_FALSE(isPlainRedisAnswer("+"));
  EXPECT_FALSE(isPlainRedisAnswer("\x15\x03"));  // a TLS alert
  EXPECT_FALSE(isPlainRedisAnswer("\x16\x03"));  // a TLS handshake record
  EXPECT_FALSE(isPlainRedisAnswer("HT"));        // HTTP/1.1 400 ...
  EXPECT_FALSE(isPlainRedisAnswer("+p"));
  EXPECT_FALSE(isPlainRedisAnswer(":1"));  // RESP, but not an answer to PING
}
