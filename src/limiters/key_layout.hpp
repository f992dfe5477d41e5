// redlimit — the keys a Limiter writes (docs/api.md, "Keys"): every one in redlimit's namespace
// "rl:", a limiter's under its name, so that two limiters never share state and no caller's key
// reaches a reservation record, whatever keys the callers pass.
//
//   rl:<name>:<key>              the state of `key` (the name holds no ':', so the split is unique)
//   rl::rsv:<id>:<hashed key>    a reservation record of that key (an empty name: no state key
//                                has this form); <hashed key> is the state key when it holds a
//                                hash tag, else the state key in braces, so the record shares its
//                                key's Redis Cluster hash slot
#pragma once

#include <string>
#include <string_view>

namespace redlimit::detail {

/// The prefix of every key a Limiter writes.
inline constexpr std::string_view kKeyPrefix = "rl:";
/// The longest caller key, in bytes.
inline constexpr std::size_t kMaxKeyLength = 1024;

/// Throws InvalidArgument for a name a Limiter cannot namespace its keys with: one holding a ':'
/// (after the checks of every limiter name, checkLimiterName).
void checkNamespaceName(const std::string& name, std::size_t maxLength);
/// The state key of `key` (1..kMaxKeyLength bytes, any bytes) of the limiter `name`; throws
/// InvalidArgument naming the limiter for an empty or too long key.
[[nodiscard]] std::string namespacedKey(std::string_view name, std::string_view key);
/// The record `id` (1..128 bytes of A-Z a-z 0-9 - _ .) of the state key `stateKey`, of the kind
/// `infix` ("rsv", "mrsv"). Throws InvalidArgument for a bad id, and for a state key without a
/// hash tag that holds a '}' (no record could share its slot: the message says to tag it).
[[nodiscard]] std::string namespacedRecordKey(const std::string& stateKey, const std::string& id,
                                              std::string_view infix = "rsv");

}  // namespace redlimit::detail
