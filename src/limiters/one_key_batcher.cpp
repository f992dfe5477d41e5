#include "limiters/one_key_batcher.hpp"

#include <algorithm>
#include <mutex>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "base/error_mapping.hpp"
#include "limiters/decision_reply.hpp"
#include "redlimit/detail/client_access.hpp"
#include "redlimit/detail/deadline.hpp"
#include "redlimit/errors.hpp"
#include "redlimit_lua.hpp"
#include "topology/key_slot.hpp"
#include "transport/sync_wait.hpp"

namespace redlimit::detail {

namespace {

const Script kBatch{lua::batch.name, lua::batch.sha1, lua::batch.source};

// The Client's batcher, made on first use. Keyed by the Client's address: a batcher holds its
// Client, so while an entry is alive its address cannot be reused; a dead entry is replaced.
struct Registry {
  std::mutex mutex;
  std::unordered_map<const Client*, std::weak_ptr<OneKeyBatcher>> byClient;
};

Registry& registry() {
  static auto* r = new Registry;  // never destroyed: limiters may outlive static destruction order
  return *r;
}

}  // namespace

std::shared_ptr<OneKeyBatcher> OneKeyBatcher::of(const std::shared_ptr<Client>& client) {
  if (!client || !client->options().coalesce) return nullptr;
  Registry& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  std::weak_ptr<OneKeyBatcher>& entry = r.byClient[client.get()];
  if (auto alive = entry.lock()) return alive;
  auto made = std::make_shared<OneKeyBatcher>(client);
  entry = made;
  if (r.byClient.size() > 64) {  // forget the Clients that are gone
    for (auto it = r.byClient.begin(); it != r.byClient.end();) {
      it = it->second.expired() ? r.byClient.erase(it) : std::next(it);
    }
  }
  return made;
}

OneKeyBatcher::OneKeyBatcher(std::shared_ptr<Client> client)
    : client_(std::move(client)),
      cluster_(client_->options().topology == ClientOptions::Topology::Cluster),
      single_(kMaxGroup, groupsInFlight(client_->options())) {}

OneKeyBatcher::~OneKeyBatcher() {
  std::vector<std::shared_ptr<OneKeyCall>> left;
  const auto take = [&](Queue& q) {
    for (auto& c : q.drain()) left.push_back(std::move(c));
  };
  take(single_);
  {
    const LockGuard lock(slotsMutex_);
    for (auto& [slot, q] : slots_) take(*q);
  }
  if (left.empty()) return;
  const auto closed = std::make_exception_ptr(
      ClosedError("redlimit: the last limiter of this Client was dropped before this decision was sent"));
  for (const auto& c : left) {
    if (ReplyCallback done = std::move(c->done)) done(Reply{}, cloneError(closed));
  }
}

OneKeyBatcher::Queue& OneKeyBatcher::queueFor(const std::string& key) {
  if (!cluster_) return single_;
  const int slot = keySlot(key);
  const LockGuard lock(slotsMutex_);
  std::unique_ptr<Queue>& q = slots_[slot];
  if (!q) q = std::make_unique<Queue>(kMaxGroup, groupsInFlight(client_->options()));
  return *q;
}

void OneKeyBatcher::takeAsync(OneKeyCall call) {
  auto c = std::make_shared<OneKeyCall>(std::move(call));
  Queue& q = queueFor(c->key);
  if (q.claimOrQueue(c)) send(q, {std::move(c)});
}

Reply OneKeyBatcher::take(OneKeyCall call) {
  auto c = std::make_shared<OneKeyCall>(std::move(call));
  Queue& q = queueFor(c->key);
  SyncWait<Reply> wait;
  const std::chrono::steady_clock::time_point deadline = c->deadline;
  c->done = wait.callback();
  std::shared_ptr<OneKeyCall> mine = c;
  if (q.claimOrQueue(c)) {
    // A place free: sent from this thread, as eval; takes that find every place taken queue up,
    // and leave together once a group in flight is answered (or has failed).
    struct Next {
      OneKeyBatcher* self;
      Queue& queue;
      ~Next() { self->groupDone(queue); }
    } next{this, q};
    const std::vector<std::string_view> keys{mine->key};
    const std::vector<std::string_view> args(mine->args.begin(), mine->args.end());
    return eval(*client_, mine->script, keys, args, mine->deadline);
  }
  // Queued: its group is sent by the I/O thread, and ends by the group's deadline (at most this
  // take's); a second more and the wait gives up rather than hang.
  return wait.get(deadlineAfter<std::chrono::steady_clock>(
      deadline, saturatingAdd(client_->options().connection.connectTimeout, std::chrono::milliseconds{1000})));
}

void OneKeyBatcher::groupDone(Queue& queue) {
  std::vector<std::shared_ptr<OneKeyCall>> next = queue.next();
  if (!next.empty()) send(queue, std::move(next));
}

void OneKeyBatcher::send(Queue& queue, std::vector<std::shared_ptr<OneKeyCall>> group) {
  // A take whose deadline passed while it queued ends now: sent, it would cut its group's deadline.
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::shared_ptr<OneKeyCall>> live;
  live.reserve(group.size());
  for (auto& c : group) {
    if (c->deadline != std::chrono::steady_clock::time_point{} && c->deadline <= now) {
      if (ReplyCallback done = std::move(c->done)) {
        done(Reply{},
             std::make_exception_ptr(TimeoutError(fmt::format(
                 "redlimit: the decision on {} waited for the calls before it until its deadline passed", c->key))));
      }
    } else {
      live.push_back(std::move(c));
    }
  }
  if (live.empty()) {
    groupDone(queue);
    return;
  }
  std::weak_ptr<OneKeyBatcher> weak = weak_from_this();
  Queue* q = &queue;
  if (live.size() == 1) {
    // Alone: its own script, which costs Redis less than a batch of one (and has a fast path).
    std::shared_ptr<OneKeyCall> c = std::move(live.front());
    const std::vector<std::string_view> keys{c->key};
    const std::vector<std::string_view> args(c->args.begin(), c->args.end());
    try {
      evalAsync(
          *client_, c->script, keys, args,
          [weak, q, c](Reply reply, std::exception_ptr error) {      // NOLINT(performance-unnecessary-value-param)
            if (const auto self = weak.lock()) self->groupDone(*q);  // the next group leaves first
            if (ReplyCallback done = std::move(c->done)) done(std::move(reply), std::move(error));
          },
          c->deadline);
    } catch (...) {
      fail(queue, {c}, std::current_exception());
    }
    return;
  }
  const std::string count = fmt::to_string(live.size());
  std::vector<std::string_view> keys;
  std::vector<std::string_view> args{"take", "", count};
  keys.reserve(live.size());
  args.reserve(3 + 4 * live.size());
  auto deadline = std::chrono::steady_clock::time_point::max();
  for (const auto& c : live) {
    keys.emplace_back(c->key);
    // The take's own arguments: kind, permits, maxWaitUs, the configuration in the call or ''.
    args.emplace_back(c->args.at(2));
    args.emplace_back(c->args.at(3));
    args.emplace_back(c->args.size() > 4 ? std::string_view(c->args[4]) : std::string_view("0"));
    args.emplace_back(c->args.size() > 5 ? std::string_view(c->args[5]) : std::string_view());
    if (c->deadline != std::chrono::steady_clock::time_point{}) deadline = std::min(deadline, c->deadline);
  }
  if (deadline == std::chrono::steady_clock::time_point::max()) deadline = {};
  auto members = std::make_shared<std::vector<std::shared_ptr<OneKeyCall>>>(std::move(live));
  try {
    evalAsync(
        *client_, kBatch, keys, args,
        [weak, q, members](Reply reply, std::exception_ptr error) {  // NOLINT(performance-unnecessary-value-param)
          if (const auto self = weak.lock()) self->groupDone(*q);
          if (error) {
            for (const auto& c : *members) {
              if (ReplyCallback done = std::move(c->done)) done(Reply{}, cloneError(error));
            }
            return;
          }
          answer(*members, reply);
        },
        deadline);
  } catch (...) {
    fail(queue, *members, std::current_exception());
  }
}

void OneKeyBatcher::fail(Queue& queue, const std::vector<std::shared_ptr<OneKeyCall>>& group,
                         const std::exception_ptr& error) {
  // The request could not even be queued (thrown by the send itself): every take of the group
  // ends with that error, and the next group goes, as after a reply.
  groupDone(queue);
  for (const auto& c : group) {
    if (ReplyCallback done = std::move(c->done)) done(Reply{}, cloneError(error));
  }
}

void OneKeyBatcher::answer(const std::vector<std::shared_ptr<OneKeyCall>>& group, const Reply& reply) {
  const std::size_t n = group.size();
  if (reply.type != Reply::Type::Array || reply.elements.size() != n) {
    const auto bad = std::make_exception_ptr(ReplyError(
        ErrorKind::UnexpectedReply, "",
        fmt::format("redlimit: expected an array of {} from the batch script, got {}", n, reply.describe())));
    for (const auto& c : group) {
      if (ReplyCallback done = std::move(c->done)) done(Reply{}, cloneError(bad));
    }
    return;
  }
  // Each completion on its own: one that throws cannot stop the others (the callers' callbacks
  // are isolated by the limiters; this loop must not depend on it).
  for (std::size_t i = 0; i < n; ++i) {
    ReplyCallback done = std::move(group[i]->done);
    if (!done) continue;
    const Reply& element = reply.elements[i];
    if (element.type == Reply::Type::String && !isPackedDecision(element)) {
      // The take failed in the script ("CODE message", as its own script raises it): it wrote
      // nothing, and its batch-mates were decided. A decision is passed on as it came, for the
      // take's limiter to parse (parseDecisionReply).
      std::exception_ptr error;
      try {
        throwReplyError(element.str, true);
      } catch (...) {
        error = std::current_exception();
      }
      try {
        done(Reply{}, std::move(error));
      } catch (...) {
      }
      continue;
    }
    try {
      done(element, nullptr);
    } catch (...) {
    }
  }
}

}  // namespace redlimit::detail
