#include "redlimit/client.hpp"

#include <fmt/format.h>

#include "random.hpp"
#include "redlimit/errors.hpp"

namespace redlimit {
namespace {

FailureOptions reachabilityOptions(std::chrono::milliseconds bestEffortRetry) {
  if (bestEffortRetry.count() <= 0) {
    throw InvalidArgument(
        fmt::format("redlimit: ClientOptions::bestEffortRetry must be > 0 ms, got {} ms", bestEffortRetry.count()));
  }
  FailureOptions o;
  o.probeInterval = bestEffortRetry;
  return o;
}

}  // namespace

Client::Client(ClientOptions options)
    : options_(std::move(options)),
      clientId_(options_.clientId.empty() ? detail::randomUuidV4() : options_.clientId),
      pool_(options_.connection, options_.pool),
      reachability_("client", reachabilityOptions(options_.bestEffortRetry)) {}

Client::~Client() = default;

std::shared_ptr<Client> Client::create(ClientOptions options) {
  return std::make_shared<Client>(std::move(options));
}

std::shared_ptr<Client> Client::fromUri(const std::string& uri, ClientOptions base) {
  base.connection = parseUri(uri, std::move(base.connection));
  return create(std::move(base));
}

template <class Call>
Reply Client::tracked(Call&& call) {
  const std::int64_t started = reachability_.callStart();
  try {
    Reply r = call();
    reachability_.succeeded();
    return r;
  } catch (const Error&) {
    reachability_.noteError(started);  // only an outage (an IoError but pool exhaustion) gates best-effort calls
    throw;
  }
}

bool Client::admitBestEffort() noexcept {
  const bool go = reachability_.shouldTry();
  (go ? bestEffortSent_ : bestEffortSkipped_).fetch_add(1, std::memory_order_relaxed);
  return go;
}

BestEffortStats Client::bestEffortStats() const noexcept {
  return BestEffortStats{bestEffortSent_.load(std::memory_order_relaxed),
                         bestEffortSkipped_.load(std::memory_order_relaxed), reachability_.stats().degraded};
}

Reply Client::command(std::initializer_list<std::string_view> argv) {
  return tracked([&] {
    auto lease = pool_.acquire();
    return lease->command(argv);
  });
}

Reply Client::command(const std::vector<std::string_view>& argv) {
  return tracked([&] {
    auto lease = pool_.acquire();
    return lease->command(argv);
  });
}

Reply Client::eval(const Script& script, const std::vector<std::string_view>& keys,
                   const std::vector<std::string_view>& args) {
  return tracked([&] { return evalUntracked(script, keys, args); });
}

Reply Client::evalUntracked(const Script& script, const std::vector<std::string_view>& keys,
                            const std::vector<std::string_view>& args) {
  const std::string numKeys = fmt::to_string(keys.size());
  std::vector<std::string_view> argv;
  argv.reserve(3 + keys.size() + args.size());
  argv.push_back("EVALSHA");
  argv.push_back(script.sha1);
  argv.push_back(numKeys);
  argv.insert(argv.end(), keys.begin(), keys.end());
  argv.insert(argv.end(), args.begin(), args.end());

  auto lease = pool_.acquire();
  try {
    return lease->command(argv);
  } catch (const ReplyError& e) {
    if (e.code() != "NOSCRIPT") throw;
  }
  // The server lost the script (restart, SCRIPT FLUSH, failover): load it on this connection,
  // where the retry runs, and try once more.
  Reply loaded = lease->command({"SCRIPT", "LOAD", script.source});
  if (loaded.str != script.sha1) {
    throw ScriptError("ERR", fmt::format("redlimit: SCRIPT LOAD of {} returned SHA1 {}, expected {}", script.name,
                                         loaded.str, script.sha1));
  }
  try {
    return lease->command(argv);
  } catch (const ReplyError& e) {
    if (e.code() != "NOSCRIPT") throw;
  }
  // Flushed again between the load and the retry: send the source itself, which cannot miss.
  argv[0] = "EVAL";
  argv[1] = script.source;
  return lease->command(argv);
}

}  // namespace redlimit
