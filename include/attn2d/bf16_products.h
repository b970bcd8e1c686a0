// Which products bfloat16 inputs run on. Where the CPU has AVX512-BF16, the tiled kernels can
// multiply bf16 pairs on VDPBF16PS (twice the multiply-adds of a float32 FMA an instruction) or
// widen the inputs to float32 and use FMAs. Which is faster depends on the core, not on the
// instruction set: a core may run VDPBF16PS at a fraction of its FMAs' rate (an Intel Xeon with
// AVX512-BF16: half), and then the pairs are slower than widened inputs. kAuto measures both
// instructions' throughput once per process and takes pairs only where they do at least 1.5x
// the FMAs' multiply-adds a second.
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
