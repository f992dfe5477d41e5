// detail::OneKeyBatcher: one script call for many one-key decisions. The takes of every token
// bucket, GCRA and fixed-window limiter of a Client (handles and Limiters alike) go through
// it: a take that finds a place free (fewer groups in flight than the pool has connections) is
// sent at once with its own script (gcra.lua, fixed_window.lua), as without a batcher; takes that
// arrive while every place is taken queue up (limiters/batcher.hpp) and go together, up to
// kMaxGroup, as one lua/batch.lua call that decides each in order exactly as its own script would,
// the server's clock read once. On a cluster there is one queue per hash slot: a script call's
// keys must share one.
//
// What a group shares is the fixed cost of a script call (EVALSHA's lookup, the arguments, TIME,
// the reply), which is most of what Redis spends on one decision.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "limiters/batcher.hpp"
#include "redlimit/client.hpp"
#include "redlimit/detail/script.hpp"
#include "redlimit/detail/thread_annotations.hpp"

namespace redlimit::detail {

/// One take, as its limiter's own script is called.
struct OneKeyCall {
  std::string key;
  const Script* script = nullptr;  // the limiter's own (static) script: a group of one runs it
  std::vector<std::string> args;   // its ARGV: "take", "" (the server's clock), kind, permits, maxWaitUs[, cfg]
  std::chrono::steady_clock::time_point deadline;
  ReplyCallback done;  // the decision's reply (its own script's), or the error; runs once
};

class OneKeyBatcher : public std::enable_shared_from_this<OneKeyBatcher> {
 public:
  static constexpr std::size_t kMaxGroup = 64;  // batch.lua's limit: no call does unbounded work

  /// The batcher of `client` (one per Client, shared by its limiters, made on first use); null when
  /// ClientOptions::coalesce is off (the default).
  static std::shared_ptr<OneKeyBatcher> of(const std::shared_ptr<Client>& client);

  explicit OneKeyBatcher(std::shared_ptr<Client> client);
  /// Takes still queued end with ClosedError.
  ~OneKeyBatcher();
  OneKeyBatcher(const OneKeyBatcher&) = delete;
  OneKeyBatcher& operator=(const OneKeyBatcher&) = delete;

  /// Sends `call` now, or queues it behind the groups in flight; `call.done` runs on the I/O thread.
  void takeAsync(OneKeyCall call);
  /// The same, waiting: a take that finds a place free is sent from this thread (as eval); one that
  /// queues waits for its group's reply. Throws what the call failed with.
  Reply take(OneKeyCall call);

 private:
  friend class GroupSender<OneKeyBatcher, OneKeyCall>;
  using Sender = GroupSender<OneKeyBatcher, OneKeyCall>;
  using Queue = Sender::Queue;
  Queue& queueFor(const std::string& key);
  // GroupSender's Owner contract (batcher.hpp): a take alone with its own script, a group with
  // batch.lua, whose reply goes to each take of the group.
  void sendAlone(const std::shared_ptr<OneKeyCall>& call, ReplyCallback done);
  void sendTogether(const std::vector<std::shared_ptr<OneKeyCall>>& group,
                    std::chrono::steady_clock::time_point deadline, ReplyCallback done);
  static void answerAlone(OneKeyBatcher* self, OneKeyCall& call, const Reply& reply, std::exception_ptr error) noexcept;
  static void answerTogether(OneKeyBatcher* self, const std::vector<std::shared_ptr<OneKeyCall>>& group,
                             const Reply& reply);

  std::shared_ptr<Client> client_;
  bool cluster_ = false;
  Queue single_;  // standalone and Sentinel: one queue
  Mutex slotsMutex_;
  std::unordered_map<int, std::unique_ptr<Queue>> slots_ REDLIMIT_GUARDED_BY(slotsMutex_);  // a cluster's
};

}  // namespace redlimit::detail
