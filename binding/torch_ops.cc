// PyTorch binding: the only code that includes torch. It checks tensors, fills the core's params
// structs, lends the core torch's intra-op thread pool and CPU allocator, and registers the
// attn2d::* operators. The forward operators' autograd is in torch_autograd.cc; fake (meta)
// kernels and the backward operators' autograd are registered from Python (attn2d/_ops.py).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/CPUAllocator.h>
#include <torch/library.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "attn2d/attention.h"
#include "attn2d/bf16_products.h"
#include "attn2d/fma_peak.h"
#include "attn2d/kernel_choice.h"
#include "errors.h"

namespace attn2d {
namespace binding {
namespace {

// The largest workspace one call may allocate, in bytes; negative: no limit but the host's.
std::atomic<std::int64_t> workspace_limit{-1};

Host torch_host() {
  Host host;
  host.num_threads = std::max(1, at::get_num_threads());
  host.parallel_for = [](void*, std::int64_t n_tasks, void* fn_ctx, TaskFn fn) {
    const int num_threads = std::max(1, at::get_num_threads());
    at::parallel_for(0, n_tasks, 1, [&](std::int64_t begin, std::int64_t end) {
      const int thread = at::get_thread_num();
      TORCH_INTERNAL_ASSERT(thread >= 0 && thread < num_threads, "attn2d: thread index ", thread,
                            " outside [0, ", num_threads, ")");
      for (std::int64_t t = begin; t < end; ++t) fn(fn_ctx, t, thread);
    });
  };
  // torch's CPU allocator aligns to 64 bytes; its out-of-memory error, or a request past
  // set_workspace_limit's, becomes the core's kOutOfMemory status rather than an exception
  // through the core.
  host.allocate = [](void*, std::size_t bytes) -> void* {
    const std::int64_t limit = workspace_limit.load(std::memory_order_relaxed);
    if (limit >= 0 && bytes > static_cast<std::size_t>(limit)) return nullptr;
    try {
      return c10::GetCPUAllocator()->raw_allocate(bytes);
    } catch (const c10::Error&) {
      return nullptr;
    }
  };
  host.deallocate = [](void*, void* ptr) { c10::GetCPUAllocator()->raw_deallocate(ptr); };
  return host;
}

DType core_dtype(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kDouble:
      return DType::kFloat64;
    case at::kBFloat16:
      return DType::kBFloat16;
    case at::kHalf:
      return DType::kFloat16;
    default:
      return DType::kFloat32;
  }
}

// lse and additive masks are in the accumulation type: float64 for float64, else float32.
at::ScalarType accumulation_type(const at::Tensor& q) {
  return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

void check_cpu_float(const at::Tensor& t, const char* name, const char* op) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), op, ": ", name, " must be on the CPU (the only backend "
                    "built so far); got a tensor on ", t.device());
  const auto st = t.scalar_type();
  TORCH_CHECK_TYPE(st == at::kFloat || st == at::kDouble || st == at::kBFloat16 || st == at::kHalf,
                   op, ": ", name, " must be float32, float64, bfloat16 or float16; got ", st);
}

void check_rank(const at::Tensor& t, const char* name, const char* layout, const char* op) {
  TORCH_CHECK_VALUE(t.dim() == 4, op, ": ", name, " must be 4-D ", layout, "; got shape ",
                    t.sizes());
}

void check_same_dtype(const at::Tensor& t, const at::Tensor& q, const char* name, const char* op) {
  TORCH_CHECK_TYPE(t.scalar_type() == q.scalar_type(), op, ": ", name, " has dtype ",
                   t.scalar_type(), " but q has ", q.scalar_type(), "; all must match");
}

void check_dim(const at::Tensor& t, int dim, std::int64_t want, const char* name,
               const char* what, const char* op) {
  TORCH_CHECK_VALUE(t.size(dim) == want, op, ": ", name, ".shape[", dim, "] (", what, ") is ",
                    t.size(dim), " but must be ", want, "; got ", name, " of shape ", t.sizes());
}

