// gateway: a small HTTP service (Boost.Beast) that rate-limits an API with two limits, each shared
// by every instance of the service that uses the same Redis:
//  * per API key (the X-Api-Key header, else the client's address): N requests per window;
//  * for the whole service: M requests per window.
// Both are decided together in ONE MultiLimit call, all or nothing, as docs/algorithms.md ("A
// per-key limit and a global limit") describes and examples/http_handler.cpp does synchronously:
//  * both allow: 200, with the per-key limit's RateLimit-Policy and RateLimit fields;
//  * the caller's own limit denies: 429 Too Many Requests, with its fields and Retry-After;
//  * the global limit denies: 503 Service Unavailable (the service is busy; this caller did nothing
//    wrong), with the global limit's fields and Retry-After.
// The fields come from redlimit::http (<redlimit/http.hpp>). Each limit is a GCRA of N per window
// with a burst of N: N requests at once, then one more every window / N.
//
// The decision is awaited (redlimit::asio::async_decide, a C++20 coroutine per connection), so the
// one thread that runs the io_context never blocks on Redis: it parses and answers other requests
// while decisions are in flight. Everything below runs on that thread, so nothing here is locked.
//
// Routes (GET only; another method gets 405):
//   /api/<anything>  the rate-limited endpoint (the API itself is a stand-in: "granted to <key>")
//   /stats           what this process answered, per key: granted, 429s, 503s (text, see statsText)
//   /metrics         redlimit's metrics, Prometheus text format (when built with redlimit::prometheus)
// A key outside the limiter's rules (more than 1024 bytes) gets 400 before anything is sent to
// Redis. Redis unreachable: 503 without rate-limit fields (the failure policy is Throw).
// SIGINT or SIGTERM: stops accepting, closes idle connections, answers the requests being decided
// (with "Connection: close"), and exits 0 once they are written.
//
//   gateway [--bind ADDR] [--port P] [--per-key N/WINDOW] [--global M/WINDOW] [--name NAME]
//           [--redis URI]
//     defaults: 127.0.0.1, 8080 (0: any free port), 50/1h, 200/1h, "gateway",
//     $REDLIMIT_URI else redis://127.0.0.1:6379. WINDOW: a whole number and s, m, h or d ("30s").
// It prints "gateway: listening on http://ADDR:PORT" once it accepts connections.
//
// tests/gateway/check.sh drives it with curl and wrk against a throwaway redis-server (ctest
// example.gateway).
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <list>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <fmt/format.h>

#include "redlimit/asio.hpp"
#include "redlimit/redlimit.hpp"
#if defined(REDLIMIT_GATEWAY_METRICS)
#include "redlimit/prometheus.hpp"
#endif

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;
using Request = bhttp::request<bhttp::string_body>;
using Response = bhttp::response<bhttp::string_body>;

constexpr std::chrono::seconds kIdleTimeout{30};   // a connection with no request for this long is closed
constexpr std::chrono::seconds kWriteTimeout{30};  // writing one response
constexpr std::size_t kMaxStatsKeys = 10000;       // /stats keeps this many keys; later ones count as "(other)"
constexpr std::string_view kGlobalKey = "all";     // the global limit's one key

// --- Configuration --------------------------------------------------------------------------------

struct Rate {
  std::int64_t count = 0;          // requests per window, >= 1
  std::chrono::seconds window{0};  // >= 1 s
};

struct Config {
  std::string address = "127.0.0.1";        // --bind: the address to listen on
  std::uint16_t port = 8080;                // --port: 0 = any free port (printed)
  Rate perKey{50, std::chrono::hours(1)};   // --per-key: each key's limit
  Rate global{200, std::chrono::hours(1)};  // --global: the whole service's limit
  std::string name = "gateway";             // --name: the limiters are <name>.per-key and <name>.global
  std::string redisUri;                     // --redis: default $REDLIMIT_URI, else redis://127.0.0.1:6379
};

struct UsageError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

constexpr const char* kUsage =
    "usage: gateway [--bind ADDR] [--port P] [--per-key N/WINDOW] [--global M/WINDOW] [--name NAME] [--redis URI]\n"
    "  WINDOW: a whole number followed by s, m, h or d, e.g. 50/1h\n";

// A whole number in 1..max, all of `text`.
std::optional<std::int64_t> parseCount(std::string_view text, std::int64_t max) {
  if (text.empty() || text.size() > 15) return std::nullopt;
  std::int64_t value = 0;
  for (const char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + (c - '0');
  }
  if (value < 1 || value > max) return std::nullopt;
  return value;
}

