// When a kernel writes its results with non-temporal stores.
//
// A cached store to a line not in the cache first reads the line (read for ownership), then
// writes it back when evicted. The backward writes dQ, dK and dV once each, rows of whole lines
// (E = 16 floats: one 64-byte line a row), so a result larger than the writing cores' L2 costs
// a read it never uses and, for a sparse layout's scattered query rows, stalls while the store
// buffer waits on those reads. Non-temporal stores write whole lines past the caches. Measured
// on the development VM (Intel AVX-512, 2 MiB L2 a core; 2 threads, builds alternated): YLG(8)
// 128x128 over 64x64, E = Ev = 16, backward 13.2-14.5 -> 11.0-12.0 ms (medians of 20, 5
// rounds; one thread 24.0-26.8 -> 20.4-23.0 ms); the 15 Manhattan window at 128x128, 4 heads,
// backward 185.6-193.0 -> 172.8-178.1 ns a query in one set of 5 rounds, ~1% in another of 6;
// YLG 256x256 within noise. A sum of the gradients right after cost the same either way
// (0.73-0.82 against 0.75-0.85 ms for YLG), so their reader does not pay it back. The forward's
// output measured no gain (the window forward's; YLG's, also with its write prefetches dropped:
// 5.58-6.16 against 5.70-5.79 ms, and the backward that reads O a little slower): on Intel a
// non-temporal store takes a fill buffer as a miss does, and the sparse forward's scattered rows
// keep those full. A result that fits the L2 would send its reader to memory, so only results
// past the L2 stream.
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
