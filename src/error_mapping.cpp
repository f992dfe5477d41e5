#include "error_mapping.hpp"

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <string>

#include <hiredis/hiredis.h>

#include "redlimit/errors.hpp"

namespace redlimit::detail {
namespace {

bool isTimeoutErrno(int e) {
  return e == EAGAIN || e == EWOULDBLOCK || e == ETIMEDOUT || e == EINPROGRESS;
}

bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

}  // namespace

void throwContextError(int err, int savedErrno, std::string_view errstr, std::string_view what) {
  std::string message = "redlimit: " + std::string(what) + ": " + std::string(errstr);
#ifdef REDIS_ERR_TIMEOUT
  if (err == REDIS_ERR_TIMEOUT) throw TimeoutError(message);
#endif
  if (err == REDIS_ERR_EOF) throw ClosedError(message);
  if (err == REDIS_ERR_IO) {
    // errno is the reliable signal; the text is a fallback for code paths that clobber errno.
    if (isTimeoutErrno(savedErrno) || contains(errstr, std::strerror(EAGAIN)) ||
        contains(errstr, "timed out") || contains(errstr, "timeout")) {
      throw TimeoutError(message);
    }
    if (savedErrno == ECONNRESET || savedErrno == EPIPE || contains(errstr, "reset by peer") ||
        contains(errstr, "Broken pipe")) {
      throw ClosedError(message);
    }
  }
  throw IoError(message);
}

void throwReplyError(std::string_view message, bool fromScript) {
  std::string_view code = message.substr(0, message.find(' '));
  std::string text(message);
  std::string codeText(code);
  if (code == "LOADING" || code == "BUSY" || code == "MASTERDOWN" || code == "READONLY" ||
      code == "CLUSTERDOWN" || code == "TRYAGAIN") {
    throw UnavailableError(codeText, "redlimit: Redis cannot serve now: " + text);
  }
  if (code == "WRONGPASS" || code == "NOAUTH" || code == "NOPERM") {
    throw AuthError(codeText, "redlimit: authentication failed: " + text);
  }
  if (fromScript) {
    // redis.error_reply("REDLIMIT_X message") from lua/common.lua arrives as "REDLIMIT_X message".
    // error() in a script appends " script: <sha>, on @user_script:<line>."; keep our own text.
    auto ownText = [&] {
      std::string_view rest = message.substr(std::min(message.size(), code.size() + 1));
      return std::string(rest.substr(0, rest.find(" script: ")));
    };
    if (code == "REDLIMIT_NOT_INITIALIZED") throw NotInitializedError(codeText, ownText());
    if (code == "REDLIMIT_INVALID_CONFIG") throw InvalidConfigError(codeText, ownText());
    if (code == "REDLIMIT_INVALID_STATE") throw InvalidStateError(codeText, ownText());
    if (code == "REDLIMIT_INVALID_ARGUMENT") throw InvalidArgument(ownText());
    // OOM, BUSY, READONLY, ... are the server refusing to run the script at all: keep them as
    // plain ReplyError so callers can tell "Redis said no" from "the script failed".
    if (code == "ERR" && (contains(message, "script") || contains(message, "Script"))) {
      throw ScriptError(codeText, "redlimit: script failed: " + text);
    }
  }
  if (code == "OOM") {
    throw ReplyError(codeText, "redlimit: Redis is out of memory (maxmemory reached, nothing was written): " + text);
  }
  throw ReplyError(codeText, "redlimit: Redis replied with an error: " + text);
}

}  // namespace redlimit::detail