// "N/WINDOW", e.g. "50/1h". Throws UsageError naming `option`.
Rate parseRate(std::string_view option, std::string_view text) {
  const auto bad = [&] {
    return UsageError(fmt::format("{}: expected N/WINDOW such as 50/1h, got '{}'", option, text));
  };
  const std::size_t slash = text.find('/');
  if (slash == std::string_view::npos || slash + 2 > text.size()) throw bad();
  const std::string_view window = text.substr(slash + 1);
  std::int64_t unit = 0;
  switch (window.back()) {
    case 's':
      unit = 1;
      break;
    case 'm':
      unit = 60;
      break;
    case 'h':
      unit = 3600;
      break;
    case 'd':
      unit = 86400;
      break;
    default:
      throw bad();
  }
  const auto count = parseCount(text.substr(0, slash), 999'999'999'999'999);
  const auto units = parseCount(window.substr(0, window.size() - 1), 999'999'999'999'999 / unit);
  if (!count || !units) throw bad();
  return {*count, std::chrono::seconds(*units * unit)};
}

Config parseArgs(int argc, char** argv) {
  Config config;
  if (const char* env = std::getenv("REDLIMIT_URI")) config.redisUri = env;
  if (config.redisUri.empty()) config.redisUri = "redis://127.0.0.1:6379";
  for (int i = 1; i < argc; ++i) {
    const std::string_view option = argv[i];
    if (option == "--help" || option == "-h") throw UsageError("");
    if (i + 1 >= argc) throw UsageError(fmt::format("{}: needs a value (or unknown option)", option));
    const std::string_view value = argv[++i];
    if (option == "--bind") {
      config.address = std::string(value);
    } else if (option == "--port") {
      const auto port = value == "0" ? std::optional<std::int64_t>(0) : parseCount(value, 65535);
      if (!port) throw UsageError(fmt::format("--port: expected 0..65535, got '{}'", value));
      config.port = static_cast<std::uint16_t>(*port);
    } else if (option == "--per-key") {
      config.perKey = parseRate(option, value);
    } else if (option == "--global") {
      config.global = parseRate(option, value);
    } else if (option == "--name") {
      config.name = std::string(value);
    } else if (option == "--redis") {
      config.redisUri = std::string(value);
    } else {
      throw UsageError(fmt::format("unknown option {}", option));
    }
  }
  return config;
}

// --- The rate-limited service ----------------------------------------------------------------------

std::string_view view(beast::string_view s) { return {s.data(), s.size()}; }

Response reply(const Request& request, bhttp::status status, std::string body,
               const redlimit::http::Headers& fields = {}) {
  Response response{status, request.version()};
  response.set(bhttp::field::server, "redlimit-gateway");
  response.set(bhttp::field::content_type, "text/plain; charset=utf-8");
  for (const auto& [name, value] : fields) response.set(name, value);
  response.keep_alive(request.keep_alive());
  response.body() = std::move(body);
  response.prepare_payload();
  return response;
}

// One per process. Not thread-safe: used on the io_context's one thread only.
class Gateway {
 public:
  Gateway(const std::shared_ptr<redlimit::Client>& client, const Config& config)
      : perKey_(client, config.name + ".per-key", policy(config.perKey)),
        global_(client, config.name + ".global", policy(config.global)),
        both_({perKey_, global_}, multiOptions(config.name)),
        perKeyPolicy_(redlimit::http::policyOf(perKey_.policy(), "per-key")),
        globalPolicy_(redlimit::http::policyOf(global_.policy(), "global")) {}

