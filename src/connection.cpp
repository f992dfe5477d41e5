#include "redlimit/connection.hpp"

#include <cerrno>
#include <memory>
#include <string>
#include <sys/time.h>

#include <hiredis/hiredis.h>

#include "error_mapping.hpp"
#include "redlimit/errors.hpp"

namespace redlimit {
namespace {

using std::chrono::milliseconds;

timeval toTimeval(milliseconds ms) {
  timeval tv{};
  tv.tv_sec = static_cast<decltype(tv.tv_sec)>(ms.count() / 1000);
  tv.tv_usec = static_cast<decltype(tv.tv_usec)>((ms.count() % 1000) * 1000);
  return tv;
}

std::string endpoint(const ConnectionOptions& o) {
  return o.unixSocket.empty() ? o.host + ":" + std::to_string(o.port) : "unix:" + o.unixSocket;
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
      throw UnexpectedReplyError("redlimit: " + std::string(context.command) +
                                 ": expected a RESP2 reply, got a reply of hiredis type " + std::to_string(r->type));
  }
  return out;
}

struct ReplyDeleter {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};

[[noreturn]] void badOption(const std::string& why) { throw InvalidArgument("redlimit: " + why); }

void checkTimeout(const char* name, milliseconds t) {
  if (t.count() <= 0 || t > kMaxConnectionTimeout) {
    badOption(std::string("ConnectionOptions::") + name + " must be in 1.." + std::to_string(kMaxConnectionTimeout.count()) +
              " ms (no infinite waits; hiredis waits with poll(), which takes an int of ms), got " +
              std::to_string(t.count()) + " ms");
  }
}

}  // namespace

void checkOptions(const ConnectionOptions& o) {
  checkTimeout("connectTimeout", o.connectTimeout);
  checkTimeout("commandTimeout", o.commandTimeout);
  if (o.unixSocket.size() > kMaxUnixSocketPath) {
    badOption("unix socket path of " + std::to_string(o.unixSocket.size()) + " bytes is longer than hiredis hands to the OS intact (" +
              std::to_string(kMaxUnixSocketPath) + " bytes, kMaxUnixSocketPath): it would be cut short and name another socket: " +
              o.unixSocket);
  }
  if (o.unixSocket.empty() && (o.port <= 0 || o.port > 65535)) {
    badOption("port must be in 1..65535, got " + std::to_string(o.port));
  }
  if (o.db < 0) badOption("db must be >= 0, got " + std::to_string(o.db));
  if (!o.user.empty() && o.password.empty()) badOption("an ACL user needs a password");
}


Connection::Connection(const ConnectionOptions& o) : user_(o.user) {
  checkOptions(o);
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
    detail::throwContextError(err, savedErrno, errstr, "connect to " + endpoint(o));
  }
  try {
    if (redisSetTimeout(ctx_, toTimeval(o.commandTimeout)) != REDIS_OK) failTransport("set command timeout");
    if (o.keepAlive && o.unixSocket.empty() && redisEnableKeepAlive(ctx_) != REDIS_OK) {
      failTransport("enable TCP keep-alive");
    }
    greet(o);
  } catch (...) {
    redisFree(ctx_);
    ctx_ = nullptr;
    throw;
  }
  lastUsed_ = std::chrono::steady_clock::now();
}

void Connection::greet(const ConnectionOptions& o) {
  if (!o.password.empty()) {
    if (o.user.empty()) {
      (void)command({"AUTH", o.password});
    } else {
      (void)command({"AUTH", o.user, o.password});
    }
  }
  if (o.db != 0) {
    const std::string db = std::to_string(o.db);
    (void)command({"SELECT", db});
  }
  // Without AUTH or SELECT, a PING: a server that wants a password says NOAUTH now, before a
  // limiter's first EVALSHA (whose 13 arguments it would answer with a protocol error and a close).
  if (o.password.empty() && o.db == 0) (void)command({"PING"});
}

Connection::~Connection() {
  if (ctx_ != nullptr) redisFree(ctx_);
}

void Connection::failTransport(const char* what) {
  const int savedErrno = errno;
  broken_ = true;
  detail::throwContextError(ctx_->err, savedErrno, ctx_->errstr, what);
}

Reply Connection::command(const std::string_view* argv, std::size_t argc) {
  if (broken_) throw ClosedError("redlimit: connection is broken after an earlier error");
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
  errno = 0;
  void* raw = redisCommandArgv(ctx_, static_cast<int>(argc), ptrs, lens);
  if (raw == nullptr) {
    std::string what = argc > 0 ? std::string(argv[0]) : std::string("command");
    failTransport(what.c_str());
  }
  std::unique_ptr<redisReply, ReplyDeleter> reply(static_cast<redisReply*>(raw));
  lastUsed_ = std::chrono::steady_clock::now();
  detail::ReplyContext context;
  context.command = argc > 0 ? argv[0] : std::string_view("command");
  context.user = user_;
  context.fromScript = context.command == "EVALSHA" || context.command == "EVAL";
  if (reply->type == REDIS_REPLY_ERROR && detail::replyEndsConnection(std::string_view(reply->str, reply->len))) {
    broken_ = true;  // the server closes it after a protocol error
  }
  return convert(reply.get(), context);
}

}  // namespace redlimit
