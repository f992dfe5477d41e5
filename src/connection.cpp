#include "redlimit/connection.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>
#include <string>

#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <fmt/format.h>
#include <hiredis/hiredis.h>

#include "error_mapping.hpp"
#include "redlimit/detail/deadline.hpp"
#include "redlimit/errors.hpp"
#include "stream.hpp"

namespace redlimit {
namespace {

using std::chrono::milliseconds;

// proto-max-bulk-len and client-query-buffer-limit cannot be set below 1 MiB: a connection the
// server closes while a larger request is sent is taken as a request over those limits.
constexpr std::size_t kSmallestServerRequestLimit = std::size_t{1} << 20;

timeval toTimeval(milliseconds ms) {
  timeval tv{};
  tv.tv_sec = static_cast<decltype(tv.tv_sec)>(ms.count() / 1000);
  tv.tv_usec = static_cast<decltype(tv.tv_usec)>((ms.count() % 1000) * 1000);
  return tv;
}

std::string endpoint(const ConnectionOptions& o) {
  return o.unixSocket.empty() ? fmt::format("{}:{}", o.host, o.port) : fmt::format("unix:{}", o.unixSocket);
}

// Converts a hiredis reply; error replies are thrown. Frees nothing (the caller owns `r`).
Reply convert(const redisReply* r, const detail::ReplyContext& context) {
  Reply out;
  switch (r->type) {
    case REDIS_REPLY_NIL:
      out.type = Reply::Type::Nil;
      break;
    case REDIS_REPLY_INTEGER:
      out.type = Reply::Type::Integer;
      out.integer = static_cast<std::int64_t>(r->integer);
      break;
    case REDIS_REPLY_STRING:
      out.type = Reply::Type::String;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_STATUS:
      out.type = Reply::Type::Status;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ARRAY:
      out.type = Reply::Type::Array;
      out.elements.reserve(r->elements);
      for (std::size_t i = 0; i < r->elements; ++i) out.elements.push_back(convert(r->element[i], context));
      break;
    case REDIS_REPLY_ERROR:
      detail::throwReplyError(std::string_view(r->str, r->len), context);
    default:
      // RESP3 types (hiredis 1.x) are never requested: redlimit does not send HELLO 3.
      throw UnexpectedReplyError(fmt::format("redlimit: {}: expected a RESP2 reply, got a reply of hiredis type {}",
                                             context.command, r->type));
  }
  return out;
}

struct ReplyDeleter {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};

[[noreturn]] void badOption(const std::string& why) { throw InvalidArgument(fmt::format("redlimit: {}", why)); }

void checkTimeout(const char* name, milliseconds t) {
  if (t.count() <= 0 || t > kMaxConnectionTimeout) {
    badOption(fmt::format("ConnectionOptions::{} must be in 1..{} ms (no infinite waits; hiredis waits with poll(), "
                          "which takes an int of ms), got {} ms",
                          name, kMaxConnectionTimeout.count(), t.count()));
  }
}

}  // namespace

void checkOptions(const ConnectionOptions& o) {
  checkTimeout("connectTimeout", o.connectTimeout);
  checkTimeout("commandTimeout", o.commandTimeout);
  if (o.unixSocket.size() > kMaxUnixSocketPath) {
    badOption(fmt::format("unix socket path of {} bytes is longer than hiredis hands to the OS intact ({} bytes, "
                          "kMaxUnixSocketPath): it would be cut short and name another socket: {}",
                          o.unixSocket.size(), kMaxUnixSocketPath, o.unixSocket));
  }
  if (o.unixSocket.empty() && (o.port <= 0 || o.port > 65535)) {
    badOption(fmt::format("port must be in 1..65535, got {}", o.port));
  }
  if (o.db < 0) badOption(fmt::format("db must be >= 0, got {}", o.db));
  if (!o.user.empty() && o.password.empty()) badOption("an ACL user needs a password");
  if (o.tls.enabled && !o.unixSocket.empty()) {
    badOption(fmt::format("TLS (TlsOptions::enabled, rediss://) runs over TCP, not over a unix socket; clear "
                          "unixSocket ({}) or turn TLS off",
                          o.unixSocket));
  }
  if (o.tls.certFile.empty() != o.tls.keyFile.empty()) {
    const bool onlyKey = o.tls.certFile.empty();
    badOption(fmt::format("TlsOptions::{} is set but ::{} is empty: a client certificate needs both the certificate "
                          "(certFile, cert= in a URI) and its private key (keyFile, key=)",
                          onlyKey ? "keyFile" : "certFile", onlyKey ? "certFile" : "keyFile"));
  }
}

Connection::Connection(const ConnectionOptions& o) : user_(o.user) {
  checkOptions(o);
  if (o.tls.enabled) {
    // This hiredis connection speaks plain text only: never send AUTH in clear to a client that
    // asked for TLS (rediss://). TLS comes with the transport on detail::Stream.
    throw TlsError("TLS", fmt::format("redlimit: connect to {}: TLS was asked for (TlsOptions::enabled, rediss://), "
                                      "but this connection speaks plain text only; nothing was sent",
                                      endpoint(o)));
  }
  // Connecting ends with the first exchange (and the TLS question, if asked): all of it within
  // connectTimeout, so that a call still takes at most pool wait + connect + command timeout.
  const auto connectDeadline = detail::deadlineAfter(o.connectTimeout);
  const timeval connectTv = toTimeval(o.connectTimeout);
  errno = 0;
  ctx_ = o.unixSocket.empty() ? redisConnectWithTimeout(o.host.c_str(), o.port, connectTv)
                              : redisConnectUnixWithTimeout(o.unixSocket.c_str(), connectTv);
  const int savedErrno = errno;
  if (ctx_ == nullptr) throw std::bad_alloc();
  if (ctx_->err != 0) {
    std::string errstr = ctx_->errstr;
    int err = ctx_->err;
    redisFree(ctx_);
    ctx_ = nullptr;
    detail::throwContextError(err, savedErrno, errstr, fmt::format("connect to {}", endpoint(o)));
  }
  auto connectTimeLeft = [&] {
    const auto left = std::chrono::duration_cast<milliseconds>(connectDeadline - std::chrono::steady_clock::now());
    return std::max(left, milliseconds(1));
  };
  try {
    if (o.keepAlive && o.unixSocket.empty() && redisEnableKeepAlive(ctx_) != REDIS_OK) {
      failTransport("enable TCP keep-alive");
    }
    try {
      greet(o, connectTimeLeft);
    } catch (const ClosedError& e) {
      // Reset before the first reply. A TLS port does that to plain text: ask it in TLS, so the
      // caller learns that the set-up is wrong rather than that Redis is down.
      if (o.unixSocket.empty() &&
          detail::speaksTls(o.host, o.port, detail::deadlineAfter(connectTimeLeft()))) {
        throw TlsPortError("", fmt::format("redlimit: connect to {}: port {} speaks TLS (it reset the plain-text "
                                           "connection and answered a TLS hello); redlimit connects in plain text: "
                                           "use the server's plain port ({})",
                                           endpoint(o), o.port, e.what()));
      }
      throw;
    }
    if (redisSetTimeout(ctx_, toTimeval(o.commandTimeout)) != REDIS_OK) failTransport("set command timeout");
  } catch (...) {
    redisFree(ctx_);
    ctx_ = nullptr;
    throw;
  }
  lastUsed_ = std::chrono::steady_clock::now();
}

void Connection::greet(const ConnectionOptions& o, const std::function<milliseconds()>& timeLeft) {
  auto exchange = [&](std::initializer_list<std::string_view> argv) {
    if (redisSetTimeout(ctx_, toTimeval(timeLeft())) != REDIS_OK) failTransport("set connect timeout");
    (void)command(argv);
  };
  if (!o.password.empty()) {
    if (o.user.empty()) {
      exchange({"AUTH", o.password});
    } else {
      exchange({"AUTH", o.user, o.password});
    }
  }
  if (o.db != 0) {
    const std::string db = fmt::to_string(o.db);
    exchange({"SELECT", db});
  }
  // Without AUTH or SELECT, a PING: a server that wants a password says NOAUTH now, before a
  // limiter's first EVALSHA (whose 13 arguments it would answer with a protocol error and a close).
  if (o.password.empty() && o.db == 0) exchange({"PING"});
}

Connection::~Connection() {
  if (ctx_ != nullptr) redisFree(ctx_);
}

void Connection::failTransport(const char* what) {
  const int savedErrno = errno;
  broken_ = true;
  detail::throwContextError(ctx_->err, savedErrno, ctx_->errstr, what);
}

void Connection::failSend(const char* what, int savedErrno, std::size_t requestBytes) {
  broken_ = true;
  // A server that refuses a request answers first and then closes (with a reset, since it leaves
  // the rest unread); the answer is usually still readable.
  char buf[512];
  const ssize_t n = ::recv(ctx_->fd, buf, sizeof buf, MSG_DONTWAIT);
  if (n > 1 && buf[0] == '-') {
    const std::string_view got(buf + 1, static_cast<std::size_t>(n - 1));
    const auto end = got.find("\r\n");
    if (end != std::string_view::npos) {
      detail::ReplyContext context;
      context.command = what;
      context.user = user_;
      detail::throwReplyError(got.substr(0, end), context);
    }
  }
  const bool closed = savedErrno == ECONNRESET || savedErrno == EPIPE;
  if (closed && requestBytes > kSmallestServerRequestLimit) {
    throw RequestLimitError("", fmt::format("redlimit: {}: the server closed the connection while a request of {} "
                                            "bytes was sent: it exceeds client-query-buffer-limit or "
                                            "proto-max-bulk-len (1 MiB at the least); nothing was run",
                                            what, requestBytes));
  }
  detail::throwContextError(REDIS_ERR_IO, savedErrno, std::strerror(savedErrno), what);
}

void Connection::sendAll(const char* data, std::size_t size, const char* what) {
  // send() with MSG_NOSIGNAL, not hiredis's write(): a write to a connection the server closed
  // must not raise SIGPIPE in the caller's process. SO_SNDTIMEO (the command timeout, set by
  // redisSetTimeout) bounds each call.
  std::size_t sent = 0;
  while (sent < size) {
    const ssize_t n = ::send(ctx_->fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n >= 0) {
      sent += static_cast<std::size_t>(n);
    } else if (errno != EINTR) {
      failSend(what, errno, size);
    }
  }
}

Reply Connection::command(const std::string_view* argv, std::size_t argc) {
  if (broken_) throw ClosedError("redlimit: connection is broken after an earlier error");
  const std::string what = argc > 0 ? std::string(argv[0]) : std::string("command");
  constexpr std::size_t kInline = 16;
  const char* ptrInline[kInline];
  std::size_t lenInline[kInline];
  std::vector<const char*> ptrHeap;
  std::vector<std::size_t> lenHeap;
  const char** ptrs = ptrInline;
  std::size_t* lens = lenInline;
  if (argc > kInline) {
    ptrHeap.resize(argc);
    lenHeap.resize(argc);
    ptrs = ptrHeap.data();
    lens = lenHeap.data();
  }
  for (std::size_t i = 0; i < argc; ++i) {
    ptrs[i] = argv[i].data();
    lens[i] = argv[i].size();
  }
  char* request = nullptr;
  const auto length = redisFormatCommandArgv(&request, static_cast<int>(argc), ptrs, lens);
  if (length < 0 || request == nullptr) throw std::bad_alloc();
  std::unique_ptr<char, void (*)(char*)> requestGuard(request, &redisFreeCommand);
  errno = 0;
  sendAll(request, static_cast<std::size_t>(length), what.c_str());
  void* raw = nullptr;
  if (redisGetReply(ctx_, &raw) != REDIS_OK || raw == nullptr) {
    const int savedErrno = errno;
    if ((ctx_->err == REDIS_ERR_EOF || savedErrno == ECONNRESET) &&
        static_cast<std::size_t>(length) > kSmallestServerRequestLimit) {
      broken_ = true;
      throw RequestLimitError("", fmt::format("redlimit: {}: the server closed the connection without an answer to a "
                                              "request of {} bytes: it exceeds client-query-buffer-limit or "
                                              "proto-max-bulk-len (1 MiB at the least); nothing was run",
                                              what, length));
    }
    errno = savedErrno;
    failTransport(what.c_str());
  }
  std::unique_ptr<redisReply, ReplyDeleter> reply(static_cast<redisReply*>(raw));
  lastUsed_ = std::chrono::steady_clock::now();
  detail::ReplyContext context;
  context.command = what;
  context.user = user_;
  context.fromScript = what == "EVALSHA" || what == "EVAL";
  if (reply->type == REDIS_REPLY_ERROR && detail::replyEndsConnection(std::string_view(reply->str, reply->len))) {
    broken_ = true;  // the server closes it (protocol errors), or it names a replica
  }
  return convert(reply.get(), context);
}

}  // namespace redlimit