void copy_strides(const at::Tensor& t, std::int64_t* stride) {
  for (int d = 0; d < t.dim(); ++d) stride[d] = t.stride(d);
}

// Checks q, k, v, the mask and scale, and fills everything of AttentionParams but out and lse.
// An additive mask of a 16-bit q is widened to float32 into *mask_holder, which must outlive
// the params.
AttentionParams make_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const std::optional<at::Tensor>& attn_mask, bool is_causal,
                            double scale, const char* op, at::Tensor* mask_holder) {
  check_rank(q, "q", "(B, H, Lq, E)", op);
  check_rank(k, "k", "(B, H, Lk, E)", op);
  check_rank(v, "v", "(B, H, Lk, Ev)", op);
  check_cpu_float(q, "q", op);
  check_cpu_float(k, "k", op);
  check_cpu_float(v, "v", op);
  check_same_dtype(k, q, "k", op);
  check_same_dtype(v, q, "v", op);
  check_dim(k, 0, q.size(0), "k", "batch", op);
  check_dim(k, 1, q.size(1), "k", "heads", op);
  check_dim(k, 3, q.size(3), "k", "E, the query/key width", op);
  check_dim(v, 0, q.size(0), "v", "batch", op);
  check_dim(v, 1, q.size(1), "v", "heads", op);
  check_dim(v, 2, k.size(2), "v", "Lk, the number of keys", op);
  TORCH_CHECK_VALUE(std::isfinite(scale), op, ": scale must be finite; got ", scale);

  AttentionParams p;
  p.dtype = core_dtype(q);
  p.batch = q.size(0), p.heads = q.size(1), p.len_q = q.size(2), p.len_k = k.size(2);
  p.dim_qk = q.size(3), p.dim_v = v.size(3);
  p.q = q.data_ptr(), p.k = k.data_ptr(), p.v = v.data_ptr();
  copy_strides(q, p.q_stride);
  copy_strides(k, p.k_stride);
  copy_strides(v, p.v_stride);
  p.is_causal = is_causal;
  p.scale = scale;

  if (attn_mask.has_value() && attn_mask->defined()) {
    at::Tensor m = *attn_mask;
    TORCH_CHECK_VALUE(m.device().is_cpu(), op, ": attn_mask must be on the CPU; got ", m.device());
    TORCH_CHECK_TYPE(m.scalar_type() == at::kBool || m.scalar_type() == q.scalar_type() ||
                         m.scalar_type() == accumulation_type(q),
                     op, ": attn_mask must be bool or have q's dtype (", q.scalar_type(),
                     ") or ", accumulation_type(q), "; got ", m.scalar_type());
    const std::int64_t full[4] = {p.batch, p.heads, p.len_q, p.len_k};
    TORCH_CHECK_VALUE(m.dim() <= 4, op, ": attn_mask must have at most 4 dims, broadcastable to "
                      "(B, H, Lq, Lk) = ", at::IntArrayRef(full, 4), "; got shape ", m.sizes());
    const int lead = 4 - static_cast<int>(m.dim());
    for (int d = 0; d < 4; ++d) {
      const int md = d - lead;
      const std::int64_t size = md < 0 ? 1 : m.size(md);
      TORCH_CHECK_VALUE(size == 1 || size == full[d], op, ": attn_mask of shape ", m.sizes(),
                        " does not broadcast to (B, H, Lq, Lk) = ", at::IntArrayRef(full, 4));
      p.mask_stride[d] = (md < 0 || size == 1) ? 0 : m.stride(md);
    }
    p.mask_kind = m.scalar_type() == at::kBool ? MaskKind::kBool : MaskKind::kAdditive;
    if (p.mask_kind == MaskKind::kAdditive && m.scalar_type() != accumulation_type(q)) {
      // Widening keeps the mask's shape (a broadcast mask stays small) and sets its strides.
      m = m.to(accumulation_type(q));
      for (int d = 0; d < 4; ++d) {
        const int md = d - lead;
        if (md >= 0 && p.mask_stride[d] != 0) p.mask_stride[d] = m.stride(md);
      }
    }
    *mask_holder = m;
    p.mask = m.data_ptr();
  }
  return p;
}