  net::awaitable<Response> handle(const Request& request, const std::string& peer) {
    std::string_view path = view(request.target());
    path = path.substr(0, path.find('?'));
    if (request.method() != bhttp::verb::get) {
      Response response = reply(request, bhttp::status::method_not_allowed, "only GET\n");
      response.set(bhttp::field::allow, "GET");
      co_return response;
    }
    if (path.rfind("/api/", 0) == 0) co_return co_await limit(request, peer);
    if (path == "/stats") co_return reply(request, bhttp::status::ok, statsText());
#if defined(REDLIMIT_GATEWAY_METRICS)
    if (path == "/metrics") {
      Response response = reply(request, bhttp::status::ok, redlimit::prometheus::exposition());
      response.set(bhttp::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      co_return response;
    }
#endif
    co_return reply(request, bhttp::status::not_found, "not found\n");
  }

 private:
  struct Counts {
    std::int64_t granted = 0;  // 200
    std::int64_t limited = 0;  // 429: the key's own limit denied
    std::int64_t busy = 0;     // 503: the global limit denied
  };

  static redlimit::Policy policy(const Rate& rate) {
    return redlimit::Policy::gcra(rate.count, rate.window, rate.count);
  }
  static redlimit::MultiLimit::Options multiOptions(const std::string& name) {
    redlimit::MultiLimit::Options options;
    options.name = name;  // the metrics' limiter label
    return options;
  }

  net::awaitable<Response> limit(const Request& request, const std::string& peer) {
    const auto header = request.find("X-Api-Key");
    const std::string key =
        header != request.end() && !header->value().empty() ? std::string(view(header->value())) : peer;
    std::optional<redlimit::MultiLimit> call;
    try {
      call.emplace(both_.on({key, kGlobalKey}));  // checks the keys: nothing is sent yet
    } catch (const redlimit::InvalidArgument&) {
      // Not the error's text: it may quote the key, which is a secret.
    }
    if (!call) co_return reply(request, bhttp::status::bad_request, "X-Api-Key: 1 to 1024 bytes\n");

    redlimit::MultiDecision d;
    bool decided = false;
    try {
      d = co_await redlimit::asio::async_decide(*call, 1, net::use_awaitable);
      decided = true;
    } catch (const redlimit::Error& e) {
      ++failed_;
      std::fprintf(stderr, "gateway: no decision: %s\n", e.what());
    }
    if (!decided) co_return reply(request, bhttp::status::service_unavailable, "rate limiter unavailable\n");

    Counts& counts = countsOf(key);
    if (d.allowed) {
      ++counts.granted;
      co_return reply(request, bhttp::status::ok, fmt::format("granted to {}\n", key),
                      redlimit::http::rateLimitHeaders(d.limits[0], perKeyPolicy_));
    }
    if (d.deniedBy == 0) {
      ++counts.limited;
      co_return reply(request, bhttp::status::too_many_requests, "Too Many Requests\n",
                      redlimit::http::rateLimitHeaders(d.limits[0], perKeyPolicy_));
    }
    ++counts.busy;
    co_return reply(request, bhttp::status::service_unavailable, "Service Unavailable\n",
                    redlimit::http::rateLimitHeaders(d.limits[1], globalPolicy_));
  }

  Counts& countsOf(const std::string& key) {
    const auto it = counts_.find(key);
    if (it != counts_.end()) return it->second;
    return counts_[counts_.size() < kMaxStatsKeys ? key : "(other)"];
  }

  // "total <granted> <429s> <503s> <no decision>", then "key <granted> <429s> <503s> <key>" per
  // key (the key last: it may hold spaces).
  std::string statsText() const {
    Counts total;
    std::string keys;
    for (const auto& [key, c] : counts_) {
      total.granted += c.granted;
      total.limited += c.limited;
      total.busy += c.busy;
      keys += fmt::format("key {} {} {} {}\n", c.granted, c.limited, c.busy, key);
    }
    return fmt::format("total {} {} {} {}\n", total.granted, total.limited, total.busy, failed_) + keys;
  }

  redlimit::Limiter perKey_;
  redlimit::Limiter global_;
  const redlimit::MultiLimit both_;  // per key first: limits[0] is the caller's, limits[1] the global
  const redlimit::http::RateLimitPolicy perKeyPolicy_;
  const redlimit::http::RateLimitPolicy globalPolicy_;
  std::map<std::string, Counts> counts_;
  std::int64_t failed_ = 0;  // requests answered 503 because Redis could not be asked
};

// --- The HTTP server -------------------------------------------------------------------------------

struct Connection {
  beast::tcp_stream stream;
  bool busy = false;  // a request is being answered and its response written (else waiting for one)
};

class Server {
 public:
  Server(net::io_context& ioc, Gateway& gateway, const tcp::endpoint& endpoint)
      : ioc_(ioc), gateway_(gateway), acceptor_(ioc, endpoint) {}

  tcp::endpoint endpoint() const { return acceptor_.local_endpoint(); }

  void start() {
    net::co_spawn(ioc_, accept(), [](const std::exception_ptr& e) { report(e, "accepting"); });
  }

  // Stops accepting and closes idle connections; a connection answering a request writes its
  // response (Connection: close) and ends.
  void stop() {
    stopping_ = true;
    beast::error_code ignored;
    acceptor_.close(ignored);
    for (Connection* connection : connections_) {
      if (!connection->busy) connection->stream.cancel();
    }
  }

