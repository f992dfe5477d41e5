// redlimit — the bounds every script-backed limiter (Limiter, MultiLimit) checks before sending:
// what the keys' layouts can hold (uint32 fields) and how long waits and reservation records may be.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace redlimit::detail {

/// The most permits one call may ask for (a uint32 in the key).
inline constexpr std::int64_t kMaxPermits = 4294967295;
/// The longest period, window or keepAlive: uint32 ms, 49.7 days.
inline constexpr std::chrono::milliseconds kMaxInterval{4294967295};
/// The longest limiter name, in bytes.
inline constexpr std::size_t kMaxNameLength = 1024;
/// The longest wait a reservation may be made for (longer ones are cut to this): 365 days.
inline constexpr std::chrono::microseconds kMaxWait{31536000000000};
/// Reservation ids (reserveFor, settle): 1..128 bytes.
inline constexpr std::size_t kMaxReservationIdLength = 128;
/// How long a reservation record lives by default (reserveFor): 1 hour.
inline constexpr std::chrono::milliseconds kDefaultReservationTtl{3600000};
/// The longest a reservation record may live: 7 days.
inline constexpr std::chrono::milliseconds kMaxReservationTtl{604800000};
/// A warming-up smooth policy's largest cold factor (lua/smooth.lua keeps it in one byte).
inline constexpr std::int64_t kMaxColdFactor = 127;

}  // namespace redlimit::detail
