// The patterns' public calls build std::vectors whose sizes the caller's grids and heads decide;
// a failed allocation comes back as a Status instead of an exception leaving the core.
#pragma once

#include <new>
#include <stdexcept>
#include <string>

#include "attn2d/status.h"

namespace attn2d {
namespace patterns {

template <typename Build>
Status guard_allocation(const char* what, Build&& build) {
  try {
    return build();
  } catch (const std::bad_alloc&) {
    return Status::OutOfMemory(std::string(what) + ": out of memory");
  } catch (const std::length_error&) {
    return Status::OutOfMemory(std::string(what) + ": a buffer would exceed the largest size");
  }
}

}  // namespace patterns
}  // namespace attn2d
