#include <cmath>
#include <string>

#include "attn2d/attention.h"

namespace attn2d {
namespace {

std::string str(std::int64_t v) { return std::to_string(v); }

Status check_pointer(const void* ptr, bool needed, const char* name) {
  if (needed && ptr == nullptr) {
    return Status::InvalidArgument(std::string(name) + " is null but the tensor is not empty");
  }
  return Status::Ok();
}

}  // namespace

Status validate(const AttentionParams& p) {
  if (p.dtype != DType::kFloat32 && p.dtype != DType::kFloat64) {
    return Status::Unsupported("dtype must be float32 or float64");
  }
  const struct {
    std::int64_t value;
    const char* name;
  } sizes[] = {{p.batch, "batch"}, {p.heads, "heads"},   {p.len_q, "len_q"},
               {p.len_k, "len_k"}, {p.dim_qk, "dim_qk"}, {p.dim_v, "dim_v"}};
  for (const auto& s : sizes) {
    if (s.value < 0) {
      return Status::InvalidArgument(std::string(s.name) + " must be >= 0, got " + str(s.value));
    }
  }
  if (!std::isfinite(p.scale)) {
    return Status::InvalidArgument("scale must be finite, got " + std::to_string(p.scale));
  }
  const bool rows = p.batch > 0 && p.heads > 0 && p.len_q > 0;
  const bool keys = p.batch > 0 && p.heads > 0 && p.len_k > 0;
  Status s;
  if (!(s = check_pointer(p.q, rows && p.dim_qk > 0, "q")).ok()) return s;
  if (!(s = check_pointer(p.k, keys && p.dim_qk > 0, "k")).ok()) return s;
  if (!(s = check_pointer(p.v, keys && p.dim_v > 0, "v")).ok()) return s;
  if (!(s = check_pointer(p.out, rows && p.dim_v > 0, "out")).ok()) return s;
  switch (p.mask_kind) {
    case MaskKind::kNone:
      break;
    case MaskKind::kBool:
    case MaskKind::kAdditive:
      if (!(s = check_pointer(p.mask, rows && keys, "mask")).ok()) return s;
      break;
    default:
      return Status::InvalidArgument("mask_kind must be kNone, kBool or kAdditive");
  }
  return Status::Ok();
}

Status validate(const AttentionBackwardParams& p) {
  Status s = validate(p.fwd);
  if (!s.ok()) return s;
  const AttentionParams& f = p.fwd;
  const bool rows = f.batch > 0 && f.heads > 0 && f.len_q > 0;
  const bool keys = f.batch > 0 && f.heads > 0 && f.len_k > 0;
  if (!(s = check_pointer(f.lse, rows, "lse")).ok()) return s;
  if (!(s = check_pointer(p.dout, rows && f.dim_v > 0, "dout")).ok()) return s;
  if (!(s = check_pointer(p.dq, rows && f.dim_qk > 0, "dq")).ok()) return s;
  if (!(s = check_pointer(p.dk, keys && f.dim_qk > 0, "dk")).ok()) return s;
  if (!(s = check_pointer(p.dv, keys && f.dim_v > 0, "dv")).ok()) return s;
  return Status::Ok();
}

}  // namespace attn2d
