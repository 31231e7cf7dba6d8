// A workaround for CAF 0.17.6's TLS transport: it never empties OpenSSL's per-thread error queue.
//
// OpenSSL requires the calling thread's error queue to be empty before SSL_read, SSL_write,
// SSL_accept or SSL_connect, or SSL_get_error cannot tell a real failure from "try again"
// (SSL_get_error(3)). caf::openssl::session calls SSL_get_error after every such call and never
// clears the queue, so one failed handshake -- a stranger dialling with a certificate of another
// CA -- leaves errors behind on the multiplexer thread, and the next SSL_read of a healthy member
// connection that merely has no data yet is taken for a fatal error: CAF closes the connection
// and the members see each other die. tls_error_queue.cpp defines those four functions in
// eldr's programs, each clearing the queue and then calling OpenSSL's own (found with
// dlsym(RTLD_NEXT)); the dynamic linker binds libcaf_openssl's calls to them.
#pragma once

#include <string>

namespace eldr {

// Whether the process's calls to SSL_read, SSL_write, SSL_accept and SSL_connect reach the
// clearing wrappers (the dynamic linker resolves them to this program's definitions); when not,
// `why` says which one does not. node::start calls it when TLS is configured, which also links
// the wrappers into every program that can start a TLS node.
bool tls_error_queue_cleared(std::string* why);

}  // namespace eldr
