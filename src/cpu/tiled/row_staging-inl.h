// Row-major copies of channels-first tensors for the gathered-tile (sparse layout) kernels.
// A sparse layout's tiles gather scattered rows (a YLG tile's positions lie along Manhattan
// anti-diagonals, W - 1 apart). In a channels-first view (attn2d.nn's 1x1-conv outputs viewed as
// (B, heads, H, W, d): stride 1 along positions, H * W along channels) each element of a gathered
// row lies on a cache line of its own, d lines a row where a row-major tensor has d / 16. Where
// a layout's tiles are ScatteredTiles, such views are first copied to rows, in
// 16 x 16 transposes: the forward a run of heads of one batch element at a time within
// kStageBudgetBytes, each run a problem of its own (StageRows); the backward one slice a thread,
// before the thread walks it (StageSlice). Copies of whole tensors would hold every head at once
// for no gain in speed (YLG(8) at 128x128 on the Intel Xeon: 1.5x the step's peak memory).
// Included once per SIMD target by foreach_target.h (hence the toggle guard below).

#if defined(ATTN2D_SRC_CPU_TILED_ROW_STAGING_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef ATTN2D_SRC_CPU_TILED_ROW_STAGING_INL_H_
#undef ATTN2D_SRC_CPU_TILED_ROW_STAGING_INL_H_
#else
#define ATTN2D_SRC_CPU_TILED_ROW_STAGING_INL_H_
#endif

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <type_traits>

