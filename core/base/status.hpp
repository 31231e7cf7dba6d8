// status and result<T>: how every fallible function in eldr reports failure.
//
// core/ and storage/ never throw across a module boundary and never abort on external data: a
// function that can fail returns a status (or a result<T> holding either a value or a status)
// whose message names the problem precisely enough for an operator to act on it.
//
// Both are [[nodiscard]]: a failure dropped on the floor is how a node silently stops doing its
// job. Where ignoring one is right, the call site says `(void)` and why.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>

namespace eldr {

// Why an operation failed. Coarse on purpose: callers branch on the code, humans read the message.
enum class status_code {
  ok = 0,
  invalid_argument,  // caller-supplied data is malformed or inconsistent (dimensions, NaN, K > N)
  not_found,         // a file, key or entity does not exist
  io_error,          // the OS refused a read or write
  corrupt,           // persisted or received bytes do not decode
  out_of_range,      // a size or count exceeds a configured or absolute bound
  failed_precondition,  // the call is valid but the object is not in a state to serve it
};

const char* to_string(status_code code);

class [[nodiscard]] status {
 public:
  status() = default;  // ok
  status(status_code code, std::string message) : code_(code), message_(std::move(message)) {}

  static status invalid_argument(std::string m) {
    return {status_code::invalid_argument, std::move(m)};
  }
  static status not_found(std::string m) { return {status_code::not_found, std::move(m)}; }
  static status io_error(std::string m) { return {status_code::io_error, std::move(m)}; }
  static status corrupt(std::string m) { return {status_code::corrupt, std::move(m)}; }
  static status out_of_range(std::string m) { return {status_code::out_of_range, std::move(m)}; }
  static status failed_precondition(std::string m) {
    return {status_code::failed_precondition, std::move(m)};
  }

  bool ok() const { return code_ == status_code::ok; }
  status_code code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid_argument: K (12) exceeds the number of points (5)"
  std::string to_string() const;

 private:
  status_code code_ = status_code::ok;
  std::string message_;
};

// Either a T or a non-ok status. Accessing the value of an error is a programming bug (asserted).
template <class T>
class [[nodiscard]] result {
 public:
  result(T value) : value_(std::move(value)) {}  // NOLINT: implicit on purpose, like expected<T>
  result(status error) : error_(std::move(error)) { assert(!error_.ok()); }  // NOLINT

  bool ok() const { return value_.has_value(); }
  explicit operator bool() const { return ok(); }
  const status& error() const { return error_; }

  T& value() & {
    assert(ok());
    return *value_;
  }
  const T& value() const& {
    assert(ok());
    return *value_;
  }
  T&& value() && {
    assert(ok());
    return std::move(*value_);
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::optional<T> value_;
  status error_;
};

}  // namespace eldr
