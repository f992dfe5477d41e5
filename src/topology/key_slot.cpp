// redlimit — Redis Cluster hash slots (see key_slot.hpp).
#include "topology/key_slot.hpp"

#include <array>

namespace redlimit::detail {
namespace {

// CRC16/XMODEM one byte at a time: entry b is the CRC register after shifting b through it.
constexpr std::array<std::uint16_t, 256> makeTable() {
  std::array<std::uint16_t, 256> table{};
  for (unsigned b = 0; b < 256; ++b) {
    unsigned crc = b << 8;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 0x8000U) != 0 ? (crc << 1) ^ 0x1021U : crc << 1;
    table[b] = static_cast<std::uint16_t>(crc & 0xFFFFU);
  }
  return table;
}

constexpr std::array<std::uint16_t, 256> kCrcTable = makeTable();

}  // namespace

std::uint16_t crc16Xmodem(std::string_view data) noexcept {
  unsigned crc = 0;
  for (const char ch : data) {
    const unsigned byte = static_cast<unsigned char>(ch);
    crc = ((crc << 8) ^ kCrcTable[((crc >> 8) ^ byte) & 0xFFU]) & 0xFFFFU;
  }
  return static_cast<std::uint16_t>(crc);
}

std::string_view hashedPart(std::string_view key) noexcept {
  const std::size_t open = key.find('{');
  if (open == std::string_view::npos) return key;
  const std::size_t close = key.find('}', open + 1);
  if (close == std::string_view::npos || close == open + 1) return key;
  return key.substr(open + 1, close - open - 1);
}

std::uint16_t keySlot(std::string_view key) noexcept {
  return static_cast<std::uint16_t>(crc16Xmodem(hashedPart(key)) % kClusterSlots);
}

}  // namespace redlimit::detail
