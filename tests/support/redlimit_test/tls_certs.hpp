// Test certificates, made at test time with the `openssl` command: a CA, a server certificate for
// localhost / 127.0.0.1 (and an expired copy) and a client certificate signed by it, and an
// unrelated second CA.
#pragma once

#include <string>

namespace redlimit::test {

/// PEM files in a fresh temporary directory (EC P-256 keys, unencrypted, valid for 2 days),
/// removed with the directory on destruction. Move-only.
struct TlsCerts {
  std::string dir;                // the temporary directory
  std::string caFile;             // CA certificate (CN=redlimit-test-ca)
  std::string serverCert;         // CN=localhost, SAN DNS:localhost, IP:127.0.0.1, serverAuth; signed by the CA
  std::string serverKey;          // its key
  std::string clientCert;         // CN=redlimit-test-client, clientAuth; signed by the CA
  std::string clientKey;          // its key
  std::string otherCaFile;        // a CA that signed nothing here (CN=redlimit-unrelated-ca)
  std::string expiredServerCert;  // serverCert's key and names, signed by the CA, expired a day ago

  TlsCerts() = default;
  TlsCerts(TlsCerts&& other) noexcept;
  TlsCerts& operator=(TlsCerts&&) = delete;
  TlsCerts(const TlsCerts&) = delete;
  TlsCerts& operator=(const TlsCerts&) = delete;
  ~TlsCerts();
};

/// Makes the certificates. Throws std::runtime_error (with openssl's output) if a command fails.
[[nodiscard]] TlsCerts makeTlsCerts();

}  // namespace redlimit::test