bool is_16_bit(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
}

using ForwardResult = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

// The forward of every op: out, lse and out_accum, the float32 output before its rounding where
// keep_out_accum asks for it and q is 16-bit (for the backward's D; AttentionParams::out_accum),
// else an empty float32 tensor. Every row is written, with a layout too: validate_layout
// requires each layout's query tiles to hold every row (a zero fill of out was 4.5% of the YLG
// 128x128 forward's samples, one thread).
ForwardResult forward_with_layout(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const std::optional<at::Tensor>& attn_mask, bool is_causal,
                                  double scale, bool keep_out_accum, const SparseLayout* layout,
                                  const char* op, const WindowOffsets* window = nullptr) {
  at::Tensor mask_holder;
  AttentionParams p = make_params(q, k, v, attn_mask, is_causal, scale, op, &mask_holder);
  p.layout = layout;
  p.window = window;
  const auto lse_options = q.options().dtype(accumulation_type(q));
  at::Tensor out = at::empty({p.batch, p.heads, p.len_q, p.dim_v}, q.options());
  at::Tensor lse = at::empty({p.batch, p.heads, p.len_q}, lse_options);
  p.out = out.data_ptr();
  copy_strides(out, p.out_stride);
  p.lse = lse.data_ptr();
  copy_strides(lse, p.lse_stride);
  at::Tensor out_accum = keep_out_accum && is_16_bit(q)
                             ? at::empty({p.batch, p.heads, p.len_q, p.dim_v}, lse_options)
                             : at::empty({0}, lse_options);
  if (out_accum.numel() > 0) {
    p.out_accum = out_accum.data_ptr();
    copy_strides(out_accum, p.out_accum_stride);
  }
  raise_unless_ok(attn2d::attention_forward(p, torch_host()), op);
  return {out, lse, out_accum};
}

