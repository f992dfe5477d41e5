// redlimit — the request/reply state of one multiplexed connection, without I/O ("sans-I/O",
// as Boost.Redis keeps its exec state machines): requests go in, bytes to write come out, bytes
// read go in, finished requests come out in order. Deadlines and NOSCRIPT resends are decided
// here too. The socket loop (transport.cpp) is a thin shell around it; tests feed it bytes.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "redlimit/errors.hpp"
#include "redlimit/events.hpp"
#include "redlimit/options.hpp"
#include "redlimit/detail/reply.hpp"
#include "redlimit/detail/script.hpp"
#include "redlimit/detail/thread_annotations.hpp"
#include "base/error_mapping.hpp"
#include "codec/resp.hpp"

namespace redlimit::detail {

class NoScriptsMemo;

using Steady = std::chrono::steady_clock;
using SteadyTime = Steady::time_point;

/// What a request ends with: a reply, or the exception that explains why there is none.
struct Outcome {
  Reply reply;
  std::exception_ptr error;
};

/// Called exactly once per request with its outcome.
using Completion = std::function<void(Outcome)>;

/// One command on its way to a server.
struct Request {
  std::string bytes;                        // the RESP encoding; for a script, the EVALSHA form
  std::string command;                      // argv[0] for messages ("EVALSHA", "PING")
  SteadyTime deadline = SteadyTime::max();  // the whole request (queueing, write, reply) ends here
  std::chrono::milliseconds budget{0};      // the time it was given, for messages
  Completion done;
  const Script* script = nullptr;  // set for EVALSHA: NOSCRIPT is handled by the pipeline
  int scriptStage = 0;             // 0 EVALSHA; 1 resent after a SCRIPT LOAD; 2 sent as EVAL
  bool internal = false;           // the connection's own (greeting, PING): errors end the connection
  bool counted = true;             // a caller's request (counted in Transport's pending requests)
  bool asking = false;             // sent right after an ASKING on the same connection (a Redis
                                   // Cluster's ASK redirect), on every resend too
};

/// A request that finished, with its outcome; the caller runs done(outcome) outside its locks.
/// When a completion callback held the I/O thread (from, to], and for how long: requests whose
/// deadline fell within it end with TimeoutError (CallbackBlocked). Empty (from == to): none.
struct Stall {
  SteadyTime from{};
  SteadyTime to{};
  [[nodiscard]] bool covers(SteadyTime deadline) const noexcept { return deadline > from && deadline <= to; }
  /// "redlimit: EVALSHA: its 100 ms deadline passed while a completion callback held the Client's
  /// I/O thread for 850 ms (...)".
  [[nodiscard]] std::exception_ptr error(std::string_view command, std::chrono::milliseconds budget) const;
};

struct Finished {
  Completion done;
  Outcome outcome;
  bool counted = true;                      // Request::counted
  SteadyTime deadline = SteadyTime::max();  // Request::deadline: when its completion is due at the latest
};

/// `r` ended with `error`: its completion, to run with it.
[[nodiscard]] Finished failed(Request& r, std::exception_ptr error);

/// Finished requests whose completions wait to run, handed out earliest deadline first (equal
/// deadlines in the order they came) in slices, so that whoever runs them can look at the clock
/// between slices: thousands of requests failed at once (a connection that timed out, with its
/// whole pipeline) must not hold back another request whose deadline passes meanwhile.
class CompletionQueue {
 public:
  /// Moves every entry of `done` in (`done` is left empty).
  void add(std::vector<Finished>& done);
  [[nodiscard]] bool empty() const noexcept { return head_ == items_.size(); }
  [[nodiscard]] std::size_t size() const noexcept { return items_.size() - head_; }
  /// Moves up to `max` entries, the earliest deadlines first, to the end of `slice`.
  void take(std::size_t max, std::vector<Finished>& slice);

