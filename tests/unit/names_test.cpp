#include <gtest/gtest.h>

#include "redlimit/rate_limiter.hpp"

TEST(SuffixName, WrapsPlainNames) {
  EXPECT_EQ(redlimit::suffixName("api", "value"), "{api}:value");
  EXPECT_EQ(redlimit::suffixName("api", "permits:abc"), "{api}:permits:abc");
}

TEST(SuffixName, KeepsNamesWithABraceAsTheyAre) {
  // Redisson's rule: any '{' in the name means no extra braces, even for "a{b" or "a{}b".
  EXPECT_EQ(redlimit::suffixName("{api}", "value"), "{api}:value");
  EXPECT_EQ(redlimit::suffixName("a{b", "value"), "a{b:value");
  EXPECT_EQ(redlimit::suffixName("a{}b", "permits"), "a{}b:permits");
}
