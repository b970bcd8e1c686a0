// The sparse (gathered, block-sparse) kernels against the reference run with the equivalent
// dense bool mask, on every compiled SIMD target; and layout validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "attention_test_util.h"
#include "hwy/targets.h"

namespace attn2d {
namespace testing {
namespace {

// A random layout over len_q queries and len_k keys: rows shuffled into tiles (a partition, or
// with `drop` > 0 a part: each row left out of every tile with that probability), each (query
// tile, key tile) pair visited with probability 0.6 and masked at random or full. With
// `reach`, a masked visit allows keys only in its key tile's first 1..64 columns (drawn per
// visit), so the kernels' cut to a visit's leading columns (VisitColumns) lands anywhere. With
// `one_key`, a masked visit allows at most one key a row (a repetitive YLG pattern's
// own-position keys), which the kernels take row by row (VisitSingleKeys, SingleKeyGrads).
struct RandomLayout {
  std::vector<std::int32_t> head_layout, q_rows, k_rows, fwd_k_tile, bwd_q_tile;
  std::vector<std::int64_t> q_begin, k_begin, fwd_begin, fwd_mask, bwd_begin, bwd_mask;
  std::vector<std::uint64_t> masks;
  std::vector<unsigned char> dense;  // (layouts, len_q, len_k): the same pattern, for the oracle
  SparseLayout view;