 private:
  static void report(const std::exception_ptr& e, const char* what) {
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& error) {
      std::fprintf(stderr, "gateway: %s: %s\n", what, error.what());
    }
  }

  net::awaitable<void> accept() {
    net::steady_timer pause(ioc_);
    while (!stopping_) {
      beast::error_code ec;
      tcp::socket socket = co_await acceptor_.async_accept(net::redirect_error(net::use_awaitable, ec));
      if (stopping_) break;
      if (ec) {  // e.g. out of file descriptors: try again a little later rather than spin
        std::fprintf(stderr, "gateway: accept: %s\n", ec.message().c_str());
        pause.expires_after(std::chrono::milliseconds(100));
        co_await pause.async_wait(net::redirect_error(net::use_awaitable, ec));
        continue;
      }
      net::co_spawn(ioc_, serve(std::move(socket)), [](const std::exception_ptr& e) { report(e, "connection"); });
    }
  }

  net::awaitable<void> serve(tcp::socket socket) {
    beast::error_code ec;
    const tcp::endpoint remote = socket.remote_endpoint(ec);
    const std::string peer = ec ? std::string("unknown") : remote.address().to_string();
    Connection connection{beast::tcp_stream(std::move(socket))};
    const auto registered = connections_.insert(connections_.end(), &connection);
    beast::flat_buffer buffer;
    while (!stopping_) {
      Request request;
      connection.stream.expires_after(kIdleTimeout);
      co_await bhttp::async_read(connection.stream, buffer, request, net::redirect_error(net::use_awaitable, ec));
      if (ec) break;  // closed by the peer, timed out, not HTTP, or cancelled by stop()
      connection.busy = true;
      Response response = co_await gateway_.handle(request, peer);
      if (stopping_) response.keep_alive(false);
      connection.stream.expires_after(kWriteTimeout);
      co_await bhttp::async_write(connection.stream, response, net::redirect_error(net::use_awaitable, ec));
      connection.busy = false;  // stop() cancels reads only: a response being written is finished
      if (ec || !response.keep_alive()) break;
    }
    connections_.erase(registered);
    connection.stream.socket().shutdown(tcp::socket::shutdown_send, ec);
  }

  net::io_context& ioc_;
  Gateway& gateway_;
  tcp::acceptor acceptor_;
  std::list<Connection*> connections_;  // open connections, each owned by its serve() coroutine
  bool stopping_ = false;
};

}  // namespace

int main(int argc, char** argv) try {
  Config config;
  try {
    config = parseArgs(argc, argv);
  } catch (const UsageError& e) {
    const bool help = *e.what() == '\0';
    std::fprintf(help ? stdout : stderr, "%s%s%s", e.what(), help ? "" : "\n", kUsage);
    return help ? 0 : 2;
  }
  beast::error_code ec;
  const auto address = net::ip::make_address(config.address, ec);
  if (ec) {
    std::fprintf(stderr, "gateway: --bind: not an IP address: '%s'\n%s", config.address.c_str(), kUsage);
    return 2;
  }

  // Bad input the library finds (the URI, a name, a rate out of Policy's range) before anything is
  // sent: said as a bad option.
  std::optional<Gateway> gateway;
  try {
    gateway.emplace(redlimit::Client::fromUri(config.redisUri), config);
  } catch (const redlimit::InvalidArgument& e) {
    std::fprintf(stderr, "gateway: %s\n%s", e.what(), kUsage);
    return 2;
  }

  net::io_context ioc(1);
  Server server(ioc, *gateway, tcp::endpoint(address, config.port));
  net::signal_set signals(ioc, SIGINT, SIGTERM);
  signals.async_wait([&](const beast::error_code& error, int number) {
    if (error) return;
    std::fprintf(stderr, "gateway: signal %d, stopping\n", number);
    server.stop();
  });
  server.start();
  const tcp::endpoint bound = server.endpoint();
  std::printf("gateway: listening on http://%s:%u\n", bound.address().to_string().c_str(),
              static_cast<unsigned>(bound.port()));
  std::fflush(stdout);
  ioc.run();  // returns once stopped and every connection has ended
  std::fprintf(stderr, "gateway: stopped\n");
  return 0;
} catch (const std::exception& e) {  // a port in use, an address not ours: said, not an abort
  std::fprintf(stderr, "gateway: %s\n", e.what());
  return 1;
}
