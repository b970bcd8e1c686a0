// How the binding raises the core's Status: a bad value as c10::ValueError, an unsupported one
// as c10::TypeError, and a workspace the host could not allocate as each library built on the
// binding raises it: the Python module (python_memory_error.cc) as Python's MemoryError, the
// LibTorch library (libtorch_only.cc) as c10::OutOfMemoryError. Each links exactly one
// definition of throw_memory_error.
#pragma once

#include <c10/util/Exception.h>

#include <string>

#include "attn2d/status.h"

namespace attn2d {
namespace binding {

[[noreturn]] void throw_memory_error(const std::string& message);

// op prefixes the message ("op: message"); null leaves messages that name their caller as
// they are.
inline void raise_unless_ok(const Status& s, const char* op = nullptr) {
  if (s.ok()) return;
  const std::string message = op != nullptr ? std::string(op) + ": " + s.message() : s.message();
  if (s.code() == StatusCode::kOutOfMemory) throw_memory_error(message);
  TORCH_CHECK_TYPE(s.code() != StatusCode::kUnsupported, message);
  TORCH_CHECK_VALUE(false, message);
}

}  // namespace binding
}  // namespace attn2d
