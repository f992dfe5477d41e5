// The checks of a limiter's name, written once for every limiter (and a MultiLimit's own name).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace redlimit::detail {

/// Throws InvalidArgument, before anything is sent, for a limiter name that is empty, longer than
/// `maxLength` bytes, or not UTF-8: the name is the label of the limiter's metrics, and the
/// Prometheus text format is UTF-8 (one name that is not would make every scrape fail).
void checkLimiterName(const std::string& name, std::size_t maxLength);

/// The byte offset of the first byte of `text` that is not part of a valid UTF-8 sequence (an
/// overlong form, a surrogate, a code point above U+10FFFF or a truncated sequence), or npos.
[[nodiscard]] std::size_t firstInvalidUtf8(std::string_view text) noexcept;

}  // namespace redlimit::detail
