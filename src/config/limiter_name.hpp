// The checks of a limiter's name, written once for every limiter (and a MultiLimit's own name).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace redlimit::detail {

/// Throws InvalidArgument, before anything is sent, for a limiter name that is empty, longer than
/// `maxLength` bytes, or not UTF-8: the name is the label of the limiter's metrics, and the
/// Prometheus text format is UTF-8 (one name that is not would make every scrape fail); or that
/// has the form of a reservation record's key (checkNotRecordKey).
void checkLimiterName(const std::string& name, std::size_t maxLength);

/// Throws InvalidArgument, before anything is sent, for a key that a decision writes (a limiter's
/// name, a keyed limiter's key) with the form of a reservation record's key: one that holds the
/// segment "rsv" or "mrsv" after a ':', followed by ':' or at its end. Record keys are
/// rl::rsv:<id>:... and rl::mrsv:<id>:... (detail::namespacedRecordKey), and a RateLimiter's keys
/// are its name and its name + ":...", so a RateLimiter named like a record could otherwise write a
/// reservation's record before its owner makes it. `what` names the key in the message
/// ("limiter name", "key").
void checkNotRecordKey(std::string_view key, std::string_view what);

/// The byte offset of the first byte of `text` that is not part of a valid UTF-8 sequence (an
/// overlong form, a surrogate, a code point above U+10FFFF or a truncated sequence), or npos.
[[nodiscard]] std::size_t firstInvalidUtf8(std::string_view text) noexcept;

}  // namespace redlimit::detail
