// Result of every user-reachable core call: the core never aborts on user input.
#pragma once

#include <string>
#include <utility>

namespace attn2d {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,  // shapes, sizes, strides, options
  kUnsupported = 2,      // a valid request this backend cannot serve (dtype, option)
  kOutOfMemory = 3,      // the host allocator returned null
};

class Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string message) {
    return Status(StatusCode::kInvalidArgument, std::move(message));
  }
  static Status Unsupported(std::string message) {
    return Status(StatusCode::kUnsupported, std::move(message));
  }
  static Status OutOfMemory(std::string message) {
    return Status(StatusCode::kOutOfMemory, std::move(message));
  }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace attn2d
