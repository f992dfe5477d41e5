// TLS files for a benchmark's redis-server, made at run time with the `openssl` command: a CA and
// a server certificate it signed for 127.0.0.1 / localhost. The benchmarks must not depend on
// tests/, so this is the smallest part of tests/support/tls_certs.cpp that a TLS port needs (no
// client certificate: the server is started with `--tls-auth-clients no`). Header-only.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include <unistd.h>

namespace redlimit::bench {

/// PEM files in a fresh temporary directory (EC P-256 keys, unencrypted, valid for 1 day), removed
/// with it on destruction. Throws std::runtime_error, with openssl's output, if a command fails.
/// Not copyable, not movable.
class TlsFiles {
 public:
  TlsFiles() {
    char tmpl[] = "/tmp/redlimit-bench-tls-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("bench: mkdtemp failed for the TLS files");
    dir_ = tmpl;
    try {
      make();
    } catch (...) {
      remove();
      throw;
    }
  }
  ~TlsFiles() { remove(); }
  TlsFiles(const TlsFiles&) = delete;
  TlsFiles& operator=(const TlsFiles&) = delete;

  /// The CA certificate: what a client trusts (`rediss://...?cacert=`).
  [[nodiscard]] std::string caFile() const { return dir_ + "/ca.pem"; }
  [[nodiscard]] std::string serverCert() const { return dir_ + "/server.pem"; }
  [[nodiscard]] std::string serverKey() const { return dir_ + "/server.key"; }

  /// redis-server arguments for a TLS port beside the plain one: the harness picks the port,
  /// clients need no certificate of their own.
  [[nodiscard]] std::vector<std::string> serverArgs() const {
    return {"--tls-port",         "auto",   "--tls-cert-file",    serverCert(), "--tls-key-file", serverKey(),
            "--tls-ca-cert-file", caFile(), "--tls-auth-clients", "no"};
  }

 private:
  // Our own configuration, so that the system's openssl.cnf adds no extensions of its own.
  static constexpr const char* kConfig = R"([req]
distinguished_name = dn
[dn]
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost, IP:127.0.0.1
authorityKeyIdentifier = keyid
)";

  void make() {
    const std::string d = "'" + dir_ + "/";
    const std::string config = dir_ + "/openssl.cnf";
    std::ofstream(config) << kConfig;
    const std::string req = "openssl req -config '" + config + "'";
    const std::string newKey = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    run(req + " -x509 -extensions ca -days 1" + newKey + " -subj /CN=redlimit-bench-ca -keyout " + d + "ca.key' -out " +
        d + "ca.pem'");
    run(req + " -new" + newKey + " -subj /CN=localhost -keyout " + d + "server.key' -out " + d + "server.csr'");
    run("openssl x509 -req -in " + d + "server.csr' -CA " + d + "ca.pem' -CAkey " + d +
        "ca.key' -set_serial 2 -days 1 -extfile '" + config + "' -extensions server -out " + d + "server.pem'");
  }

  void run(const std::string& command) const {
    const std::string log = dir_ + "/openssl.log";
    const std::string line = command + " >'" + log + "' 2>&1";
    if (std::system(line.c_str()) != 0) {
      std::ifstream in(log);
      const std::string output((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      throw std::runtime_error("bench: `" + command + "` failed: " + output);
    }
  }

  void remove() noexcept {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::string dir_;
};

}  // namespace redlimit::bench
