#include "limiters/key_layout.hpp"

#include <fmt/format.h>

#include "config/limiter_name.hpp"
#include "redlimit/errors.hpp"
#include "redlimit/detail/limits.hpp"
#include "topology/key_slot.hpp"

namespace redlimit::detail {

void checkNamespaceName(const std::string& name, std::size_t maxLength) {
  checkLimiterName(name, maxLength);
  if (name.find(':') != std::string::npos) {
    throw InvalidArgument(fmt::format(
        "redlimit: limiter name \"{}\" holds a ':'; a Limiter's keys are rl:<name>:<key>, so its name must not "
        "(use '.', '-' or '_': \"api.login\")",
        name));
  }
}

std::string namespacedKey(std::string_view name, std::string_view key) {
  if (key.empty()) throw InvalidArgument(fmt::format("redlimit: limiter {}: the key must not be empty", name));
  if (key.size() > kMaxKeyLength) {
    throw InvalidArgument(fmt::format("redlimit: limiter {}: the key is {} bytes; at most {} are allowed", name,
                                      key.size(), kMaxKeyLength));
  }
  std::string out;
  out.reserve(kKeyPrefix.size() + name.size() + 1 + key.size());
  out.append(kKeyPrefix).append(name).append(1, ':').append(key);
  return out;
}

std::string namespacedRecordKey(const std::string& stateKey, const std::string& id, std::string_view infix) {
  if (id.empty() || id.size() > kMaxReservationIdLength) {
    throw InvalidArgument(
        fmt::format("redlimit: a reservation id must be 1..{} bytes, got {}", kMaxReservationIdLength, id.size()));
  }
  for (const char c : id) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
          c == '.')) {
      throw InvalidArgument(
          fmt::format("redlimit: reservation id \"{}\" holds byte 0x{:02x}; allowed are A-Z a-z 0-9 and - _ .", id,
                      static_cast<unsigned>(static_cast<unsigned char>(c))));
    }
  }
  // A key with a hash tag hashes the tag: the record keeps it (its prefix holds no '{').
  if (hashedPart(stateKey).size() != stateKey.size()) return fmt::format("rl::{}:{}:{}", infix, id, stateKey);
  if (stateKey.find('}') != std::string::npos) {
    throw InvalidArgument(
        fmt::format("redlimit: key \"{}\" holds a '}}' but no hash tag, so no reservation record can share its hash "
                    "slot; give the key a hash tag (\"{{user42}}\")",
                    stateKey));
  }
  return fmt::format("rl::{}:{}:{{{}}}", infix, id, stateKey);
}

}  // namespace redlimit::detail
