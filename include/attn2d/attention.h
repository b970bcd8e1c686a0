// Dense attention entry points: validate the params, choose a backend, run it.
#pragma once

#include "attn2d/attention_params.h"
#include "attn2d/host.h"
#include "attn2d/status.h"

namespace attn2d {

enum class Backend : int {
  kAuto = 0,       // the fastest backend that accepts the params
  kReference = 1,  // naive, double accumulation, O(len_k) scratch per row: the oracle
  kCpu = 2,        // tiled online softmax, Highway SIMD with runtime dispatch
};

const char* backend_name(Backend backend);

// Checks sizes, pointers, options; returns kInvalidArgument naming the field otherwise.
Status validate(const AttentionParams& params);
Status validate(const AttentionBackwardParams& params);

// Writes out (and lse when non-null). Never allocates O(len_q * len_k).
Status attention_forward(const AttentionParams& params, const Host& host,
                         Backend backend = Backend::kAuto);

// Writes dq, dk, dv, recomputing the scores tile by tile from q, k and lse.
Status attention_backward(const AttentionBackwardParams& params, const Host& host,
                          Backend backend = Backend::kAuto);

// The SIMD target the CPU backend dispatches to on this machine (e.g. "AVX2").
const char* cpu_simd_target();

}  // namespace attn2d
