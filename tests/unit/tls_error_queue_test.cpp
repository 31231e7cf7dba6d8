// actors/tls_error_queue: OpenSSL's I/O calls start from an empty error queue, so an error left
// behind by another connection's failed handshake (on the same thread) cannot turn an established
// connection's "no data yet" into a fatal SSL_ERROR_SSL -- the CAF 0.17.6 bug it works around.
// (A session still in its handshake would not show it: OpenSSL clears the queue there itself.)
#include "actors/tls_error_queue.hpp"

#include <gtest/gtest.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <array>
#include <memory>
#include <string>

namespace eldr {
namespace {

template <class T, void (*Free)(T*)>
struct openssl_deleter {
  void operator()(T* p) const { Free(p); }
};
template <class T, void (*Free)(T*)>
using owned = std::unique_ptr<T, openssl_deleter<T, Free>>;

// Moves whatever `from` wrote into the bytes `to` will read.
void pump(BIO* from, BIO* to) {
  std::array<char, 16384> buf;
  int n = 0;
  while ((n = BIO_read(from, buf.data(), static_cast<int>(buf.size()))) > 0)
    ASSERT_EQ(BIO_write(to, buf.data(), n), n);
}

// A server and a client session joined by memory BIOs, handshake done; an empty BIO reads as
// "try again", like a socket with no bytes yet.
struct tls_pair {
  owned<EVP_PKEY, EVP_PKEY_free> key{EVP_EC_gen("P-256")};
  owned<X509, X509_free> cert{X509_new()};
  owned<SSL_CTX, SSL_CTX_free> server_ctx{SSL_CTX_new(TLS_server_method())};
  owned<SSL_CTX, SSL_CTX_free> client_ctx{SSL_CTX_new(TLS_client_method())};
  owned<SSL, SSL_free> server, client;
  BIO *server_in = nullptr, *server_out = nullptr, *client_in = nullptr, *client_out = nullptr;

  bool open() {
    // A self-signed certificate: the client does not verify it (SSL_VERIFY_NONE by default).
    ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 1);
    X509_gmtime_adj(X509_getm_notBefore(cert.get()), 0);
    X509_gmtime_adj(X509_getm_notAfter(cert.get()), 3600);
    X509_set_pubkey(cert.get(), key.get());
    X509_NAME* name = X509_get_subject_name(cert.get());
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>("eldr-test"), -1, -1, 0);
    X509_set_issuer_name(cert.get(), name);
    if (X509_sign(cert.get(), key.get(), EVP_sha256()) <= 0) return false;
    if (SSL_CTX_use_certificate(server_ctx.get(), cert.get()) != 1 ||
        SSL_CTX_use_PrivateKey(server_ctx.get(), key.get()) != 1)
      return false;
    server.reset(SSL_new(server_ctx.get()));
    client.reset(SSL_new(client_ctx.get()));
    server_in = BIO_new(BIO_s_mem());
    server_out = BIO_new(BIO_s_mem());
    client_in = BIO_new(BIO_s_mem());
    client_out = BIO_new(BIO_s_mem());
    BIO_set_mem_eof_return(server_in, -1);
    BIO_set_mem_eof_return(client_in, -1);
    SSL_set_bio(server.get(), server_in, server_out);  // the sessions own the BIOs now
    SSL_set_bio(client.get(), client_in, client_out);
    SSL_set_accept_state(server.get());
    SSL_set_connect_state(client.get());
    for (int round = 0; round < 10; ++round) {
      SSL_do_handshake(client.get());
      pump(client_out, server_in);
      SSL_do_handshake(server.get());
      pump(server_out, client_in);
    }
    ERR_clear_error();
    return SSL_is_init_finished(server.get()) && SSL_is_init_finished(client.get());
  }
};

// Leaves an error on this thread's queue, as a failed certificate check on another connection.
void leave_a_stale_error() {
  ERR_raise(ERR_LIB_SSL, SSL_R_CERTIFICATE_VERIFY_FAILED);
}

TEST(TlsErrorQueue, TheProgramsCallsReachTheClearingWrappers) {
  std::string why;
  EXPECT_TRUE(tls_error_queue_cleared(&why)) << why;
}

TEST(TlsErrorQueue, AStaleErrorDoesNotMakeAnIdleReadFatal) {
  tls_pair p;
  ASSERT_TRUE(p.open());
  std::array<char, 16> buf;
  leave_a_stale_error();
  ASSERT_NE(ERR_peek_error(), 0u);
  const int n = SSL_read(p.server.get(), buf.data(), static_cast<int>(buf.size()));
  ASSERT_LE(n, 0);
  // Without the wrapper: SSL_ERROR_SSL, and CAF would close this healthy connection.
  EXPECT_EQ(SSL_get_error(p.server.get(), n), SSL_ERROR_WANT_READ);
  ERR_clear_error();
}

TEST(TlsErrorQueue, DataStillFlowsAfterAStaleError) {
  tls_pair p;
  ASSERT_TRUE(p.open());
  leave_a_stale_error();
  ASSERT_EQ(SSL_write(p.client.get(), "eldr", 4), 4);
  pump(p.client_out, p.server_in);
  leave_a_stale_error();
  std::array<char, 16> buf;
  const int n = SSL_read(p.server.get(), buf.data(), static_cast<int>(buf.size()));
  ASSERT_EQ(n, 4) << SSL_get_error(p.server.get(), n);
  EXPECT_EQ(std::string(buf.data(), 4), "eldr");
  ERR_clear_error();
}

}  // namespace
}  // namespace eldr
