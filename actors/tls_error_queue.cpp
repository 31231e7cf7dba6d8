// See tls_error_queue.hpp: OpenSSL's I/O calls, each preceded by ERR_clear_error().
#include "actors/tls_error_queue.hpp"

#include <dlfcn.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <cstdio>
#include <cstdlib>

namespace {

// OpenSSL's own definition of `name` (the next one after this program's in lookup order).
template <class F>
F next_definition(const char* name) {
  void* f = ::dlsym(RTLD_NEXT, name);
  if (f == nullptr) {
    // Without libssl behind us there is no call to forward; nothing sensible can continue.
    std::fprintf(stderr, "eldr: %s: no OpenSSL definition found (%s)\n", name, ::dlerror());
    std::abort();
  }
  return reinterpret_cast<F>(f);
}

}  // namespace

extern "C" {

int SSL_read(SSL* ssl, void* buf, int num) {
  static const auto real = next_definition<int (*)(SSL*, void*, int)>("SSL_read");
  ERR_clear_error();
  return real(ssl, buf, num);
}

int SSL_write(SSL* ssl, const void* buf, int num) {
  static const auto real = next_definition<int (*)(SSL*, const void*, int)>("SSL_write");
  ERR_clear_error();
  return real(ssl, buf, num);
}

int SSL_accept(SSL* ssl) {
  static const auto real = next_definition<int (*)(SSL*)>("SSL_accept");
  ERR_clear_error();
  return real(ssl);
}

int SSL_connect(SSL* ssl) {
  static const auto real = next_definition<int (*)(SSL*)>("SSL_connect");
  ERR_clear_error();
  return real(ssl);
}

}  // extern "C"

namespace eldr {

bool tls_error_queue_cleared(std::string* why) {
  struct wrapped {
    const char* name;
    void* ours;
  };
  const wrapped all[] = {{"SSL_read", reinterpret_cast<void*>(&SSL_read)},
                         {"SSL_write", reinterpret_cast<void*>(&SSL_write)},
                         {"SSL_accept", reinterpret_cast<void*>(&SSL_accept)},
                         {"SSL_connect", reinterpret_cast<void*>(&SSL_connect)}};
  for (const auto& w : all) {
    // What a shared library's call binds to: the first definition in the global lookup order.
    if (::dlsym(RTLD_DEFAULT, w.name) != w.ours) {
      if (why != nullptr)
        *why = std::string(w.name) +
               " resolves to another definition than eldr's (is the program linked with "
               "-rdynamic, or the symbol exported?)";
      return false;
    }
  }
  return true;
}

}  // namespace eldr
