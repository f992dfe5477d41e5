#include "base/random.hpp"

#include <array>
#include <chrono>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <string_view>
#include <thread>

#include <unistd.h>

#include "base/fork_guard.hpp"

namespace redlimit::detail {
namespace {

// A per-thread generator that a fork() child does not share with its parent: it remembers the
// fork generation it was seeded in and is seeded again when that differs.
struct ThreadGenerator {
  std::mt19937_64 engine;
  bool seeded = false;
  std::uint64_t seededIn = 0;  // forkGeneration() when seeded
};

// Seeds from std::random_device, plus what tells this seeding apart from any other even if
// random_device were deterministic: the process (pid), the thread and the moment (steady clock).
void reseed(std::mt19937_64& engine) {
  std::random_device rd;
  const auto now = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  const auto thread = static_cast<std::uint64_t>(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  const auto pid = static_cast<std::uint64_t>(::getpid());
  const std::uint32_t words[] = {rd(),
                                 rd(),
                                 rd(),
                                 rd(),
                                 rd(),
                                 rd(),
                                 rd(),
                                 rd(),
                                 static_cast<std::uint32_t>(pid),
                                 static_cast<std::uint32_t>(pid >> 32),
                                 static_cast<std::uint32_t>(thread),
                                 static_cast<std::uint32_t>(thread >> 32),
                                 static_cast<std::uint32_t>(now),
                                 static_cast<std::uint32_t>(now >> 32)};
  std::seed_seq seq(std::begin(words), std::end(words));
  engine.seed(seq);
}

std::mt19937_64& generator() {
  thread_local ThreadGenerator g;
  const std::uint64_t generation = forkGeneration();
  if (!g.seeded || g.seededIn != generation) {
    reseed(g.engine);
    g.seeded = true;
    g.seededIn = generation;
  }
  return g.engine;
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

std::string randomIdBytes() {
  const std::array<std::uint8_t, 16> id = randomId16();
  return std::string(id.begin(), id.end());
}

std::string hexOf(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    out.push_back(kHex[b >> 4U]);
    out.push_back(kHex[b & 0x0FU]);
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