  RandomLayout(std::int64_t heads, std::int64_t len_q, std::int64_t len_k, int layouts,
               std::int64_t block_q, std::uint64_t seed, double drop = 0.0, bool reach = false,
               bool one_key = false) {
    std::mt19937_64 rng(seed);
    dense.assign(static_cast<size_t>(layouts * len_q * len_k), 0);
    q_begin = {0};
    k_begin = {0};
    std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>> visits;
    for (int l = 0; l < layouts; ++l) {
      auto tiles = [&](std::int64_t len, std::int64_t block, std::vector<std::int32_t>& rows,
                       std::vector<std::int64_t>& begin) {
        std::vector<std::int32_t> perm(static_cast<size_t>(len));
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        if (drop > 0) {
          std::bernoulli_distribution out(drop);
          perm.erase(std::remove_if(perm.begin(), perm.end(), [&](std::int32_t) { return out(rng); }),
                     perm.end());
          len = static_cast<std::int64_t>(perm.size());
        }
        std::int64_t n = 0;
        for (std::int64_t i = 0; i < len;) {
          // Ragged tiles: some shorter than the block.
          const std::int64_t take = std::min<std::int64_t>(len - i, 1 + static_cast<std::int64_t>(rng() % block));
          for (std::int64_t r = 0; r < block; ++r) rows.push_back(r < take ? perm[i + r] : -1);
          i += take;
          ++n;
        }
        begin.push_back(begin.back() + n);
      };
      const std::int64_t q0 = q_begin.back(), k0 = k_begin.back();
      tiles(len_q, block_q, q_rows, q_begin);
      tiles(len_k, 64, k_rows, k_begin);
      std::bernoulli_distribution visit(0.6), full(0.3), bit(0.5);
      for (std::int64_t qt = q0; qt < q_begin.back(); ++qt) {
        for (std::int64_t kt = k0; kt < k_begin.back(); ++kt) {
          if (!visit(rng)) continue;
          std::int64_t m = -1;
          std::vector<std::uint64_t> words(static_cast<size_t>(block_q), 0);
          const bool all = full(rng);
          const std::int64_t columns = reach && !all ? 1 + static_cast<std::int64_t>(rng() % 64) : 64;
          for (std::int64_t r = 0; r < block_q; ++r) {
            const std::int32_t i = q_rows[qt * block_q + r];
            // one_key: the row's one column (a padding column or a lost coin: none).
            const std::int64_t pick =
                one_key && bit(rng) ? static_cast<std::int64_t>(rng() % columns) : -1;
            for (std::int64_t c = 0; c < columns; ++c) {
              const std::int32_t j = k_rows[kt * 64 + c];
              if (i < 0 || j < 0) continue;
              const bool ok = all || (one_key ? c == pick : bit(rng));
              if (ok) words[r] |= std::uint64_t{1} << c;
              if (ok) dense[(l * len_q + i) * len_k + j] = 1;
            }
          }
          if (!all) {
            m = static_cast<std::int64_t>(masks.size() / block_q);
            masks.insert(masks.end(), words.begin(), words.end());
          }
          visits.emplace_back(qt, kt, m);
        }
      }
    }
    for (std::int64_t h = 0; h < heads; ++h) head_layout.push_back(static_cast<std::int32_t>(h % layouts));
    const std::int64_t nq = q_begin.back(), nk = k_begin.back();
    fwd_begin.assign(static_cast<size_t>(nq + 1), 0);
    bwd_begin.assign(static_cast<size_t>(nk + 1), 0);
    for (const auto& [qt, kt, m] : visits) {
      ++fwd_begin[qt + 1];
      ++bwd_begin[kt + 1];
      fwd_k_tile.push_back(static_cast<std::int32_t>(kt));  // visits are in query-tile order
      fwd_mask.push_back(m);
    }
    std::partial_sum(fwd_begin.begin(), fwd_begin.end(), fwd_begin.begin());
    std::partial_sum(bwd_begin.begin(), bwd_begin.end(), bwd_begin.begin());
    auto by_key = visits;
    std::stable_sort(by_key.begin(), by_key.end(),
                     [](const auto& a, const auto& b) { return std::get<1>(a) < std::get<1>(b); });
    for (const auto& [qt, kt, m] : by_key) {
      bwd_q_tile.push_back(static_cast<std::int32_t>(qt));
      bwd_mask.push_back(m);
    }
    view.block_q = block_q;
    view.block_k = 64;
    view.num_layouts = layouts;
    view.head_layout = head_layout.data();
    view.q_tile_begin = q_begin.data();
    view.k_tile_begin = k_begin.data();
    view.q_rows = q_rows.data();
    view.k_rows = k_rows.data();
    view.fwd_begin = fwd_begin.data();
    view.fwd_k_tile = fwd_k_tile.data();
    view.fwd_mask = fwd_mask.data();
    view.bwd_begin = bwd_begin.data();
    view.bwd_q_tile = bwd_q_tile.data();
    view.bwd_mask = bwd_mask.data();
    view.num_masks = static_cast<std::int64_t>(masks.size()) / block_q;
    view.masks = masks.data();
  }
};

class SparseAttention : public hwy::TestWithParamTarget {};
ATTN2D_TARGET_INSTANTIATE_TEST_SUITE_P(SparseAttention);

template <typename T>
void expect_sparse_matches_dense(std::int64_t B, std::int64_t H, std::int64_t Lq, std::int64_t Lk,
                                 std::int64_t E, std::int64_t Ev, int layouts,
                                 std::int64_t block_q, std::uint64_t seed, bool reach = false,
                                 bool one_key = false,
                                 Layout inputs = Layout::kSequenceMajor) {
  RandomLayout lay(H, Lq, Lk, layouts, block_q, seed, /*drop=*/0.0, reach, one_key);
  // The oracle: the reference backend with the layout's dense mask, per head.
  auto dense = make_problem<double>(B, H, Lq, Lk, E, Ev, Layout::kSequenceMajor, seed + 1,
                                    MaskKind::kBool, {true, false, false, false});
  for (std::int64_t h = 0; h < H; ++h) {
    const std::int64_t l = lay.head_layout[h];
    std::copy_n(lay.dense.begin() + l * Lq * Lk, Lq * Lk, dense.mask.bools.begin() + h * Lq * Lk);
  }
  auto sparse = make_problem<T>(B, H, Lq, Lk, E, Ev, inputs, seed + 1);
  auto cast = [](const Tensor4<T>& t) { return t.template cast<double>(); };
  dense.q = cast(sparse.q), dense.k = cast(sparse.k), dense.v = cast(sparse.v);
  dense.dout = cast(sparse.dout);
  const Result<double> oracle = run(dense, Backend::kReference, serial_host());
  ASSERT_TRUE(oracle.forward_status.ok() && oracle.backward_status.ok());

  Result<T> ours;
  ours.out = make_tensor<T>({B, H, Lq, Ev}, Layout::kContiguous);
  ours.lse.assign(static_cast<size_t>(B * H * Lq), T(0));
  ours.dq = make_tensor<T>({B, H, Lq, E}, Layout::kContiguous);
  ours.dk = make_tensor<T>({B, H, Lk, E}, Layout::kContiguous);
  ours.dv = make_tensor<T>({B, H, Lk, Ev}, Layout::kContiguous);
  AttentionBackwardParams bp;
  bp.fwd = forward_params(sparse, ours.out, ours.lse);
  bp.fwd.layout = &lay.view;
  // Scratch full of NaN: no result may depend on scratch the kernels did not write.
  ASSERT_TRUE(attention_forward(bp.fwd, poisoned_host(2)).ok());
  set_view(sparse.dout, &bp.dout, bp.dout_stride);
  bp.dq = ours.dq.data.data(), bp.dk = ours.dk.data.data(), bp.dv = ours.dv.data.data();
  std::copy(ours.dq.stride.begin(), ours.dq.stride.end(), bp.dq_stride);
  std::copy(ours.dk.stride.begin(), ours.dk.stride.end(), bp.dk_stride);
  std::copy(ours.dv.stride.begin(), ours.dv.stride.end(), bp.dv_stride);
  const Status s = attention_backward(bp, thread_host(2));
  ASSERT_TRUE(s.ok()) << s.message();
  const double tol = sizeof(T) == 4 ? 2e-5 : 1e-12;  // inputs and outputs of order 1
  EXPECT_LE(max_abs_diff(ours.out, oracle.out), tol);
  EXPECT_LE(max_abs_diff(ours.dq, oracle.dq), tol);
  EXPECT_LE(max_abs_diff(ours.dk, oracle.dk), tol);
  EXPECT_LE(max_abs_diff(ours.dv, oracle.dv), tol);
  for (size_t r = 0; r < ours.lse.size(); ++r) {
    if (std::isinf(oracle.lse[r])) EXPECT_EQ(ours.lse[r], oracle.lse[r]);  // fully masked row
  }
  // Other thread counts pick other schedules (whole heads, key-tile groups, two passes); every
  // one must give the same bits, and so must gradients written past the caches (non-temporal
  // stores, cpu/common/result_stores.h), which problems this small never choose by themselves.
  struct Run {
    int threads;
    bool streamed;
  };
  for (const Run run : {Run{1, false}, Run{3, false}, Run{4, false}, Run{16, false},
                        Run{1, true}, Run{2, true}, Run{16, true}}) {
    Result<T> other;
    other.dq = make_tensor<T>({B, H, Lq, E}, Layout::kContiguous);
    other.dk = make_tensor<T>({B, H, Lk, E}, Layout::kContiguous);
    other.dv = make_tensor<T>({B, H, Lk, Ev}, Layout::kContiguous);
    AttentionBackwardParams ob = bp;
    ob.dq = other.dq.data.data(), ob.dk = other.dk.data.data(), ob.dv = other.dv.data.data();
    Host host = run.threads == 1 ? serial_host() : thread_host(run.threads);
    if (run.streamed) host.stream_result_bytes = 0;
    ASSERT_TRUE(attention_backward(ob, host).ok());
    auto same = [](const Tensor4<T>& x, const Tensor4<T>& y) {
      return std::memcmp(x.data.data(), y.data.data(), x.data.size() * sizeof(T)) == 0;
    };
    const std::string what =
        std::to_string(run.threads) + " threads" + (run.streamed ? ", streamed" : "");
    EXPECT_TRUE(same(ours.dq, other.dq)) << what;
    EXPECT_TRUE(same(ours.dk, other.dk)) << what;
    EXPECT_TRUE(same(ours.dv, other.dv)) << what;
  }
}

// Float heads up to 256 wide take the query-lanes forward (cpu/lanes/query_lanes-inl.h): widths of 1,
// of a 16 x 16 transpose plus a remainder (E = 20), 32 and 33; wider ones the tile path. On
// AVX-512 targets widths of whole 16 x 16 transposes (E = 32, Ev = 48 here; 16 below) read q
// and write out straight from the lanes (LaneDirectVisits), ragged tiles leaving part of a
// vector's lanes without a row.
TEST_P(SparseAttention, RandomLayoutsMatchTheDenseMaskOracle) {
  expect_sparse_matches_dense<float>(1, 2, 70, 90, 32, 48, 2, 64, 9, /*reach=*/true);
  expect_sparse_matches_dense<double>(2, 3, 130, 150, 7, 5, 2, 64, 1);
  expect_sparse_matches_dense<double>(1, 2, 17, 200, 16, 8, 1, 16, 2);
  expect_sparse_matches_dense<float>(2, 2, 100, 90, 8, 24, 2, 32, 3);
  expect_sparse_matches_dense<float>(1, 2, 37, 70, 1, 1, 1, 12, 4);
  expect_sparse_matches_dense<float>(1, 2, 100, 90, 20, 32, 2, 64, 5, /*reach=*/true);
  expect_sparse_matches_dense<float>(1, 2, 70, 90, 33, 24, 2, 32, 7, /*reach=*/true);
  expect_sparse_matches_dense<float>(1, 2, 40, 70, 260, 24, 1, 16, 8, /*reach=*/true);
}

// Masked visits that allow at most one key a row take the row-by-row paths, forward and in both
// backward passes; every schedule must still give the same bits (checked above) and match the
// oracle. Full visits stay on tiles, so each query tile mixes the two.
TEST_P(SparseAttention, OneKeyARowVisitsMatchTheOracleInEverySchedule) {
  expect_sparse_matches_dense<double>(2, 3, 130, 150, 7, 5, 2, 64, 11, false, true);
  expect_sparse_matches_dense<double>(1, 2, 17, 200, 16, 8, 1, 16, 12, true, true);
  expect_sparse_matches_dense<float>(2, 2, 100, 90, 8, 24, 2, 32, 13, false, true);
  expect_sparse_matches_dense<float>(1, 3, 70, 64, 16, 16, 1, 64, 14, true, true);
}

// Masked visits that reach only part of their key tile: the kernels compute the leading
// columns up to the last allowed one (rounded up to whole vectors, the real keys past it
// masked), and every backward schedule cuts the same columns.
TEST_P(SparseAttention, VisitsReachingPartOfTheirKeyTilesMatchTheOracle) {
  expect_sparse_matches_dense<double>(2, 3, 130, 150, 7, 5, 2, 64, 11, /*reach=*/true);
  expect_sparse_matches_dense<float>(1, 2, 100, 190, 16, 16, 2, 32, 12, /*reach=*/true);
}

// Channels-first q, k, v and dO (an NCHW conv output viewed as (B, H, L, D), as attn2d.nn passes
// them): the one-pass schedules copy them to rows before gathering tiles, whose shuffled rows lie
// apart (cpu/tiled/row_staging-inl.h), and the two-pass one (more threads than slices) reads them as
// they are, with the same bits; 16 x 16 float transposes at E = 16 and Ev = 24, with a remainder
// at E = 20, and element copies for float64. Widths of one take no copy.
TEST_P(SparseAttention, ChannelsFirstInputsMatchTheOracle) {
  expect_sparse_matches_dense<float>(2, 2, 100, 90, 16, 24, 2, 32, 21, false, false,
                                     Layout::kChannelsFirst);
  expect_sparse_matches_dense<float>(1, 3, 70, 64, 20, 16, 1, 64, 22, true, true,
                                     Layout::kChannelsFirst);
  expect_sparse_matches_dense<double>(2, 3, 130, 150, 7, 5, 2, 64, 23, false, false,
                                      Layout::kChannelsFirst);
  expect_sparse_matches_dense<double>(1, 2, 17, 40, 1, 1, 1, 16, 24, false, false,
                                      Layout::kChannelsFirst);
}

// Wide heads: a thread's 4 MiB of packed key tiles holds 7 of a head's ~21 (561 KiB a tile at
// E = Ev = 512 in float64), so visits share slots and re-pack evicted tiles.
TEST_P(SparseAttention, KeyTilesBeyondTheForwardCacheMatchTheOracle) {
  expect_sparse_matches_dense<double>(1, 2, 40, 700, 512, 512, 2, 16, 6);
}

TEST(SparseLayoutValidation, MalformedLayoutsAreInvalidArguments) {
  RandomLayout good(2, 40, 70, 1, 16, 5);
  auto pr = make_problem<float>(1, 2, 40, 70, 4, 4, Layout::kContiguous, 5);
  auto out = make_tensor<float>({1, 2, 40, 4}, Layout::kContiguous);
  std::vector<float> lse(80);
  AttentionParams p = forward_params(pr, out, lse);
  p.layout = &good.view;
  ASSERT_TRUE(validate(p).ok()) << validate(p).message();
  struct Case {
    const char* what;
    void (*mutate)(RandomLayout&);
  } cases[] = {
      {"key row out of range", [](RandomLayout& l) { l.k_rows[0] = 70; }},
      {"duplicate query row", [](RandomLayout& l) { l.q_rows[1] = l.q_rows[0]; }},
      {"bad block_k", [](RandomLayout& l) { l.view.block_k = 32; }},
      {"head layout out of range", [](RandomLayout& l) { l.head_layout[1] = 3; }},
      {"mask index out of range", [](RandomLayout& l) {
         if (!l.fwd_mask.empty()) l.fwd_mask[0] = l.view.num_masks + 5;
       }},
      {"backward lists disagree", [](RandomLayout& l) {
         if (!l.bwd_mask.empty()) l.bwd_mask[0] = l.bwd_mask[0] == -1 ? 0 : -1;
       }},
      {"backward visit from another query tile", [](RandomLayout& l) {
         const std::int32_t tiles = static_cast<std::int32_t>(l.q_begin.back());
         if (!l.bwd_q_tile.empty()) l.bwd_q_tile[0] = (l.bwd_q_tile[0] + 1) % tiles;
       }},
      {"backward visit under another key tile", [](RandomLayout& l) {
         ++l.bwd_begin[1];  // the second key tile's first visit moves to the first
       }},
  };
  for (const Case& c : cases) {
    RandomLayout bad(2, 40, 70, 1, 16, 5);
    c.mutate(bad);
    p.layout = &bad.view;
    EXPECT_EQ(validate(p).code(), StatusCode::kInvalidArgument) << c.what;
  }
  // Each key tile's backward visits in reverse order: the same lists, still valid.
  RandomLayout reversed(2, 40, 70, 1, 16, 5);
  bool reordered = false;
  for (size_t k = 0; k + 1 < reversed.bwd_begin.size(); ++k) {
    const auto v0 = static_cast<std::ptrdiff_t>(reversed.bwd_begin[k]);
    const auto v1 = static_cast<std::ptrdiff_t>(reversed.bwd_begin[k + 1]);
    std::reverse(reversed.bwd_q_tile.begin() + v0, reversed.bwd_q_tile.begin() + v1);
    std::reverse(reversed.bwd_mask.begin() + v0, reversed.bwd_mask.begin() + v1);
    for (auto v = v0; v + 1 < v1; ++v) {
      reordered |= reversed.bwd_q_tile[v] != reversed.bwd_q_tile[v + 1];
    }
  }
  ASSERT_TRUE(reordered) << "the layout has no key tile with two query tiles to reorder";
  p.layout = &reversed.view;
  EXPECT_TRUE(validate(p).ok()) << validate(p).message();
  // Rows in no tile: the kernels write a row only from the tile that holds it.
  RandomLayout part(2, 40, 70, 1, 16, 5, /*drop=*/0.2);
  p.layout = &part.view;
  EXPECT_EQ(validate(p).code(), StatusCode::kInvalidArgument) << "rows in no tile";
  for (const bool query : {true, false}) {
    RandomLayout one(2, 40, 70, 1, 16, 5);
    // Drops the last row of the first tile (the padding stays at the tile's end).
    std::vector<std::int32_t>& rows = query ? one.q_rows : one.k_rows;
    const std::int64_t block = query ? 16 : 64;
    std::int64_t last = 0;
    while (last + 1 < block && rows[static_cast<size_t>(last + 1)] >= 0) ++last;
    rows[static_cast<size_t>(last)] = -1;
    p.layout = &one.view;
    const Status s = validate(p);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << (query ? "query" : "key");
    EXPECT_NE(s.message().find("is in none"), std::string::npos) << s.message();
  }
  p.layout = &good.view;
  p.is_causal = true;
  EXPECT_EQ(validate(p).code(), StatusCode::kInvalidArgument);
}

// Found by tests/fuzz/layout_fuzz: each of these read past an array or allocated from an
// unchecked length before the fixes in validate.cc; each is now a Status naming the defect.
TEST(SparseLayoutValidation, LayoutsTheFuzzerFoundAreInvalidArguments) {
  auto pr = make_problem<float>(1, 2, 40, 70, 4, 4, Layout::kContiguous, 5);
  auto out = make_tensor<float>({1, 2, 40, 4}, Layout::kContiguous);
  std::vector<float> lse(80);
  AttentionParams p = forward_params(pr, out, lse);
  auto expect_refused = [&](const SparseLayout& view, const char* message) {
    p.layout = &view;
    const Status s = validate(p);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << message;
    EXPECT_NE(s.message().find(message), std::string::npos) << s.message();
  };
  {
    // A length no tile range can hold: refused before a per-row array of that length is made.
    RandomLayout l(2, 40, 70, 1, 16, 5);
    p.len_q = std::int64_t{1} << 50;
    expect_refused(l.view, "query tiles of 16 rows cannot hold");
    p.len_q = 40;
  }
  {
    RandomLayout l(2, 40, 70, 1, 16, 5);
    l.view.q_rows = nullptr;
    expect_refused(l.view, "query rows are null");
    l.view.q_rows = l.q_rows.data();
    l.view.k_rows = nullptr;
    expect_refused(l.view, "key rows are null");
  }
  for (const bool forward : {true, false}) {
    RandomLayout l(2, 40, 70, 1, 16, 5);
    (forward ? l.view.fwd_k_tile : l.view.bwd_q_tile) = nullptr;
    expect_refused(l.view, "a visit array is null");
  }
  {
    // Two layouts whose second range runs backwards: every range is checked before the rows
    // of the first are read, so the rows array is not walked to a range end past its length.
    RandomLayout l(2, 40, 70, 2, 16, 5);
    std::vector<std::int64_t> begins = l.q_begin;
    begins[2] = begins[1] - 1;
    l.view.q_tile_begin = begins.data();
    expect_refused(l.view, "query tile ranges must not decrease");
    std::vector<std::int64_t> visits = l.fwd_begin;
    visits[1] = visits.back() + 1000;
    l.view.q_tile_begin = l.q_begin.data();
    l.view.fwd_begin = visits.data();
    expect_refused(l.view, "visit offsets must not decrease");
  }
}

}  // namespace
}  // namespace testing
}  // namespace attn2d
