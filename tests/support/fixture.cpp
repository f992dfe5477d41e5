#include "redlimit_test/fixture.hpp"

#include <algorithm>
#include <chrono>
#include <sstream>

namespace redlimit::test {

RedisServer& sharedServer() {
  static RedisServer server;
  return server;
}

std::string infoField(Client& client, const std::string& section, const std::string& field) {
  const Reply info = detail::command(client, {"INFO", section});
  std::istringstream in(info.str);
  std::string line;
  const std::string key = field + ":";
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.rfind(key, 0) == 0) return line.substr(key.size());
  }
  return "";
}

std::int64_t commandCalls(Client& client, const std::string& command) {
  const std::string stats = infoField(client, "commandstats", "cmdstat_" + command);
  if (stats.empty()) return 0;
  // calls=12,usec=...,usec_per_call=...
  auto pos = stats.find("calls=");
  return std::stoll(stats.substr(pos + 6));
}

std::shared_ptr<Client> shortTimeoutClient(const RedisServer& server, std::chrono::milliseconds timeout) {
  ClientOptions options;
  options.connection = parseUri(server.uri());
  options.connection.connectTimeout = timeout;
  options.connection.commandTimeout = timeout;
  return Client::create(options);
}

void RedisTest::SetUp() {
  ClientOptions options;
  options.connection = parseUri(sharedServer().uri());
  client_ = Client::create(options);
  // One connection: every new connection greets the server with a PING, which tests that count
  // the server's commands would see as noise.
  options.pool.size = 1;
  // Set-up and inspection are not what a test measures: on a machine loaded by a sanitizer build,
  // a connect or a reply can take longer than the library's 500 ms defaults.
  options.connection.connectTimeout = options.connection.commandTimeout = std::chrono::milliseconds(10000);
  admin_ = Client::create(options);
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  prefix_ = std::string("rltest:") + info->test_suite_name() + "." + info->name() + ":";
  dottedPrefix_ = prefix_;
  std::replace(dottedPrefix_.begin(), dottedPrefix_.end(), ':', '.');
}

void RedisTest::TearDown() {
  // Delete every key this test made (the server is throwaway, but keep tests independent).
  for (const std::string& prefix : {prefix_, dottedPrefix_}) {
    std::string cursor = "0";
    do {
      const Reply r = detail::command(*admin_, {"SCAN", cursor, "MATCH", "*" + prefix + "*", "COUNT", "1000"});
      cursor = r.elements[0].str;
      for (const Reply& key : r.elements[1].elements) (void)detail::command(*admin_, {"DEL", key.str});
    } while (cursor != "0");
  }
}

std::shared_ptr<Client> RedisTest::newClient(ClientOptions options) {
  options.connection = parseUri(sharedServer().uri(), options.connection);
  return Client::create(options);
}

std::shared_ptr<Client> RedisTest::patientClient() {
  ClientOptions options;
  options.connection.connectTimeout = options.connection.commandTimeout = std::chrono::milliseconds(10000);
  return newClient(options);
}

std::string RedisTest::name(const std::string& suffix) { return prefix_ + suffix; }

std::string RedisTest::limiterName(const std::string& suffix) { return dottedPrefix_ + suffix; }

}  // namespace redlimit::test
