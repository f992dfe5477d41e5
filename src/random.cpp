#include "random.hpp"

#include <random>

namespace redlimit::detail {
namespace {

std::mt19937_64& generator() {
  thread_local std::mt19937_64 gen = [] {
    std::random_device rd;
    std::seed_seq seq{rd(), rd(), rd(), rd(), rd(), rd(), rd(), rd()};
    return std::mt19937_64(seq);
  }();
  return gen;
}

}  // namespace

std::array<std::uint8_t, 16> randomId16() {
  std::array<std::uint8_t, 16> out{};
  auto& gen = generator();
  for (std::size_t half = 0; half < 2; ++half) {
    std::uint64_t v = gen();
    for (std::size_t i = 0; i < 8; ++i) out[half * 8 + i] = static_cast<std::uint8_t>(v >> (8 * i));
  }
  return out;
}

std::string randomUuidV4() {
  auto b = randomId16();
  b[6] = static_cast<std::uint8_t>((b[6] & 0x0F) | 0x40);  // version 4
  b[8] = static_cast<std::uint8_t>((b[8] & 0x3F) | 0x80);  // RFC 4122 variant
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  s.reserve(36);
  for (std::size_t i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s.push_back('-');
    s.push_back(kHex[b[i] >> 4]);
    s.push_back(kHex[b[i] & 0x0F]);
  }
  return s;
}

}  // namespace redlimit::detail
