#include "limiters/one_key_batcher.hpp"

#include <mutex>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "base/error_mapping.hpp"
#include "limiters/completion.hpp"
#include "limiters/decision_reply.hpp"
#include "redlimit/detail/client_access.hpp"
#include "redlimit/errors.hpp"
#include "redlimit_lua.hpp"
#include "topology/key_slot.hpp"

namespace redlimit::detail {

const Script kBatch{lua::batch.name, lua::batch.sha1, lua::batch.source};

std::shared_ptr<OneKeyBatcher> OneKeyBatcher::of(const std::shared_ptr<Client>& client) {
  if (!client || !client->options().coalesce) return nullptr;
  // Each Client's batcher, keyed by the Client's address: a batcher holds its Client, so while an
  // entry is alive its address cannot be reused; a dead entry is replaced.
  struct Registry {
    std::mutex mutex;
    std::unordered_map<const Client*, std::weak_ptr<OneKeyBatcher>> byClient;
  };
  static auto& r = *new Registry;  // never destroyed: limiters may outlive static destruction order
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
  const auto closed = std::make_exception_ptr(
      ClosedError("redlimit: the last limiter of this Client was dropped before this decision was sent"));
  std::vector<Queue*> queues{&single_};
  {
    const LockGuard lock(slotsMutex_);  // not held while the callbacks run
    for (auto& [slot, q] : slots_) queues.push_back(q.get());
  }
  for (Queue* q : queues) Sender::close(*this, *q, closed);
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
  Queue& queue = queueFor(call.key);
  Sender::submit(*this, queue, std::make_shared<OneKeyCall>(std::move(call)));
}

Reply OneKeyBatcher::take(OneKeyCall call) {
  Queue& queue = queueFor(call.key);
  return Sender::submitWaiting(
      *this, queue,
      [&] {
        // A place is free: its own script, sent and waited for from this thread, as eval.
        const std::vector<std::string_view> keys{call.key};
        const std::vector<std::string_view> args(call.args.begin(), call.args.end());
        return eval(*client_, *call.script, keys, args, call.deadline);
      },
      [&] {
        // awaitTry takes the deadline before `call` is moved
        return awaitTry<Reply>(client_->options(), call.deadline, [&](ReplyCallback done) {
          call.done = std::move(done);
          Sender::submit(*this, queue, std::make_shared<OneKeyCall>(std::move(call)));
        });
      });
}

void OneKeyBatcher::sendAlone(const std::shared_ptr<OneKeyCall>& c, ReplyCallback done) {
  // Its own script, which costs Redis less than a batch of one (and has a fast path).
  const std::vector<std::string_view> keys{c->key};
  const std::vector<std::string_view> args(c->args.begin(), c->args.end());
  evalAsync(*client_, *c->script, keys, args, std::move(done), c->deadline);
}

void OneKeyBatcher::sendTogether(const std::vector<std::shared_ptr<OneKeyCall>>& group,
                                 std::chrono::steady_clock::time_point deadline, ReplyCallback done) {
  const std::string count = fmt::to_string(group.size());
  std::vector<std::string_view> keys;
  std::vector<std::string_view> args{"take", "", count};
  keys.reserve(group.size());
  args.reserve(3 + 4 * group.size());
  for (const auto& c : group) {
    keys.emplace_back(c->key);
    // The take's own arguments: kind, permits, maxWaitUs, the configuration in the call or ''.
    args.emplace_back(c->args.at(2));
    args.emplace_back(c->args.at(3));
    args.emplace_back(c->args.size() > 4 ? std::string_view(c->args[4]) : std::string_view("0"));
    args.emplace_back(c->args.size() > 5 ? std::string_view(c->args[5]) : std::string_view());
  }
  evalAsync(*client_, kBatch, keys, args, std::move(done), deadline);
}

void OneKeyBatcher::answerAlone(OneKeyBatcher* /*self*/, OneKeyCall& call, const Reply& reply,
                                std::exception_ptr error) noexcept {
  // The callers' callbacks are isolated by the limiters (which report a throw); this must not
  // depend on it.
  callOnce(call.done, nullptr, {}, reply, std::move(error));
}

void OneKeyBatcher::answerTogether(OneKeyBatcher* self, const std::vector<std::shared_ptr<OneKeyCall>>& group,
                                   const Reply& reply) {
  const std::size_t n = group.size();
  if (reply.type != Reply::Type::Array || reply.elements.size() != n) {
    throw ReplyError(
        ErrorKind::UnexpectedReply, "",
        fmt::format("redlimit: expected an array of {} from the batch script, got {}", n, reply.describe()));
  }
  for (std::size_t i = 0; i < n; ++i) {
    const Reply& element = reply.elements[i];
    if (element.type == Reply::Type::String && !isPackedDecision(element)) {
      // The take failed in the script ("CODE message", as its own script raises it): it wrote
      // nothing, and its batch-mates were decided. A decision is passed on as it came, for the
      // take's limiter to parse (parseDecisionReply).
      answerAlone(self, *group[i], Reply{}, thrownBy([&] { throwReplyError(element.str, true); }));
    } else {
      answerAlone(self, *group[i], element, nullptr);
    }
  }
}

}  // namespace redlimit::detail
