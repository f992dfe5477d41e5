#include "config/limiter_name.hpp"

#include <fmt/format.h>

#include "redlimit/errors.hpp"

namespace redlimit::detail {

std::size_t firstInvalidUtf8(std::string_view text) noexcept {
  // RFC 3629, section 4: the well-formed byte sequences.
  std::size_t i = 0;
  while (i < text.size()) {
    const auto b = static_cast<unsigned char>(text[i]);
    std::size_t length = 0;
    unsigned char lo = 0x80;  // the range of the second byte
    unsigned char hi = 0xBF;
    if (b < 0x80) {
      length = 1;
    } else if (b >= 0xC2 && b <= 0xDF) {
      length = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      length = 3;
      if (b == 0xE0) lo = 0xA0;  // no overlong form
      if (b == 0xED) hi = 0x9F;  // no surrogate
    } else if (b >= 0xF0 && b <= 0xF4) {
      length = 4;
      if (b == 0xF0) lo = 0x90;  // no overlong form
      if (b == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
    } else {
      return i;
    }
    if (text.size() - i < length) return i;
    for (std::size_t k = 1; k < length; ++k) {
      const auto c = static_cast<unsigned char>(text[i + k]);
      if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) return i;
    }
    i += length;
  }
  return std::string_view::npos;
}

void checkLimiterName(const std::string& name, std::size_t maxLength) {
  if (name.empty()) throw InvalidArgument("redlimit: limiter name must not be empty");
  if (name.size() > maxLength) {
    throw InvalidArgument(
        fmt::format("redlimit: limiter name is {} bytes; at most {} are allowed", name.size(), maxLength));
  }
  if (const std::size_t bad = firstInvalidUtf8(name); bad != std::string_view::npos) {
    throw InvalidArgument(
        fmt::format("redlimit: limiter name is not UTF-8 (byte {} of {}, 0x{:02x}, starts no valid sequence); it is "
                    "the label of the limiter's metrics, which the Prometheus text format carries as UTF-8: use a "
                    "UTF-8 name",
                    bad, name.size(), static_cast<unsigned char>(name[bad])));
  }
  checkNotRecordKey(name, "limiter name");
}

void checkNotRecordKey(std::string_view key, std::string_view what) {
  for (const std::string_view segment : {std::string_view(":rsv"), std::string_view(":mrsv")}) {
    for (std::size_t at = key.find(segment); at != std::string_view::npos; at = key.find(segment, at + 1)) {
      const std::size_t end = at + segment.size();
      if (end == key.size() || key[end] == ':') {
        throw InvalidArgument(fmt::format(
            "redlimit: {} \"{}\" has the form of a reservation record's key (\"{}\" followed by ':' or at its "
            "end), so a decision on it could take the place of a reservation's record; choose one without that "
            "segment",
            what, key, segment.substr(1)));
      }
    }
  }
}

}  // namespace redlimit::detail
