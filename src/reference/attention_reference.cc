#include "reference/attention_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/strided.h"

namespace attn2d {
namespace reference {
namespace {


// Scaled, masked scores of query row i in slice (b, h); returns the row maximum.
template <typename T, typename Acc>
Acc row_scores(const AttentionParams& p, std::int64_t b, std::int64_t h, std::int64_t i,
               std::vector<Acc>& s) {
  constexpr Acc kNegInf = -std::numeric_limits<Acc>::infinity();
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const SliceMask<T> mask = slice_mask<T>(p, b, h);
  Acc m = kNegInf;
  for (std::int64_t j = 0; j < p.len_k; ++j) {
    Acc dot = 0;
    for (std::int64_t e = 0; e < p.dim_qk; ++e) {
      dot += static_cast<Acc>(q[offset4(p.q_stride, b, h, i, e)]) *
             static_cast<Acc>(k[offset4(p.k_stride, b, h, j, e)]);
    }
    Acc score = static_cast<Acc>(p.scale) * dot;
    const std::int64_t at = i * mask.row_stride + j * mask.col_stride;
    if (p.is_causal && j > i) {
      score = kNegInf;
    } else if (p.mask_kind == MaskKind::kBool && mask.bools[at] == 0) {
      score = kNegInf;
    } else if (p.mask_kind == MaskKind::kAdditive) {
      score += static_cast<Acc>(mask.bias[at]);  // the bias has the input dtype
    }
    s[j] = score;
    // A NaN score makes the whole row NaN, as in naive attention.
    if (std::isnan(score) || std::isnan(m)) {
      m = std::numeric_limits<Acc>::quiet_NaN();
    } else if (score > m) {
      m = score;
    }
  }
  return m;
}

// Probabilities in place; returns log-sum-exp (-inf for a fully masked row).
template <typename Acc>
Acc softmax_in_place(std::vector<Acc>& s, std::int64_t n, Acc m) {
  constexpr Acc kNegInf = -std::numeric_limits<Acc>::infinity();
  if (m == kNegInf) {
    for (std::int64_t j = 0; j < n; ++j) s[j] = 0;
    return kNegInf;
  }
  Acc l = 0;
  for (std::int64_t j = 0; j < n; ++j) {
    s[j] = std::exp(s[j] - m);
    l += s[j];
  }
  for (std::int64_t j = 0; j < n; ++j) s[j] /= l;
  return m + std::log(l);
}

template <typename T, typename Acc>
Status forward(const AttentionParams& p) {
  const T* v = static_cast<const T*>(p.v);
  T* out = static_cast<T*>(p.out);
  std::vector<Acc> s(static_cast<std::size_t>(p.len_k));
  std::vector<Acc> acc(static_cast<std::size_t>(p.dim_v));
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t h = 0; h < p.heads; ++h) {
      for (std::int64_t i = 0; i < p.len_q; ++i) {
        const Acc lse = softmax_in_place(s, p.len_k, row_scores<T>(p, b, h, i, s));
        for (std::int64_t e = 0; e < p.dim_v; ++e) acc[e] = 0;
        for (std::int64_t j = 0; j < p.len_k; ++j) {
          if (s[j] == 0) continue;
          for (std::int64_t e = 0; e < p.dim_v; ++e) {
            acc[e] += s[j] * static_cast<Acc>(v[offset4(p.v_stride, b, h, j, e)]);
          }
        }
        for (std::int64_t e = 0; e < p.dim_v; ++e) {
          out[offset4(p.out_stride, b, h, i, e)] = static_cast<T>(acc[e]);
        }
        if (p.lse != nullptr) {
          T* lse_out = static_cast<T*>(p.lse);
          lse_out[b * p.lse_stride[0] + h * p.lse_stride[1] + i * p.lse_stride[2]] =
              static_cast<T>(lse);
        }
      }
    }
  }
  return Status::Ok();
}

template <typename T, typename Acc>
Status backward(const AttentionBackwardParams& bp) {
  const AttentionParams& p = bp.fwd;
  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  const T* dout = static_cast<const T*>(bp.dout);
  T* dq = static_cast<T*>(bp.dq);
  T* dk = static_cast<T*>(bp.dk);
  T* dv = static_cast<T*>(bp.dv);
  const std::int64_t E = p.dim_qk, Ev = p.dim_v, Lk = p.len_k;
  std::vector<Acc> s(static_cast<std::size_t>(Lk));
  std::vector<Acc> dp(static_cast<std::size_t>(Lk));
  std::vector<Acc> dq_row(static_cast<std::size_t>(E));
  std::vector<Acc> dk_acc(static_cast<std::size_t>(Lk * E));   // (Lk, E)
  std::vector<Acc> dv_acc(static_cast<std::size_t>(Lk * Ev));  // (Lk, Ev)
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t h = 0; h < p.heads; ++h) {
      std::fill(dk_acc.begin(), dk_acc.end(), Acc(0));
      std::fill(dv_acc.begin(), dv_acc.end(), Acc(0));
      for (std::int64_t i = 0; i < p.len_q; ++i) {
        softmax_in_place(s, Lk, row_scores<T>(p, b, h, i, s));
        Acc D = 0;
        for (std::int64_t j = 0; j < Lk; ++j) {
          Acc acc = 0;
          for (std::int64_t e = 0; e < Ev; ++e) {
            acc += static_cast<Acc>(dout[offset4(bp.dout_stride, b, h, i, e)]) *
                   static_cast<Acc>(v[offset4(p.v_stride, b, h, j, e)]);
          }
          dp[j] = acc;
          D += s[j] * acc;
        }
        std::fill(dq_row.begin(), dq_row.end(), Acc(0));
        for (std::int64_t j = 0; j < Lk; ++j) {
          if (s[j] == 0) continue;
          const Acc ds = s[j] * (dp[j] - D) * static_cast<Acc>(p.scale);
          for (std::int64_t e = 0; e < E; ++e) {
            dq_row[e] += ds * static_cast<Acc>(k[offset4(p.k_stride, b, h, j, e)]);
            dk_acc[j * E + e] += ds * static_cast<Acc>(q[offset4(p.q_stride, b, h, i, e)]);
          }
          for (std::int64_t e = 0; e < Ev; ++e) {
            dv_acc[j * Ev + e] +=
                s[j] * static_cast<Acc>(dout[offset4(bp.dout_stride, b, h, i, e)]);
          }
        }
        for (std::int64_t e = 0; e < E; ++e) {
          dq[offset4(bp.dq_stride, b, h, i, e)] = static_cast<T>(dq_row[e]);
        }
      }
      for (std::int64_t j = 0; j < Lk; ++j) {
        for (std::int64_t e = 0; e < E; ++e) {
          dk[offset4(bp.dk_stride, b, h, j, e)] = static_cast<T>(dk_acc[j * E + e]);
        }
        for (std::int64_t e = 0; e < Ev; ++e) {
          dv[offset4(bp.dv_stride, b, h, j, e)] = static_cast<T>(dv_acc[j * Ev + e]);
        }
      }
    }
  }
  return Status::Ok();
}

Status refuse_16_bit(DType dtype) {
  return Status::Unsupported(std::string("the reference backend computes float32 and float64; "
                                         "widen ") + dtype_name(dtype) +
                             " inputs to float32 to compare with it");
}

bool is_16_bit(DType dtype) { return dtype == DType::kBFloat16 || dtype == DType::kFloat16; }

}  // namespace

Status attention_forward(const AttentionParams& params, Precision precision) {
  if (is_16_bit(params.dtype)) return refuse_16_bit(params.dtype);
  if (params.dtype == DType::kFloat64) return forward<double, double>(params);
  return precision == Precision::kFloat64 ? forward<float, double>(params)
                                          : forward<float, float>(params);
}

Status attention_backward(const AttentionBackwardParams& params, Precision precision) {
  if (is_16_bit(params.fwd.dtype)) return refuse_16_bit(params.fwd.dtype);
  if (params.fwd.dtype == DType::kFloat64) return backward<double, double>(params);
  return precision == Precision::kFloat64 ? backward<float, double>(params)
                                          : backward<float, float>(params);
}

}  // namespace reference
}  // namespace attn2d
