// Redis Cluster hash slots (src/topology/key_slot.hpp). Expected values: the CRC16 check value of the Redis
// Cluster specification and slots that `CLUSTER KEYSLOT` of redis-server 7 answers.
#include <gtest/gtest.h>

#include "topology/key_slot.hpp"

using redlimit::detail::crc16Xmodem;
using redlimit::detail::hashedPart;
using redlimit::detail::keySlot;

TEST(KeySlot, Crc16IsXmodem) {
  EXPECT_EQ(crc16Xmodem("123456789"), 0x31C3);  // the specification's check value
  EXPECT_EQ(crc16Xmodem(""), 0);
  EXPECT_EQ(keySlot("123456789"), 0x31C3);  // 12739 < 16384
}

TEST(KeySlot, SlotsOfPlainKeys) {
  EXPECT_EQ(keySlot("foo"), 12182);
  EXPECT_EQ(keySlot("bar"), 5061);
  EXPECT_EQ(keySlot("somekey"), 11058);
  EXPECT_EQ(keySlot("hello"), 866);
  EXPECT_EQ(keySlot(""), 0);
}

TEST(KeySlot, HashTagRules) {
  // The tag is what lies between the first '{' and the first '}' after it, if not empty.
  EXPECT_EQ(hashedPart("{user1000}.following"), "user1000");
  EXPECT_EQ(keySlot("{user1000}.following"), 3443);
  EXPECT_EQ(keySlot("{user1000}.followers"), 3443);
  // Empty first braces: no tag, the whole key is hashed.
  EXPECT_EQ(hashedPart("foo{}{bar}"), "foo{}{bar}");
  EXPECT_EQ(keySlot("foo{}{bar}"), 8363);
  EXPECT_EQ(hashedPart("{}"), "{}");
  EXPECT_EQ(keySlot("{}"), 15257);
  // The first '}' after the first '{' closes the tag, whatever it contains.
  EXPECT_EQ(hashedPart("foo{{bar}}zap"), "{bar");
  EXPECT_EQ(keySlot("foo{{bar}}zap"), 4015);
  EXPECT_EQ(keySlot("{bar"), 4015);  // no closing brace: the whole key, here the same text
  // Only the first tag counts.
  EXPECT_EQ(hashedPart("foo{bar}{zap}"), "bar");
  EXPECT_EQ(keySlot("foo{bar}{zap}"), keySlot("bar"));
  // No closing brace at all: the whole key.
  EXPECT_EQ(hashedPart("a{b"), "a{b");
}

TEST(KeySlot, OneTagOneSlot) {
  EXPECT_EQ(keySlot("{tenant42}:user:7"), 14826);
  EXPECT_EQ(keySlot("{tenant42}:tenant"), keySlot("{tenant42}:user:7"));
  EXPECT_EQ(keySlot("{tenant42}:global"), keySlot("tenant42"));
  EXPECT_NE(keySlot("{tenant43}:user:7"), keySlot("{tenant42}:user:7"));
}