ForwardResult attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const std::optional<at::Tensor>& attn_mask, bool is_causal,
                                double scale, bool keep_out_accum) {
  return forward_with_layout(q, k, v, attn_mask, is_causal, scale, keep_out_accum, nullptr,
                             "attn2d.attention_forward");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward_with_layout(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const std::optional<at::Tensor>& attn_mask,
    bool is_causal, double scale, const SparseLayout* layout, const char* op,
    const WindowOffsets* window = nullptr) {
  AttentionBackwardParams bp;
  at::Tensor mask_holder;
  bp.fwd = make_params(q, k, v, attn_mask, is_causal, scale, op, &mask_holder);
  bp.fwd.layout = layout;
  bp.fwd.window = window;
  AttentionParams& p = bp.fwd;
  // out may be the forward's float32 out_accum for a 16-bit q: D is then computed from it.
  const bool out_is_accum = is_16_bit(q) && out.scalar_type() == at::kFloat;
  for (const auto& [t, name] : {std::pair<const at::Tensor&, const char*>{grad_out, "grad_out"},
                                {out, "out"}}) {
    check_rank(t, name, "(B, H, Lq, Ev)", op);
    check_cpu_float(t, name, op);
    if (&t != &out || !out_is_accum) check_same_dtype(t, q, name, op);
    const std::int64_t want[4] = {p.batch, p.heads, p.len_q, p.dim_v};
    TORCH_CHECK_VALUE(t.sizes() == at::IntArrayRef(want, 4), op, ": ", name, " must have shape ",
                      at::IntArrayRef(want, 4), "; got ", t.sizes());
  }
  check_cpu_float(lse, "lse", op);
  TORCH_CHECK_TYPE(lse.scalar_type() == accumulation_type(q), op, ": lse must be ",
                   accumulation_type(q), " for q of dtype ", q.scalar_type(), "; got ",
                   lse.scalar_type());
  const std::int64_t lse_shape[3] = {p.batch, p.heads, p.len_q};
  TORCH_CHECK_VALUE(lse.sizes() == at::IntArrayRef(lse_shape, 3), op,
                    ": lse must have shape (B, H, Lq) = ", at::IntArrayRef(lse_shape, 3),
                    "; got ", lse.sizes());
  if (out_is_accum) {
    p.out_accum = const_cast<void*>(out.data_ptr());
    copy_strides(out, p.out_accum_stride);
  } else {
    p.out = const_cast<void*>(out.data_ptr());
    copy_strides(out, p.out_stride);
  }
  p.lse = const_cast<void*>(lse.data_ptr());
  copy_strides(lse, p.lse_stride);
  bp.dout = grad_out.data_ptr();
  copy_strides(grad_out, bp.dout_stride);

  at::Tensor dq = at::empty(q.sizes(), q.options());
  at::Tensor dk = at::empty(k.sizes(), k.options());
  at::Tensor dv = at::empty(v.sizes(), v.options());
  bp.dq = dq.data_ptr(), bp.dk = dk.data_ptr(), bp.dv = dv.data_ptr();
  copy_strides(dq, bp.dq_stride);
  copy_strides(dk, bp.dk_stride);
  copy_strides(dv, bp.dv_stride);
  raise_unless_ok(attn2d::attention_backward(bp, torch_host()), op);
  return {dq, dk, dv};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const std::optional<at::Tensor>& attn_mask,
    bool is_causal, double scale) {
  return backward_with_layout(grad_out, q, k, v, out, lse, attn_mask, is_causal, scale, nullptr,
                              "attn2d.attention_backward");
}

// The layout tensors, in the order attn2d/_layout.py packs them.
constexpr int kLayoutTensors = 12;

void check_layout_heads(const at::TensorList& layout, const at::Tensor& q, const char* op) {
  const std::int64_t heads = layout.empty() ? 0 : layout[0].numel();
  TORCH_CHECK_VALUE(q.dim() == 4 && q.size(1) == heads, op, ": the layout has ", heads,
                    " heads; q must be 4-D (B, heads, Lq, E) with as many; got shape ",
                    q.sizes());
}

SparseLayout make_layout(const at::TensorList& t, std::int64_t block_q, const char* op) {
  TORCH_CHECK_VALUE(t.size() == kLayoutTensors, op, ": layout must hold ", kLayoutTensors,
                    " tensors (build it with attn2d.patterns); got ", t.size());
  const at::ScalarType want[kLayoutTensors] = {
      at::kInt, at::kLong, at::kLong, at::kInt, at::kInt, at::kLong,
      at::kInt, at::kLong, at::kLong, at::kInt, at::kLong, at::kLong};
  for (int i = 0; i < kLayoutTensors; ++i) {
    TORCH_CHECK_VALUE(t[i].device().is_cpu() && t[i].is_contiguous() &&
                          t[i].scalar_type() == want[i],
                      op, ": layout tensor ", i, " must be a contiguous CPU ", want[i],
                      " tensor; got ", t[i].scalar_type(), " on ", t[i].device());
  }
  SparseLayout lay;
  lay.block_q = block_q;
  lay.block_k = 64;
  lay.head_layout = t[0].data_ptr<std::int32_t>();
  lay.q_tile_begin = t[1].data_ptr<std::int64_t>();
  lay.k_tile_begin = t[2].data_ptr<std::int64_t>();
  lay.num_layouts = t[1].numel() - 1;
  lay.q_rows = t[3].data_ptr<std::int32_t>();
  lay.k_rows = t[4].data_ptr<std::int32_t>();
  lay.fwd_begin = t[5].data_ptr<std::int64_t>();
  lay.fwd_k_tile = t[6].data_ptr<std::int32_t>();
  lay.fwd_mask = t[7].data_ptr<std::int64_t>();
  lay.bwd_begin = t[8].data_ptr<std::int64_t>();
  lay.bwd_q_tile = t[9].data_ptr<std::int32_t>();
  lay.bwd_mask = t[10].data_ptr<std::int64_t>();
  lay.num_masks = t[11].size(0);
  lay.masks = reinterpret_cast<const std::uint64_t*>(t[11].data_ptr<std::int64_t>());
  // Sizes the kernels rely on, beyond what attn2d::validate checks through the pointers. The
  // last elements are read through the pointers too (each checked to exist first): t[i][-1]
  // .item() went through the dispatcher twice, 8 times a forward and backward; a YLG(8) step
  // over an 8x8 map through attention2d took 149.9-155.6 us with them, 146.2-146.5 without.
  const auto last = [](const at::Tensor& x) { return x.data_ptr<std::int64_t>()[x.numel() - 1]; };
  const std::int64_t q_tiles = t[3].numel() / std::max<std::int64_t>(block_q, 1);
  const std::int64_t k_tiles = t[4].numel() / 64;
  TORCH_CHECK_VALUE(t[3].numel() == q_tiles * block_q && t[4].numel() == k_tiles * 64 &&
                        t[11].dim() == 2 && t[11].size(1) == block_q &&
                        t[5].numel() == q_tiles + 1 && t[8].numel() == k_tiles + 1 &&
                        t[1].numel() >= 2 && t[2].numel() == t[1].numel() &&
                        last(t[1]) == q_tiles &&
                        last(t[2]) == k_tiles &&
                        t[6].numel() == last(t[5]) &&
                        t[7].numel() == t[6].numel() &&
                        t[9].numel() == last(t[8]) &&
                        t[10].numel() == t[9].numel(),
                    op, ": the layout's tensors have inconsistent sizes");
  return lay;
}

ForwardResult attention2d_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  at::TensorList layout, std::int64_t block_q, double scale,
                                  bool keep_out_accum) {
  const char* op = "attn2d.attention2d_forward";
  check_layout_heads(layout, q, op);
  const SparseLayout lay = make_layout(layout, block_q, op);
  return forward_with_layout(q, k, v, std::nullopt, false, scale, keep_out_accum, &lay, op);
}

