// libFuzzer target: attn2d::validate of the dense forward and backward params. Sizes, strides,
// null pointers, masks, causality, scale and dtype come from the input; validate must answer
// with a Status, and where it accepts a problem small enough, the forward and the backward run
// on buffers allocated to cover exactly what the params address, on the backend the input
// picks, and must run or say why not. Any crash, abort or sanitizer report is a bug.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "fuzz_util.h"

namespace attn2d {
namespace fuzz {
namespace {

// The input's layout, in order (tests/fuzz/make_corpus.py writes the same):
//   dtype, mask_kind, flags (bit 0 causal, bit 1 backward, bit 2 wild values, bit 3 an
//   out_accum), scale, batch, heads, len_q, len_k, dim_qk, dim_v,
//   per tensor q, k, v, out, mask, lse [, dout, dq, dk, dv] [, out_accum]: a null byte (0 =
//   null; 8 in 1), its strides (3 for lse, else 4) and a seed byte for its values,
//   then the host, the backend and the bf16 products.
void run(Input& in) {
  AttentionParams p;
  p.dtype = static_cast<DType>(in.below(6));  // 4 and 5 are not dtypes
  p.mask_kind = static_cast<MaskKind>(in.below(4));  // 3 is not a mask kind
  const std::uint8_t flags = in.byte();
  p.is_causal = flags & 1;
  const bool backward = flags & 2;
  const bool wild = flags & 4;
  const bool with_out_accum = flags & 8;
  p.scale = in.scale();
  p.batch = in.size();
  p.heads = in.size();
  p.len_q = in.size();
  p.len_k = in.size();
  p.dim_qk = in.size();
  p.dim_v = in.size();

  const bool known_dtype = static_cast<int>(p.dtype) < 4;
  const Fill io = fill_of(known_dtype ? p.dtype : DType::kFloat32);
  const Fill acc = fill_of(accumulation_dtype(known_dtype ? p.dtype : DType::kFloat32));
  const Fill mask_fill = p.mask_kind == MaskKind::kBool ? Fill::kBool : acc;
  const std::int64_t q_size[4] = {p.batch, p.heads, p.len_q, p.dim_qk};
  const std::int64_t k_size[4] = {p.batch, p.heads, p.len_k, p.dim_qk};
  const std::int64_t v_size[4] = {p.batch, p.heads, p.len_k, p.dim_v};
  const std::int64_t o_size[4] = {p.batch, p.heads, p.len_q, p.dim_v};
  const std::int64_t m_size[4] = {p.batch, p.heads, p.len_q, p.len_k};
  const std::int64_t lse_size[3] = {p.batch, p.heads, p.len_q};

  struct View {
    const std::int64_t* size;
    std::int64_t* stride;
    int dims;
    Fill fill;
    Buffer buffer;
    bool null = false;
  };
  AttentionBackwardParams bp;
  View views[] = {{q_size, p.q_stride, 4, io, {}},
                  {k_size, p.k_stride, 4, io, {}},
                  {v_size, p.v_stride, 4, io, {}},
                  {o_size, p.out_stride, 4, io, {}},
                  {m_size, p.mask_stride, 4, mask_fill, {}},
                  {lse_size, p.lse_stride, 3, acc, {}},
                  {o_size, bp.dout_stride, 4, io, {}},
                  {q_size, bp.dq_stride, 4, io, {}},
                  {k_size, bp.dk_stride, 4, io, {}},
                  {v_size, bp.dv_stride, 4, io, {}},
                  {o_size, p.out_accum_stride, 4, acc, {}}};
  bool runnable = true;
  for (int t = 0; t < 11; ++t) {
    if ((t >= 6 && t < 10 && !backward) || (t == 10 && !with_out_accum)) continue;
    View& view = views[t];
    view.null = in.below(8) == 0;
    for (int d = 0; d < view.dims; ++d) view.stride[d] = in.stride();
    view.buffer.make(view.size, view.stride, view.dims, view.fill, in.byte(), wild, view.null);
    runnable = runnable && view.buffer.runnable;
  }
  // The pointers as the input chose them (null where asked); with `null_empty` false, an empty
  // view gets an address never read and zero strides. The CPU kernels offset each tensor's
  // pointer to its (batch, head) slice, and to its rows, whatever the sizes, and an offset from
  // null, or one that overflows, is undefined behaviour (UBSan's pointer-overflow) even where
  // no element is read: validate sees the input's nulls and strides, the runs these, so that
  // the fuzzer looks past those known reports.
  auto pointer = [&](int t, bool null_empty) {
    const View& view = views[t];
    const bool empty = numel(view.size, view.dims) == 0;
    return view.buffer.pointer(view.null && (null_empty || !empty));
  };
  auto assign = [&](bool null_empty) {
    for (View& view : views) {
      if (!null_empty && numel(view.size, view.dims) == 0) {
        std::fill(view.stride, view.stride + view.dims, 0);
      }
    }
    p.q = pointer(0, null_empty);
    p.k = pointer(1, null_empty);
    p.v = pointer(2, null_empty);
    p.out = pointer(3, null_empty);
    p.mask = pointer(4, null_empty);
    p.lse = pointer(5, null_empty);
    // A null out_accum means none, not an empty tensor.
    if (with_out_accum) p.out_accum = views[10].buffer.pointer(views[10].null);
    // Without a mask its strides mean nothing, but the reference computes each score's mask
    // index from them all the same (attention_reference.cc, row_scores), which overflows on
    // strides near 2^63: the runs get zeros, so that the fuzzer looks past that known report.
    if (!null_empty && p.mask_kind == MaskKind::kNone) {
      for (std::int64_t& s : p.mask_stride) s = 0;
    }
    bp.fwd = p;
    if (backward) {
      bp.dout = pointer(6, null_empty);
      bp.dq = pointer(7, null_empty);
      bp.dk = pointer(8, null_empty);
      bp.dv = pointer(9, null_empty);
    }
  };
  assign(true);

  FuzzHost fuzz_host;
  const Host host = fuzz_host.make(in);
  const Backend backend = pick_backend(in);
  pick_bf16_products(in);

  const Status forward_valid = validate(p);
  check_status(forward_valid, "validate(AttentionParams)");
  Status backward_valid;
  if (backward) {
    backward_valid = validate(bp);
    check_status(backward_valid, "validate(AttentionBackwardParams)");
    // The backward takes a null `out` beside an out_accum; nothing else the forward refuses.
    if (!forward_valid.ok() && backward_valid.ok() &&
        !(p.out == nullptr && p.out_accum != nullptr)) {
      fail("the backward accepted a bad forward", forward_valid.message());
    }
  }
  // The entry points validate first: a refused problem must never run.
  if (!forward_valid.ok() && attention_forward(p, host, backend).code() != forward_valid.code()) {
    fail("attention_forward ran a refused problem");
  }
  if (backward && !backward_valid.ok() &&
      attention_backward(bp, host, backend).code() != backward_valid.code()) {
    fail("attention_backward ran a refused problem");
  }
  if (!runnable || dense_work(p) > kMaxWork) return;
  assign(false);
  if (validate(p).code() != forward_valid.code() ||
      (backward && validate(bp).code() != backward_valid.code())) {
    fail("a pointer to an empty tensor changed validate's verdict");
  }
  if (forward_valid.ok()) {
    check_choice(p, host);
    check_run(attention_forward(p, host, backend), "attention_forward");
  }
  // After the forward (or with the lse and out_accum as filled): whatever they hold, the
  // backward must stay inside its tensors.
  if (backward && backward_valid.ok()) {
    check_run(attention_backward(bp, host, backend), "attention_backward");
  }
}

}  // namespace
}  // namespace fuzz
}  // namespace attn2d

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  attn2d::fuzz::Input in(data, size);
  attn2d::fuzz::run(in);
  return 0;
}
