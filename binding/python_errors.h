// Errors the binding raises as Python exception types torch has no C++ error for.
#pragma once

#include <string>

namespace attn2d {
namespace binding {

// Throws an exception that torch's Python error handlers raise as MemoryError(message).
[[noreturn]] void throw_memory_error(const std::string& message);

}  // namespace binding
}  // namespace attn2d