 private:
  std::vector<Finished> items_;  // items_[head_..] wait; sorted from head_ on unless unsorted_
  std::size_t head_ = 0;
  bool unsorted_ = false;
};

/// Runs the completions in `queue` (with `run`) earliest deadline first, `slice` at a time. Before
/// each slice after the first, `due(done)` adds the requests whose deadline passed meanwhile (the
/// transport: what every connection failed since), which are served by their deadline too. So no
/// completion runs later than its deadline plus the time one slice takes (if the completions keep
/// up with the deadlines), however many requests ended at once. Returns once the queue is empty.
void runCompletions(CompletionQueue& queue, std::size_t slice, const std::function<void(std::vector<Finished>&)>& due,
                    const std::function<void(std::vector<Finished>&)>& run);

/// True if `error` holds an E (or a subclass of it), a redlimit error. Looked at in place
/// (errorIn), without a rethrow.
template <class E>
[[nodiscard]] bool holds(const std::exception_ptr& error) {
  static_assert(std::is_base_of_v<Error, E>, "holds<E>: E is a redlimit error");
  return dynamic_cast<const E*>(errorIn(error)) != nullptr;
}

/// True if `error` holds a redlimit error of kind `kind`. Looked at in place (errorIn).
[[nodiscard]] inline bool holdsKind(const std::exception_ptr& error, ErrorKind kind) {
  const Error* e = errorIn(error);
  return e != nullptr && e->kind() == kind;
}

/// `E(args...)` as an exception_ptr: errorOf<TimeoutError>(ErrorKind::PoolTimeout, message).
template <class E, class... Args>
[[nodiscard]] std::exception_ptr errorOf(Args&&... args) {
  return std::make_exception_ptr(E(std::forward<Args>(args)...));
}

/// Builds a Request for argv (copied into RESP at once: the caller's views may go away).
[[nodiscard]] Request makeRequest(const std::string_view* argv, std::size_t argc);
/// Builds the EVALSHA request for `script` (static storage) with keys and args.
[[nodiscard]] Request makeScriptRequest(const Script& script, const std::vector<std::string_view>& keys,
                                        const std::vector<std::string_view>& args);

/// One connection's requests: queued (not yet handed out for writing), written (awaiting their
/// replies, in order), and the parser of the reply stream. Once it fails (a protocol error, a
/// deadline passed on a written request, the connection closed) it is broken(): it takes no more
/// bytes, and close() hands back the requests that were never written so that another connection
/// can carry them. Not thread-safe: owned by the I/O thread.
class Pipeline {
 public:
  /// `user` is the ACL user the connection authenticates as (for messages); `endpoint` names the
  /// server ("127.0.0.1:6379") in messages. `events`, if set, hears of each script reload
  /// (Event::Kind::ScriptReload), as a completion in `done`: it runs where completions run.
  /// `scriptsSeen` (may be null) lists the scripts the server was seen to hold, shared by the
  /// connections to one server (their owner's): a NOSCRIPT for one of them is a reload (the server
  /// restarted or was flushed); for another, the first load, not reported. `seenMutex` (may be
  /// null: one thread uses the list) guards it when pipelines of several threads share it.
  /// `noScripts` (may be null), shared by the connections to one server too, learns from each
  /// script request's answer whether the server runs scripts for this client (NoScriptsMemo).
  Pipeline(const ClientOptions::ReplyLimits& limits, std::string user, std::string endpoint, EventCallback events = {},
           std::vector<const Script*>* scriptsSeen = nullptr, Mutex* seenMutex = nullptr,
           NoScriptsMemo* noScripts = nullptr);
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  /// Queues a request behind the others.
  void push(Request request);

  /// The bytes to write next: every queued request joins the write buffer here and counts as
  /// written from now on (automatic pipelining: whatever queued meanwhile leaves in one write).
  [[nodiscard]] std::string_view output();
  /// `n` bytes of output() went out.
  void wrote(std::size_t n);
  [[nodiscard]] bool hasOutput() const noexcept { return writePos_ < writeBuf_.size() || !queued_.empty(); }

