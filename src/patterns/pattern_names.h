// Checks that an option enum holds one of its named values (a value cast from an int may not),
// with the message of the Python constructor's ValueError.
#pragma once

#include "attn2d/patterns.h"

namespace attn2d {
namespace patterns {

Status check_option(WindowMetric metric);
Status check_option(WindowBorder border);
Status check_option(YlgKind kind);
Status check_option(YlgMapping mapping);

}  // namespace patterns
}  // namespace attn2d
