#include "transport/pipeline.hpp"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "base/error_mapping.hpp"
#include "redlimit/errors.hpp"
#include "transport/no_scripts_memo.hpp"

namespace redlimit::detail {
namespace {

// proto-max-bulk-len and client-query-buffer-limit cannot be set below 1 MiB: a connection the
// server closes while a larger request is on it is taken as a request over those limits.
constexpr std::size_t kSmallestServerRequestLimit = std::size_t{1} << 20;

// The exception an error reply stands for, as error_mapping classifies it.
std::exception_ptr replyErrorOf(std::string_view text, const Request& r, std::string_view user) {
  try {
    ReplyContext context;
    context.command = r.command;
    context.user = user;
    context.fromScript = r.script != nullptr;
    throwReplyError(text, context);
  } catch (...) {
    return std::current_exception();
  }
}

// The EVAL form of an EVALSHA request: the same arguments after the SHA1.
std::string asEval(const Request& r) {
  // "*N\r\n" "$7\r\nEVALSHA\r\n" "$40\r\n<sha1>\r\n" then numkeys, keys, args.
  const std::size_t header = r.bytes.find("\r\n") + 2;
  const std::size_t rest = header + 13 + 5 + 40 + 2;
  std::string out;
  out.reserve(r.bytes.size() + r.script->source.size());
  out.append(r.bytes, 0, header);
  out += "$4\r\nEVAL\r\n";
  out += fmt::format("${}\r\n", r.script->source.size());
  out += r.script->source;
  out += "\r\n";
  out.append(r.bytes, rest, std::string::npos);
  return out;
}

}  // namespace

Request makeRequest(const std::string_view* argv, std::size_t argc) {
  Request r;
  appendCommand(r.bytes, argv, argc);
  r.command = argc > 0 ? std::string(argv[0]) : std::string("command");
  return r;
}

Request makeScriptRequest(const Script& script, const std::vector<std::string_view>& keys,
                          const std::vector<std::string_view>& args) {
  constexpr std::size_t kInline = 24;
  std::string_view inlineArgv[kInline];
  std::vector<std::string_view> heapArgv;
  const std::size_t argc = 3 + keys.size() + args.size();
  std::string_view* argv = inlineArgv;
  if (argc > kInline) {
    heapArgv.resize(argc);
    argv = heapArgv.data();
  }
  const fmt::format_int numKeys(keys.size());
  argv[0] = "EVALSHA";
  argv[1] = script.sha1;
  argv[2] = std::string_view(numKeys.data(), numKeys.size());
  std::copy(keys.begin(), keys.end(), argv + 3);
  std::copy(args.begin(), args.end(), argv + 3 + keys.size());
  Request r;
  appendCommand(r.bytes, argv, argc);
  r.command = "EVALSHA";
  r.script = &script;
  return r;
}

Finished failed(Request& r, std::exception_ptr error) {
  return Finished{std::move(r.done), Outcome{Reply{}, std::move(error)}, r.counted, r.deadline};
}

void CompletionQueue::add(std::vector<Finished>& done) {
  if (done.empty()) return;
  if (head_ > 0 && head_ == items_.size()) {
    items_.clear();
    head_ = 0;
  }
  unsorted_ = unsorted_ || !items_.empty() || done.size() > 1;
  items_.insert(items_.end(), std::make_move_iterator(done.begin()), std::make_move_iterator(done.end()));
  done.clear();
}

void CompletionQueue::take(std::size_t max, std::vector<Finished>& slice) {
  if (unsorted_) {
    std::stable_sort(items_.begin() + static_cast<std::ptrdiff_t>(head_), items_.end(),
                     [](const Finished& a, const Finished& b) { return a.deadline < b.deadline; });
    unsorted_ = false;
  }
  const std::size_t n = std::min(max, size());
  for (std::size_t i = 0; i < n; ++i) slice.push_back(std::move(items_[head_++]));
  if (head_ == items_.size()) {
    items_.clear();
    head_ = 0;
  }
}

void runCompletions(CompletionQueue& queue, std::size_t slice, const std::function<void(std::vector<Finished>&)>& due,
                    const std::function<void(std::vector<Finished>&)>& run) {
  std::vector<Finished> batch;
  std::vector<Finished> more;
  while (!queue.empty()) {
    queue.take(slice, batch);
    run(batch);
    batch.clear();
    if (queue.empty()) return;
    due(more);
    queue.add(more);
  }
}

Pipeline::Pipeline(const ClientOptions::ReplyLimits& limits, std::string user, std::string endpoint,
                   EventCallback events, std::vector<const Script*>* scriptsSeen, Mutex* seenMutex,
                   NoScriptsMemo* noScripts)
    : parser_(limits),
      user_(std::move(user)),
      endpoint_(std::move(endpoint)),
      events_(std::move(events)),
      scriptsSeen_(scriptsSeen),
      seenMutex_(seenMutex),
      noScripts_(noScripts) {}

// A handful of static scripts: a scan of pointers.
bool Pipeline::noteSeen(const Script* script) {
  if (scriptsSeen_ == nullptr) return false;
  if (seenMutex_ != nullptr) seenMutex_->lock();
  const bool seen = std::find(scriptsSeen_->begin(), scriptsSeen_->end(), script) != scriptsSeen_->end();
  if (!seen) scriptsSeen_->push_back(script);
  if (seenMutex_ != nullptr) seenMutex_->unlock();
  return seen;
}

Pipeline::~Pipeline() = default;

void Pipeline::push(Request request) { queued_.push_back(std::move(request)); }

std::string_view Pipeline::output() {
  if (writePos_ == writeBuf_.size()) {
    writeBuf_.clear();
    writePos_ = 0;
  }
  while (!queued_.empty()) {
    Request& r = queued_.front();
    if (r.asking) {
      // ASKING holds for the next command of the connection only; its +OK is nobody's reply.
      static constexpr std::string_view kAsking = "*1\r\n$6\r\nASKING\r\n";
      writeBuf_ += kAsking;
      Request asking;
      asking.command = "ASKING";
      asking.deadline = r.deadline;
      asking.counted = false;
      asking.done = [](const Outcome&) {};
      written_.push_back(Written{std::move(asking), nextSeq_++, kAsking.size()});
    }
    const std::size_t size = r.bytes.size();
    writeBuf_ += r.bytes;
    if (r.script == nullptr) std::string().swap(r.bytes);  // script requests keep theirs for a NOSCRIPT resend
    written_.push_back(Written{std::move(r), nextSeq_++, size});
    queued_.pop_front();
  }
  return std::string_view(writeBuf_).substr(writePos_);
}

void Pipeline::wrote(std::size_t n) {
  writePos_ += n;
  if (writePos_ == writeBuf_.size()) {
    writeBuf_.clear();
    writePos_ = 0;
  }
}

void Pipeline::received(const char* data, std::size_t size, std::vector<Finished>& done) {
  if (broken_) return;
  try {
    parser_.feed(data, size);
    while (!broken_) {
      auto reply = parser_.next();
      if (!reply) break;
      if (written_.empty()) {
        throw IoError(
            ErrorKind::Protocol, "",
            fmt::format("redlimit: {} sent a reply to no request: the reply stream is out of step", endpoint_));
      }
      finishReply(std::move(*reply), done);
    }
  } catch (const IoError& e) {
    if (e.kind() != ErrorKind::Protocol) throw;
    const auto why = std::make_exception_ptr(
        IoError(ErrorKind::Protocol, "", fmt::format("{} (from {}; connection closed)", e.what(), endpoint_)));
    if (!written_.empty()) {
      Written w = std::move(written_.front());
      written_.pop_front();
      fail(w, why, done);
    }
    breakWith(why, done);
  }
}

void Pipeline::finishReply(WireReply&& reply, std::vector<Finished>& done) {
  ++replies_;
  Written w = std::move(written_.front());
  written_.pop_front();
  if (!reply.isError) {
    if (w.request.script != nullptr) {
      (void)noteSeen(w.request.script);
      if (noScripts_ != nullptr) noScripts_->forget();
    }
    done.push_back(Finished{std::move(w.request.done), Outcome{std::move(reply.value), nullptr}, w.request.counted,
                            w.request.deadline});
    return;
  }
  if (w.request.script != nullptr && reply.error.compare(0, 9, "NOSCRIPT ") == 0 && retryNoScript(w, done)) return;
  const auto error = replyErrorOf(reply.error, w.request, user_);
  if (w.request.script != nullptr && noScripts_ != nullptr) {
    // NOSCRIPT (above) says nothing yet: a Valkey without Lua answers EVALSHA so too.
    if (runsNoScripts(reply.error, true)) {
      noScripts_->learn(error, Steady::now());
    } else {
      noScripts_->forget();
    }
  }
  const bool ends = replyEndsConnection(reply.error);
  fail(w, error, done);
  if (w.request.internal || ends) {
    // The server closes the connection after this reply (protocol errors, too many clients), or
    // the connection must not be used again (a replica): the same error for everything on it.
    breakWith(error, done);
  }
}

bool Pipeline::retryNoScript(Written& w, std::vector<Finished>& done) {
  Request& r = w.request;
  const Script& script = *r.script;
  auto loaded = loadedAt_.find(script.sha1);
  const bool sentAfterLoad = loaded == loadedAt_.end() || w.seq > loaded->second;
  if (r.scriptStage >= 2) return false;  // EVAL cannot answer NOSCRIPT; never loop
  if (sentAfterLoad && r.scriptStage == 1) {
    // Loaded, and flushed again before the resend ran: send the source itself, which cannot miss.
    r.bytes = asEval(r);
    r.command = "EVAL";
    r.scriptStage = 2;
  } else if (sentAfterLoad) {
    const std::string_view argv[] = {"SCRIPT", "LOAD", script.source};
    Request load = makeRequest(argv, 3);
    load.deadline = r.deadline;
    load.budget = r.budget;
    load.done = [](const Outcome&) {};  // a failed load shows as NOSCRIPT again on the resend
    load.counted = false;
    loadedAt_[script.sha1] = nextSeq_ + queued_.size();
    queued_.push_back(std::move(load));
    r.scriptStage = 1;
    if (noteSeen(&script) && events_) {
      // Reported as a completion: it runs after this read, outside the connection's lock.
      Event e;
      e.kind = Event::Kind::ScriptReload;
      e.script = std::string(script.name);
      e.node = endpoint_;
      e.description = fmt::format(
          "server {} no longer had script {} (NOSCRIPT: restarted or SCRIPT FLUSH); loaded it again and "
          "resent the calls",
          endpoint_, script.name);
      done.push_back(
          Finished{[events = events_, e = std::move(e)](const Outcome&) { events(e); }, Outcome{}, false, r.deadline});
    }
  }
  queued_.push_back(std::move(r));
  return true;
}

void Pipeline::fail(Written& w, const std::exception_ptr& error, std::vector<Finished>& done) {
  // Its own copy: the same error may go to many callers, and this pipeline keeps it (brokenBy()).
  done.push_back(failed(w.request, cloneError(error)));
}

void Pipeline::breakWith(const std::exception_ptr& why, std::vector<Finished>& done) {
  if (!broken_) broken_ = why;
  while (!written_.empty()) {
    Written w = std::move(written_.front());
    written_.pop_front();
    std::exception_ptr error = why;
    if (w.size > kSmallestServerRequestLimit && holds<ClosedError>(why)) {
      error = std::make_exception_ptr(ConfigurationError(
          ErrorKind::RequestLimit, "",
          fmt::format("redlimit: {}: the server ({}) closed the connection while a request of {} bytes was on it: "
                      "it exceeds client-query-buffer-limit or proto-max-bulk-len (1 MiB at the least); "
                      "nothing was run",
                      w.request.command, endpoint_, w.size)));
    }
    fail(w, error, done);
  }
  writeBuf_.clear();
  writePos_ = 0;
}

std::exception_ptr Stall::error(std::string_view command, std::chrono::milliseconds budget) const {
  return errorOf<TimeoutError>(
      ErrorKind::CallbackBlocked,
      fmt::format(
          "redlimit: {}: its {} ms deadline passed while a completion callback held the Client's I/O thread for {} ms "
          "(callbacks run on that thread and must not block: hand slow work to a thread of your own)",
          command, budget.count(), std::chrono::duration_cast<std::chrono::milliseconds>(to - from).count()));
}

void Pipeline::expire(SteadyTime now, std::vector<Finished>& done, const Stall& stall) {
  for (auto it = queued_.begin(); it != queued_.end();) {
    if (it->deadline <= now) {
      done.push_back(
          failed(*it, stall.covers(it->deadline)
                          ? stall.error(it->command, it->budget)
                          : errorOf<TimeoutError>(fmt::format("redlimit: {}: not sent within its {} ms deadline ({})",
                                                              it->command, it->budget.count(), endpoint_))));
      it = queued_.erase(it);
    } else {
      ++it;
    }
  }
  if (broken_) return;
  for (auto it = written_.begin(); it != written_.end(); ++it) {
    if (it->request.deadline > now) continue;
    Written w = std::move(*it);
    written_.erase(it);
    if (w.request.internal) {
      // The greeting (AUTH, SELECT or PING) is part of connecting: everything that waited on this
      // connection gets the connect timeout.
      const auto timeout = errorOf<TimeoutError>(
          fmt::format("redlimit: connect to {}: no answer to {} within the connect timeout ({} ms)", endpoint_,
                      w.request.command, w.request.budget.count()));
      fail(w, timeout, done);
      breakWith(timeout, done);
      return;
    }
    fail(w,
         stall.covers(w.request.deadline)
             ? stall.error(w.request.command, w.request.budget)
             : errorOf<TimeoutError>(fmt::format("redlimit: {}: no reply from {} within the request's {} ms deadline; "
                                                 "the connection was closed so that no later reply can be taken for "
                                                 "another request",
                                                 w.request.command, endpoint_, w.request.budget.count())),
         done);
    breakWith(errorOf<ClosedError>(fmt::format("redlimit: connection to {} closed because an earlier request on it "
                                               "got no reply in time",
                                               endpoint_)),
              done);
    return;
  }
}

SteadyTime Pipeline::nextDeadline() const {
  SteadyTime next = SteadyTime::max();
  for (const auto& r : queued_) next = std::min(next, r.deadline);
  for (const auto& w : written_) next = std::min(next, w.request.deadline);
  return next;
}

std::vector<Request> Pipeline::close(const std::exception_ptr& why, std::vector<Finished>& done) {
  breakWith(why, done);
  std::vector<Request> rest;
  rest.reserve(queued_.size());
  for (auto& r : queued_) rest.push_back(std::move(r));
  queued_.clear();
  return rest;
}

}  // namespace redlimit::detail