  /// Bytes read from the connection: each complete reply finishes the oldest written request
  /// (appended to `done`). NOSCRIPT answers to script requests are handled here: the first one
  /// after the script was last loaded queues one SCRIPT LOAD, and each failed request is queued
  /// again (after a load it already follows, as EVALSHA; if it fails again, as EVAL with the
  /// source). A protocol error or a reply over ClientOptions::ReplyLimits breaks the pipeline: the request that
  /// reply would answer fails with IoError (Protocol), the other written ones with ClosedError.
  void received(const char* data, std::size_t size, std::vector<Finished>& done);

  /// Fails the requests whose deadline has passed at `now` with TimeoutError. A written one breaks
  /// the pipeline (its reply may still come, and must never be matched to a later request): the
  /// other written requests then fail with ClosedError. Queued ones just leave the queue. A request
  /// whose deadline fell within `stall` (a completion callback held the I/O thread) fails with
  /// TimeoutError (CallbackBlocked) instead.
  void expire(SteadyTime now, std::vector<Finished>& done, const Stall& stall = {});
  /// The earliest deadline of any request here (SteadyTime::max() if none).
  [[nodiscard]] SteadyTime nextDeadline() const;

  /// Ends the pipeline because of `why` (the connection failed or is being closed): every written
  /// request fails with `why` (requests over 1 MiB with ConfigurationError (RequestLimit) when `why` is a
  /// ClosedError: the server closes a connection whose request is over its limits); the queued
  /// requests, never written, are returned to be sent elsewhere.
  [[nodiscard]] std::vector<Request> close(const std::exception_ptr& why, std::vector<Finished>& done);

  [[nodiscard]] bool broken() const noexcept { return broken_ != nullptr; }
  /// Why the pipeline broke (nullptr while it works).
  [[nodiscard]] const std::exception_ptr& brokenBy() const noexcept { return broken_; }
  /// Requests written and not answered yet.
  [[nodiscard]] std::size_t awaiting() const noexcept { return written_.size(); }
  /// Requests queued or written.
  [[nodiscard]] std::size_t size() const noexcept { return written_.size() + queued_.size(); }
  /// Replies matched so far (0 means the server never answered anything on this connection).
  [[nodiscard]] std::uint64_t replies() const noexcept { return replies_; }

 private:
  struct Written {
    Request request;
    std::uint64_t seq;  // position in the connection's command stream
    std::size_t size;   // bytes of the request
  };
  void finishReply(WireReply&& reply, std::vector<Finished>& done);
  bool retryNoScript(Written& w, std::vector<Finished>& done);  // true if the request was queued again
  void fail(Written& w, const std::exception_ptr& error, std::vector<Finished>& done);
  void breakWith(const std::exception_ptr& why, std::vector<Finished>& done);
  // Adds `script` to scriptsSeen_; true if it was there. Locks seenMutex_ if there is one.
  bool noteSeen(const Script* script) REDLIMIT_NO_THREAD_SAFETY_ANALYSIS;

  ReplyParser parser_;
  std::string user_;
  std::string endpoint_;
  EventCallback events_;
  std::vector<const Script*>* scriptsSeen_;
  Mutex* seenMutex_;
  NoScriptsMemo* noScripts_;
  std::deque<Request> queued_;
  std::deque<Written> written_;
  std::string writeBuf_;
  std::size_t writePos_ = 0;
  std::uint64_t nextSeq_ = 0;
  std::uint64_t replies_ = 0;
  // For each script (by SHA1 text): the sequence number of the last SCRIPT LOAD queued on this
  // connection. A NOSCRIPT for a request written before it is answered by that load already.
  std::unordered_map<std::string_view, std::uint64_t> loadedAt_;
  std::exception_ptr broken_;
};

}  // namespace redlimit::detail
