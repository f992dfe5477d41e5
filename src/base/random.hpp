// Random identifiers: UUID v4 strings for client ids, 16-byte ids for sorted-set members.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace redlimit::detail {

/// 16 random bytes from a per-thread generator seeded from std::random_device, seeded again in
/// a fork() child (see fork_guard.hpp) so that parent and child never draw the same sequence.
std::array<std::uint8_t, 16> randomId16();

/// randomId16() as a string of its 16 bytes.
std::string randomIdBytes();

/// `bytes` as lowercase hex digits, two a byte.
std::string hexOf(std::string_view bytes);

/// A random UUID v4 in its canonical text form: 36 lowercase characters with hyphens.
std::string randomUuidV4();

}  // namespace redlimit::detail
