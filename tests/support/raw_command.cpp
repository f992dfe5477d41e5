#include "redlimit_test/raw_command.hpp"

#include <hiredis/hiredis.h>

#include <csignal>
#include <ctime>
#include <memory>
#include <pthread.h>
#include <stdexcept>

namespace redlimit::test {
namespace {

RawReply convert(const redisReply& r) {
  RawReply out;
  switch (r.type) {
    case REDIS_REPLY_INTEGER:
      out.type = RawReply::Type::Integer;
      out.integer = r.integer;
      break;
    case REDIS_REPLY_STRING:
    case REDIS_REPLY_STATUS:
    case REDIS_REPLY_ERROR:
      out.type = r.type == REDIS_REPLY_STRING   ? RawReply::Type::String
                 : r.type == REDIS_REPLY_STATUS ? RawReply::Type::Status
                                                : RawReply::Type::Error;
      out.str.assign(r.str, r.len);
      break;
    case REDIS_REPLY_ARRAY:
      out.type = RawReply::Type::Array;
      for (std::size_t i = 0; i < r.elements; ++i) out.elements.push_back(convert(*r.element[i]));
      break;
    default:
      break;  // REDIS_REPLY_NIL
  }
  return out;
}

// hiredis writes with write(2): a server that dies mid-call would raise SIGPIPE and end the test
// process. Blocks SIGPIPE on this thread for the call and drops one raised meanwhile.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    alreadyPending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeGuard() {
    if (!alreadyPending_) {
      const timespec zero{0, 0};
      while (sigtimedwait(&pipe_, nullptr, &zero) == SIGPIPE) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  sigset_t pipe_{};
  sigset_t old_{};
  bool alreadyPending_ = false;
};

}  // namespace

RawReply rawCommand(const std::string& host, int port, const std::vector<std::string>& argv,
                    std::chrono::milliseconds timeout, const std::string& password) {
  const long long ms = timeout.count();
  const timeval tv{static_cast<time_t>(ms / 1000), static_cast<suseconds_t>((ms % 1000) * 1000)};
  const std::string where = host + ":" + std::to_string(port);
  SigpipeGuard guard;
  std::unique_ptr<redisContext, void (*)(redisContext*)> c(redisConnectWithTimeout(host.c_str(), port, tv), redisFree);
  if (!c) throw std::runtime_error("cannot allocate a hiredis context for " + where);
  if (c->err != 0) throw std::runtime_error("cannot connect to " + where + ": " + c->errstr);
  if (redisSetTimeout(c.get(), tv) != REDIS_OK) throw std::runtime_error("cannot set a timeout on " + where);
  if (!password.empty()) {
    const char* authArgs[] = {"AUTH", password.data()};
    const std::size_t authLengths[] = {4, password.size()};
    std::unique_ptr<redisReply, void (*)(void*)> auth(
        static_cast<redisReply*>(redisCommandArgv(c.get(), 2, authArgs, authLengths)), freeReplyObject);
    if (!auth) throw std::runtime_error("no reply from " + where + " to AUTH: " + c->errstr);
    if (auth->type == REDIS_REPLY_ERROR) return convert(*auth);
  }
  std::vector<const char*> args;
  std::vector<std::size_t> lengths;
  for (const std::string& a : argv) {
    args.push_back(a.data());
    lengths.push_back(a.size());
  }
  std::unique_ptr<redisReply, void (*)(void*)> reply(
      static_cast<redisReply*>(redisCommandArgv(c.get(), static_cast<int>(args.size()), args.data(), lengths.data())),
      freeReplyObject);
  if (!reply) {
    throw std::runtime_error("no reply from " + where + " to " + (argv.empty() ? "" : argv[0]) + ": " + c->errstr);
  }
  return convert(*reply);
}

std::string infoValue(std::string_view text, std::string_view field) {
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.size() > field.size() && line.substr(0, field.size()) == field && line[field.size()] == ':') {
      return std::string(line.substr(field.size() + 1));
    }
    pos = end + 1;
  }
  return "";
}

}  // namespace redlimit::test
