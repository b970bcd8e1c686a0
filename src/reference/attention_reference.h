// Naive attention with double accumulation: the oracle every optimized backend is tested against.
// It stores one row of scores at a time (O(len_k)), never the full matrix.
#pragma once

#include "attn2d/attention_params.h"
#include "attn2d/status.h"

namespace attn2d {
namespace reference {

// kFloat64 accumulates in double: the oracle. kInput accumulates in the input dtype: "naive
// attention in the same dtype", whose error against the oracle sets the tolerance of the
// optimized kernels (they may be at most 2x as far off, plus a small floor).
enum class Precision { kFloat64, kInput };

Status attention_forward(const AttentionParams& params, Precision precision = Precision::kFloat64);

// Recomputes the probabilities from scratch (it does not read lse).
Status attention_backward(const AttentionBackwardParams& params,
                          Precision precision = Precision::kFloat64);

}  // namespace reference
}  // namespace attn2d