#include "attn2d/host.h"
#include "attn2d/sparse_layout.h"
#include "core/workspace.h"
#include "cpu/common/pack-inl.h"
#include "cpu/tiled/layout_scan.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace attn2d {
namespace cpu {
namespace HWY_NAMESPACE {

// One (batch, heads, len, width) tensor view to stage: *data and stride are replaced by the
// row-major copy's when it is staged.
struct StagedView {
  const void** data;
  std::int64_t* stride;
  std::int64_t len;
  std::int64_t width;
  bool scattered;  // the layout's tiles over these rows are ScatteredTiles
};

// Whether a (batch, heads, len, width) view's positions lie closer together than its channels.
inline bool ChannelsFirst(const std::int64_t* stride, std::int64_t len, std::int64_t width) {
  return len > 1 && width > 1 && std::abs(stride[2]) < std::abs(stride[3]);
}

// Whether gathering rows of this view touches a line per element: it is ChannelsFirst, and its
// tiles' rows lie apart.
inline bool GathersPerElement(const StagedView& v) {
  return *v.data != nullptr && v.scattered && ChannelsFirst(v.stride, v.len, v.width);
}

// Points v at its row-major copy `rows`, slice (b, h) at rows + b * batch_stride +
// h * head_stride.
inline void PointAtRows(const StagedView& v, const void* rows, std::int64_t batch_stride,
                        std::int64_t head_stride) {
  *v.data = rows;
  v.stride[0] = batch_stride;
  v.stride[1] = head_stride;
  v.stride[2] = v.width;
  v.stride[3] = 1;
}

template <typename IO>
struct StageJob {
  const IO* src;
  std::int64_t src_stride[4];
  std::int64_t heads, len, width;
  IO* dst;  // (batch, heads, len, width)
};

// One task: one (batch, head) plane of (width, len) into (len, width) rows.
template <typename IO>
void StageTask(void* ctx, std::int64_t task, int /*thread*/) {
  const StageJob<IO>& job = *static_cast<const StageJob<IO>*>(ctx);
  const std::int64_t b = task / job.heads, h = task % job.heads;
  const IO* src = job.src + b * job.src_stride[0] + h * job.src_stride[1];
  IO* dst = job.dst + task * job.len * job.width;
  const std::int64_t rs = job.src_stride[3], cs = job.src_stride[2];
  if constexpr (std::is_same<IO, float>::value || std::is_same<IO, double>::value) {
    // Rows of the transpose are the channels: element (c, n) = src[c * rs + n * cs] goes to
    // dst[n * width + c]; on AVX-512, 16 x 16 float blocks where positions are contiguous.
    PackTransposed<IO, IO>(src, Rows{nullptr, 0, static_cast<size_t>(job.width)}, rs, cs,
                           static_cast<size_t>(job.len), dst, static_cast<size_t>(job.width),
                           static_cast<size_t>(job.width));
  } else {
    // 16-bit elements are copied as they are: blocks of 64 positions keep the destination's
    // 64 rows in L1 while each channel's run is read once.
    constexpr std::int64_t kBlock = 64;
    for (std::int64_t n0 = 0; n0 < job.len; n0 += kBlock) {
      const std::int64_t n1 = std::min(job.len, n0 + kBlock);
      for (std::int64_t c = 0; c < job.width; ++c) {
        const IO* s = src + c * rs;
        for (std::int64_t n = n0; n < n1; ++n) dst[n * job.width + c] = s[n * cs];
      }
    }
  }
}

// Bytes of row-major copies one run of heads may hold (a 128x128 head's Q and dO at E = Ev = 16
// take 1 MiB each, its 64x64 keys' K and V 0.25 MiB each).
constexpr size_t kStageBudgetBytes = size_t{8} << 20;

// Elements of the copies one head needs: every view that GathersPerElement.
template <size_t N>
size_t StagedElemsPerHead(const std::array<StagedView, N>& views) {
  size_t elems = 0;
  for (const StagedView& v : views) {
    if (GathersPerElement(v)) elems += static_cast<size_t>(v.len * v.width);
  }
  return elems;
}

// Heads per run: as many as kStageBudgetBytes holds (one at least), and where that is at least
// the thread count a multiple of it. YLG's heads cost differently, and a run whose heads do not
// split evenly over the threads can leave one thread the costlier ones.
inline std::int64_t HeadsPerStage(size_t bytes_per_head, std::int64_t heads, int threads) {
  threads = std::max(threads, 1);
  std::int64_t n =
      static_cast<std::int64_t>(kStageBudgetBytes / std::max<size_t>(bytes_per_head, 1));
  if (n >= threads) n -= n % threads;
  return std::clamp<std::int64_t>(n, 1, heads);
}

// A view moved to (b, h0): the same arithmetic the kernels apply to reach a head.
template <typename U>
inline U* AtHead(U* data, const std::int64_t* stride, std::int64_t b, std::int64_t h0) {
  return data == nullptr ? nullptr : data + b * stride[0] + h0 * stride[1];
}

// Copies every view that GathersPerElement, of `heads` heads of one batch element, to rows in
// `buffer` (StagedElemsPerHead(views) * heads elements), and points the view there.
template <typename IO, size_t N>
void StageRows(const Host& host, std::int64_t heads, const std::array<StagedView, N>& views,
               IO* buffer) {
  for (const StagedView& v : views) {
    if (!GathersPerElement(v)) continue;
    StageJob<IO> job{static_cast<const IO*>(*v.data), {v.stride[0], v.stride[1], v.stride[2],
                     v.stride[3]}, heads, v.len, v.width, buffer};
    run_tasks(host, heads, &job, StageTask<IO>);
    PointAtRows(v, buffer, heads * v.len * v.width, v.len * v.width);
    buffer += heads * v.len * v.width;
  }
}

// The backward's form, inside a task that walks one (b, h) slice: copies that slice of the view
// to rows at dst (len * width elements) when it GathersPerElement, and points the view there with
// zero batch and head strides, so that the kernels' offsets of (b, h) land on the copy. Returns
// the elements used.
template <typename IO>
size_t StageSlice(const StagedView& v, std::int64_t b, std::int64_t h, IO* dst) {
  if (!GathersPerElement(v)) return 0;
  StageJob<IO> job{static_cast<const IO*>(*v.data) + b * v.stride[0] + h * v.stride[1],
                   {0, 0, v.stride[2], v.stride[3]}, 1, v.len, v.width, dst};
  StageTask<IO>(&job, 0, 0);
  PointAtRows(v, dst, 0, 0);
  return static_cast<size_t>(v.len * v.width);
}

}  // namespace HWY_NAMESPACE
}  // namespace cpu
}  // namespace attn2d
HWY_AFTER_NAMESPACE();

#endif  // ATTN2D_SRC_CPU_TILED_ROW_STAGING_INL_H_
