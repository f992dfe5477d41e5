// redlimit — Redis Cluster hash slots: which of the 16384 slots a key belongs to. Scripts may
// only touch keys of one slot (Cluster refuses the others with CROSSSLOT), so anything that sends
// several keys in one call checks them here first; the Cluster topology routes by the same slot.
//
// The rule (Redis Cluster specification, "Keys distribution model"):
//   slot = CRC16(k) mod 16384, with CRC16 the XMODEM variant (polynomial 0x1021, initial value 0,
//   no reflection, no final xor), and k the key's hash tag if it has one, else the whole key.
//   The hash tag is what lies between the first '{' and the first '}' after it, if that is not
//   empty: "{user1000}.following" hashes "user1000"; "foo{}{bar}" has no tag (the first braces
//   are empty) and hashes the whole key; "foo{{bar}}zap" hashes "{bar"; "foo{bar}{zap}" hashes
//   "bar".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace redlimit::detail {

/// Number of hash slots in a Redis Cluster.
inline constexpr std::uint16_t kClusterSlots = 16384;

/// CRC16/XMODEM of `data` (crc16("123456789") == 0x31C3). Thread-safe; does not throw.
[[nodiscard]] std::uint16_t crc16Xmodem(std::string_view data) noexcept;

/// The part of `key` that Redis Cluster hashes: its hash tag if it has a non-empty one, else the
/// whole key (a view into `key`). Thread-safe; does not throw.
[[nodiscard]] std::string_view hashedPart(std::string_view key) noexcept;

/// The Redis Cluster slot of `key`, 0..16383. Thread-safe; does not throw.
[[nodiscard]] std::uint16_t keySlot(std::string_view key) noexcept;

}  // namespace redlimit::detail
