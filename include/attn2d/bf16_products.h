// Which products bfloat16 inputs run on. Where the CPU has AVX512-BF16, the tiled kernels can
// multiply bf16 pairs on VDPBF16PS (twice the multiply-adds of a float32 FMA an instruction) or
// widen the inputs to float32 and use FMAs. Which is faster depends on the core, not on the
// instruction set: on an AMD Zen 5 the pair products ran attention 1.46-1.64x as fast as
// float32, on an Intel Xeon with the same extensions (session 20) at 0.59-0.74x, where widened
// inputs ran at 1.00x. kAuto measures both instructions' throughput once per process and takes
// pairs only where they do at least 1.5x the FMAs' multiply-adds a second (the Xeon: 0.5x; Zen
// 5's ratio was not probed, no such host being at hand since: its 1.5x end-to-end gain implies
// about 2x).
#pragma once

namespace attn2d {

enum class Bf16Products : int {
  kAuto = 0,   // pairs where the CPU has AVX512-BF16 and measured them faster
  kPairs = 1,  // pairs wherever the CPU has AVX512-BF16
  kFloat = 2,  // widened to float32 FMAs everywhere
};

// The process-wide choice (kAuto until set); read by each attention call as it starts.
void set_bf16_products(Bf16Products choice);
Bf16Products bf16_products();

// Whether bf16 inputs run on pair products now (the choice resolved on this CPU).
bool bf16_pairs_in_use();

}  // namespace attn2d
