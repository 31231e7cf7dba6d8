// Raw ZeroMQ multipart helpers for tests that speak to the node's sockets frame by frame (to send
// what no client library would: wrong frame counts, empty frames, bad payloads).
#pragma once

#include <chrono>
#include <cstdint>
#include <iterator>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

namespace eldr::testing {

// The next multipart message on `s`, or no parts when none arrives within `deadline`.
inline std::vector<zmq::message_t> receive(
    zmq::socket_t& s, std::chrono::milliseconds deadline = std::chrono::seconds(10)) {
  std::vector<zmq::message_t> parts;
  zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, deadline) != 1) return parts;
  (void)zmq::recv_multipart(s, std::back_inserter(parts));
  return parts;
}

// Sends `frames` as one multipart message.
inline void send_frames(zmq::socket_t& s, const std::vector<std::vector<uint8_t>>& frames) {
  for (size_t i = 0; i < frames.size(); ++i)
    s.send(zmq::buffer(frames[i]),
           i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
}

}  // namespace eldr::testing