// The offsets of a window op (a (2, count) int32 tensor: row offsets, then column offsets) as
// the core's view of them; the core validates their values.
WindowOffsets window_offsets(const at::Tensor& offsets, std::int64_t height, std::int64_t width,
                             const char* op) {
  TORCH_CHECK_VALUE(offsets.device().is_cpu() && offsets.scalar_type() == at::kInt &&
                        offsets.dim() == 2 && offsets.size(0) == 2 && offsets.is_contiguous(),
                    op, ": offsets must be a contiguous CPU int32 tensor of shape (2, count); got ",
                    offsets.scalar_type(), " of shape ", offsets.sizes());
  WindowOffsets w;
  w.height = height, w.width = width, w.count = offsets.size(1);
  w.dr = offsets.data_ptr<std::int32_t>();
  w.dc = w.dr + w.count;
  return w;
}

// A window pattern's forward and backward on the offsets kernels (cpu/window_*_cpu.cc).
ForwardResult attention2d_window_forward(const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, const at::Tensor& offsets,
                                         std::int64_t height, std::int64_t width, double scale,
                                         bool keep_out_accum) {
  const char* op = "attn2d.attention2d_window_forward";
  const WindowOffsets w = window_offsets(offsets, height, width, op);
  return forward_with_layout(q, k, v, std::nullopt, false, scale, keep_out_accum, nullptr, op,
                             &w);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention2d_window_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, const at::Tensor& offsets, std::int64_t height,
    std::int64_t width, double scale) {
  const char* op = "attn2d.attention2d_window_backward";
  const WindowOffsets w = window_offsets(offsets, height, width, op);
  return backward_with_layout(grad_out, q, k, v, out, lse, std::nullopt, false, scale, nullptr,
                              op, &w);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention2d_backward(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& out, const at::Tensor& lse, at::TensorList layout, std::int64_t block_q,
    double scale) {
  const char* op = "attn2d.attention2d_backward";
  check_layout_heads(layout, q, op);
  const SparseLayout lay = make_layout(layout, block_q, op);
  return backward_with_layout(grad_out, q, k, v, out, lse, std::nullopt, false, scale, &lay, op);
}

// The kernel chooser's answer for a call's arguments, as "direction\tfield\tvalue" lines
// (attn2d/explain.py reads them): kernel, products, schedule, reason, and a "refused" line
// "kernel\treason" for each kernel that refused. layout empty: none; offsets absent: none.
std::vector<std::string> explain(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const std::optional<at::Tensor>& attn_mask, bool is_causal,
                                 at::TensorList layout, std::int64_t block_q,
                                 const std::optional<at::Tensor>& offsets, std::int64_t height,
                                 std::int64_t width, double scale) {
  const char* op = "attn2d.explain";
  at::Tensor mask_holder;
  AttentionParams p = make_params(q, k, v, attn_mask, is_causal, scale, op, &mask_holder);
  SparseLayout lay;
  if (!layout.empty()) {
    check_layout_heads(layout, q, op);
    lay = make_layout(layout, block_q, op);
    p.layout = &lay;
  }
  WindowOffsets w;
  if (offsets.has_value() && offsets->defined()) {
    w = window_offsets(*offsets, height, width, op);
    p.window = &w;
  }
  const Host host = torch_host();
  std::vector<std::string> lines;
  for (const char* direction : {"forward", "backward"}) {
    const bool fwd = direction[0] == 'f';
    const KernelChoice c =
        fwd ? choose_forward(p, host, /*with_reasons=*/true) : choose_backward(p, host, true);
    const std::string d = std::string(direction) + "\t";
    lines.push_back(d + "kernel\t" + kernel_name(c.kernel));
    lines.push_back(d + "products\t" + products_name(c.products));
    lines.push_back(d + "schedule\t" + schedule_name(c.schedule));
    lines.push_back(d + "reason\t" + c.reason);
    for (const KernelRefusal& r : c.refused) {
      lines.push_back(d + "refused\t" + kernel_name(r.kernel) + "\t" + r.reason);
    }
  }
  return lines;
}

// Empty where the window kernels take these offsets on a height x width grid, else why not.
std::string window_kernel_refusal(const at::Tensor& offsets, std::int64_t height,
                                  std::int64_t width) {
  const char* op = "attn2d.window_kernel_refusal";
  TORCH_CHECK_VALUE(height > 0 && width > 0, op, ": height and width must be positive; got ",
                    height, "x", width);
  const WindowOffsets w = window_offsets(offsets, height, width, op);
  TORCH_CHECK_VALUE(w.count > 0, op, ": offsets must hold at least one offset");
  for (std::int64_t o = 0; o < w.count; ++o) {
    TORCH_CHECK_VALUE(std::abs(w.dr[o]) < height && std::abs(w.dc[o]) < width, op, ": offset (",
                      w.dr[o], ", ", w.dc[o], ") falls outside every query of the ", height, "x",
                      width, " grid");
  }
  return attn2d::window_kernel_refusal(w);
}

std::string cpu_simd_target() { return attn2d::cpu_simd_target(); }

void set_bf16_products(const std::string& choice) {
  if (choice == "auto") {
    attn2d::set_bf16_products(attn2d::Bf16Products::kAuto);
  } else if (choice == "pairs") {
    attn2d::set_bf16_products(attn2d::Bf16Products::kPairs);
  } else if (choice == "float") {
    attn2d::set_bf16_products(attn2d::Bf16Products::kFloat);
  } else {
    TORCH_CHECK_VALUE(false, "attn2d.set_bf16_products: choice must be 'auto', 'pairs' or "
                      "'float'; got '", choice, "'");
  }
}

void set_workspace_limit(std::int64_t bytes) { workspace_limit.store(bytes); }

std::int64_t get_workspace_limit() { return workspace_limit.load(); }

std::string bf16_products() { return attn2d::bf16_pairs_in_use() ? "pairs" : "float"; }

double fma_peak_gflops(double seconds) {
  TORCH_CHECK_VALUE(seconds > 0 && seconds <= 60, "attn2d.fma_peak_gflops: seconds must be in "
                    "(0, 60]; got ", seconds);
  return attn2d::measure_fma_peak_gflops(torch_host(), seconds);
}

// How many distinct threads of the host the kernels get run `tasks` tasks on: the check that
// the binding really lends torch's pool (it ran everything on one thread when built without
// OpenMP, silently).
std::int64_t host_threads_used(std::int64_t tasks) {
  TORCH_CHECK_VALUE(tasks >= 1 && tasks <= (1 << 20), "attn2d.host_threads_used: tasks must be "
                    "in [1, 2^20]; got ", tasks);
  const Host host = torch_host();
  std::vector<std::atomic<bool>> seen(static_cast<size_t>(host.num_threads));
  host.parallel_for(host.ctx, tasks, &seen, [](void* ctx, std::int64_t, int thread) {
    (*static_cast<std::vector<std::atomic<bool>>*>(ctx))[static_cast<size_t>(thread)] = true;
  });
  std::int64_t used = 0;
  for (const auto& s : seen) used += s ? 1 : 0;
  return used;
}

}  // namespace
}  // namespace binding
}  // namespace attn2d

