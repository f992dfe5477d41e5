// redlimit — the cache-line size used to keep hot atomics apart.
#pragma once

#include <cstddef>

namespace redlimit::detail {

/// Bytes per cache line on the targets we build for (x86-64, most AArch64). A constant rather
/// than std::hardware_destructive_interference_size: g++ 12 warns when that is used in a header
/// (its value may change between compiler versions, breaking the ABI) and clang 14 lacks it.
inline constexpr std::size_t kCacheLine = 64;

}  // namespace redlimit::detail
