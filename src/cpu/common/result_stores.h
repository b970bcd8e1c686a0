// When a kernel writes its results with non-temporal stores.
//
// A cached store to a line not in the cache first reads the line (read for ownership), then
// writes it back when evicted. The backward writes dQ, dK and dV once each, rows of whole lines
// (E = 16 floats: one 64-byte line a row), so a result larger than the writing cores' L2 costs
// a read it never uses and, for a sparse layout's scattered query rows, stalls while the store
// buffer waits on those reads. Non-temporal stores write whole lines past the caches (on an
// Intel Xeon, YLG(8)'s backward at 128x128 over 64x64 ran 1.2x as fast), and the gradients'
// reader pays nothing back. The forward's output does not stream: on Intel a non-temporal store
// takes a fill buffer as a miss does, and the sparse forward's scattered rows keep those full.
// A result that fits the L2 would send its reader to memory, so only results past the L2
// stream.
#pragma once

#include <cstdint>

#include "attn2d/attention_params.h"
#include "attn2d/host.h"

namespace attn2d {
namespace cpu {

// The L2 of one core in bytes, as sysconf reports it (1 MiB where it reports none).
std::int64_t l2_cache_bytes();

// Whether `bytes` of results written by `host` should bypass the caches.
bool stream_results(const Host& host, std::int64_t bytes);

// Bytes of dQ, dK and dV together for the problem p, elements of elem_bytes.
std::int64_t gradient_bytes(const AttentionParams& p, std::int64_t elem_bytes);

}  // namespace cpu
}  // namespace attn2d
