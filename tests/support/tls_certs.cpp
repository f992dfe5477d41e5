#include "redlimit_test/tls_certs.hpp"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <utility>

#include <unistd.h>

namespace redlimit::test {
namespace {

// Our own openssl configuration, so that the system's openssl.cnf adds no extensions of its own.
constexpr const char* kConfig = R"([req]
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
[client]
basicConstraints = CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
authorityKeyIdentifier = keyid
)";

void run(const std::string& dir, const std::string& command) {
  const std::string log = dir + "/openssl.log";
  const std::string line = command + " >'" + log + "' 2>&1";
  if (std::system(line.c_str()) != 0) {
    std::ifstream in(log);
    const std::string output((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    throw std::runtime_error("makeTlsCerts: `" + command + "` failed: " + output);
  }
}

}  // namespace

TlsCerts::TlsCerts(TlsCerts&& other) noexcept
    : dir(std::exchange(other.dir, std::string())),
      caFile(std::move(other.caFile)),
      serverCert(std::move(other.serverCert)),
      serverKey(std::move(other.serverKey)),
      clientCert(std::move(other.clientCert)),
      clientKey(std::move(other.clientKey)),
      otherCaFile(std::move(other.otherCaFile)),
      expiredServerCert(std::move(other.expiredServerCert)) {}

TlsCerts::~TlsCerts() {
  if (dir.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

TlsCerts makeTlsCerts() {
  char tmpl[] = "/tmp/redlimit-tls-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("makeTlsCerts: mkdtemp failed");
  TlsCerts c;
  c.dir = tmpl;
  const std::string d = c.dir;
  const std::string config = d + "/openssl.cnf";
  std::ofstream(config) << kConfig;
  const std::string newKey = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  auto makeCa = [&](const std::string& name, const std::string& cn) {
    run(d, "openssl req -config '" + config + "' -x509 -extensions ca -days 2" + newKey + " -subj /CN=" + cn +
               " -keyout '" + d + "/" + name + ".key' -out '" + d + "/" + name + ".pem'");
    return d + "/" + name + ".pem";
  };
  // Signs <csr>.csr with the CA into <out>.pem, valid for `days` from now (-1: it expired a day ago).
  auto sign = [&](const std::string& csr, const std::string& out, const std::string& extensions, int serial, int days) {
    run(d, "openssl x509 -req -in '" + d + "/" + csr + ".csr' -CA '" + d + "/ca.pem' -CAkey '" + d +
               "/ca.key' -set_serial " + std::to_string(serial) + " -days " + std::to_string(days) + " -extfile '" +
               config + "' -extensions " + extensions + " -out '" + d + "/" + out + ".pem'");
  };
  auto makeLeaf = [&](const std::string& name, const std::string& cn, const std::string& extensions, int serial) {
    run(d, "openssl req -config '" + config + "' -new" + newKey + " -subj /CN=" + cn + " -keyout '" + d + "/" + name +
               ".key' -out '" + d + "/" + name + ".csr'");
    sign(name, name, extensions, serial, 2);
  };
  c.caFile = makeCa("ca", "redlimit-test-ca");
  makeLeaf("server", "localhost", "server", 2);
  c.serverCert = d + "/server.pem";
  c.serverKey = d + "/server.key";
  sign("server", "server-expired", "server", 4, -1);
  c.expiredServerCert = d + "/server-expired.pem";
  makeLeaf("client", "redlimit-test-client", "client", 3);
  c.clientCert = d + "/client.pem";
  c.clientKey = d + "/client.key";
  c.otherCaFile = makeCa("other-ca", "redlimit-unrelated-ca");
  return c;
}

}  // namespace redlimit::test
