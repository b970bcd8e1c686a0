// Element offsets for the strided 4-D (and 3-D) views in the params structs.
#pragma once

#include <cstdint>
#include <limits>

#include "attn2d/attention_params.h"

namespace attn2d {

inline std::int64_t offset4(const std::int64_t* stride, std::int64_t b, std::int64_t h,
                            std::int64_t i, std::int64_t j) {
  return b * stride[0] + h * stride[1] + i * stride[2] + j * stride[3];
}

// Slice (b, h) of p's out_accum at its row 0 (element type T, the accumulation type), or null
// where the call keeps no float output.
template <typename T>
T* OutAccumAt(const AttentionParams& p, std::int64_t b, std::int64_t h) {
  return p.out_accum == nullptr
             ? nullptr
             : static_cast<T*>(p.out_accum) + offset4(p.out_accum_stride, b, h, 0, 0);
}

// The mask of one (batch, head) slice, with causality folded in, as the scores see it.
template <typename T>
struct SliceMask {
  MaskKind kind = MaskKind::kNone;
  const unsigned char* bools = nullptr;  // (len_q, len_k) slice, strided
  const T* bias = nullptr;               // (len_q, len_k) slice, strided
  std::int64_t row_stride = 0;
  std::int64_t col_stride = 0;
  bool causal = false;

  bool trivial() const { return kind == MaskKind::kNone && !causal; }

  // The masked score of query i and key j: -inf where attention is not allowed.
  T apply(T score, std::int64_t i, std::int64_t j) const {
    constexpr T kNegInf = -std::numeric_limits<T>::infinity();
    if (causal && j > i) return kNegInf;
    const std::int64_t at = i * row_stride + j * col_stride;
    if (kind == MaskKind::kBool) return bools[at] ? score : kNegInf;
    if (kind == MaskKind::kAdditive) return score + bias[at];
    return score;
  }
};

template <typename T>
SliceMask<T> slice_mask(const AttentionParams& p, std::int64_t b, std::int64_t h) {
  SliceMask<T> m;
  m.kind = p.mask_kind;
  m.causal = p.is_causal;
  m.row_stride = p.mask_stride[2];
  m.col_stride = p.mask_stride[3];
  // An empty problem's mask may be null (validate), where an offset from it is undefined; no
  // element of it is read then.
  if (p.mask == nullptr) return m;
  const std::int64_t base = b * p.mask_stride[0] + h * p.mask_stride[1];
  if (p.mask_kind == MaskKind::kBool) {
    m.bools = static_cast<const unsigned char*>(p.mask) + base;
  } else if (p.mask_kind == MaskKind::kAdditive) {
    m.bias = static_cast<const T*>(p.mask) + base;
  }
  return m;
}

// The keys and values of slice (b, h) of p, at its position 0 (element type IO).
template <typename IO>
struct SliceKeysValues {
  const IO* k;
  const IO* v;
};

template <typename IO>
SliceKeysValues<IO> slice_keys_values(const AttentionParams& p, std::int64_t b, std::int64_t h) {
  return {static_cast<const IO*>(p.k) + offset4(p.k_stride, b, h, 0, 0),
          static_cast<const IO*>(p.v) + offset4(p.v_stride, b, h, 0, 0)};
}

}  // namespace attn2d