TORCH_LIBRARY(attn2d, m) {
  m.def(
      "attention_forward(Tensor q, Tensor k, Tensor v, Tensor? attn_mask, bool is_causal, "
      "float scale, bool keep_out_accum=False) -> (Tensor out, Tensor lse, Tensor out_accum)");
  m.def(
      "attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
      "Tensor? attn_mask, bool is_causal, float scale) -> (Tensor grad_q, Tensor grad_k, "
      "Tensor grad_v)");
  m.def(
      "attention2d_forward(Tensor q, Tensor k, Tensor v, Tensor[] layout, int block_q, "
      "float scale, bool keep_out_accum=False) -> (Tensor out, Tensor lse, Tensor out_accum)");
  m.def(
      "attention2d_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, "
      "Tensor lse, Tensor[] layout, int block_q, float scale) -> (Tensor grad_q, Tensor grad_k, "
      "Tensor grad_v)");
  m.def(
      "attention2d_window_forward(Tensor q, Tensor k, Tensor v, Tensor offsets, int height, "
      "int width, float scale, bool keep_out_accum=False) -> (Tensor out, Tensor lse, "
      "Tensor out_accum)");
  m.def(
      "attention2d_window_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, "
      "Tensor lse, Tensor offsets, int height, int width, float scale) -> (Tensor grad_q, "
      "Tensor grad_k, Tensor grad_v)");
  m.def(
      "explain(Tensor q, Tensor k, Tensor v, Tensor? attn_mask, bool is_causal, Tensor[] layout, "
      "int block_q, Tensor? offsets, int height, int width, float scale) -> str[]",
      &attn2d::binding::explain);
  m.def("window_kernel_refusal(Tensor offsets, int height, int width) -> str",
        &attn2d::binding::window_kernel_refusal);
  m.def("cpu_simd_target() -> str", &attn2d::binding::cpu_simd_target);
  m.def("set_bf16_products(str choice) -> ()", &attn2d::binding::set_bf16_products);
  m.def("bf16_products() -> str", &attn2d::binding::bf16_products);
  m.def("set_workspace_limit(int bytes) -> ()", &attn2d::binding::set_workspace_limit);
  m.def("workspace_limit() -> int", &attn2d::binding::get_workspace_limit);
  m.def("fma_peak_gflops(float seconds=0.2) -> float", &attn2d::binding::fma_peak_gflops);
  m.def("host_threads_used(int tasks) -> int", &attn2d::binding::host_threads_used);
}

TORCH_LIBRARY_IMPL(attn2d, CPU, m) {
  m.impl("attention_forward", &attn2d::binding::attention_forward);
  m.impl("attention_backward", &attn2d::binding::attention_backward);
  m.impl("attention2d_forward", &attn2d::binding::attention2d_forward);
  m.impl("attention2d_backward", &attn2d::binding::attention2d_backward);
  m.impl("attention2d_window_forward", &attn2d::binding::attention2d_window_forward);
  m.impl("attention2d_window_backward", &attn2d::binding::attention2d_window_backward);
}
