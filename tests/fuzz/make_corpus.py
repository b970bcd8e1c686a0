#!/usr/bin/env python3
"""Writes the seed corpus of the libFuzzer targets (tests/fuzz/corpus/<target>/) from named
params, valid and invalid, in the byte layout their readers take (tests/fuzz/fuzz_util.h: bytes
read front to back, zeros past the end). Rerun after changing a target's input layout."""
import pathlib
import struct

HERE = pathlib.Path(__file__).resolve().parent


def i64(v):
    return struct.pack("<q", v)


def i32(v):
    return struct.pack("<i", v)


def size(v):
    """Input::size: 0..7 in one byte, 8..101 (steps of 3) in one byte, -1..-256, or any int64."""
    if 0 <= v < 8:
        return bytes([v])
    if 8 <= v <= 101 and (v - 8) % 3 == 0:
        return bytes([0xC0 + (v - 8) // 3])
    if -256 <= v <= -1:
        return bytes([0xE0, -1 - v])
    return bytes([0xF0]) + i64(v)


def stride(v=None):
    """Input::stride: None for the packed stride, -9..9 in one byte, else any int64."""
    if v is None:
        return bytes([0])
    if -9 <= v <= 9:
        return bytes([0x80 + (v + 9 - 0x80 % 19) % 19])
    return bytes([0xF8]) + i64(v)


def scale(v):
    """Input::scale: inf, nan, 0, 0.125 * (1..16), else the double itself."""
    if v == float("inf"):
        return bytes([0])
    if v != v:
        return bytes([1])
    if v == 0:
        return bytes([3])
    k = v / 0.125 - 1
    if k == int(k) and 0 <= k < 16:
        return bytes([4, int(k)])
    return bytes([2]) + struct.pack("<d", v)


def host(threads=1, order=0, fail_at=None, stream=2):
    """FuzzHost::make: threads 1..4, task order, the allocation to refuse, streaming stores."""
    out = bytes([threads - 1, order])
    out += bytes([0, fail_at]) if fail_at is not None else bytes([1])
    return out + bytes([stream])


BACKEND = {"reference": 0, "cpu": 1, "auto": 2}
DTYPE = {"float32": 0, "float64": 1, "bfloat16": 2, "float16": 3}


def run_tail(backend="auto", pairs=False, **host_args):
    return host(**host_args) + bytes([BACKEND[backend], int(pairs)])


def validate_seed(dtype=0, mask=0, causal=False, backward=False, wild=False, out_accum=False,
                  scale_=0.5, sizes=(1, 2, 5, 7, 4, 3), strides=None, nulls=(), **tail):
    """validate_fuzz: dtype, mask kind, flags, scale, six sizes, then per tensor (q, k, v, out,
    mask, lse, for the backward dout, dq, dk, dv, and out_accum) a null byte, its strides and a
    seed."""
    flags = int(causal) | int(backward) << 1 | int(wild) << 2 | int(out_accum) << 3
    out = bytes([dtype, mask, flags])
    out += scale(scale_)
    out += b"".join(size(s) for s in sizes)
    names = ["q", "k", "v", "out", "mask", "lse"]
    if backward:
        names += ["dout", "dq", "dk", "dv"]
    if out_accum:
        names += ["out_accum"]
    strides = strides or {}
    for n, name in enumerate(names):
        out += bytes([0 if name in nulls else 1])
        dims = 3 if name == "lse" else 4
        for s in strides.get(name, [None] * dims):
            out += stride(s)
        out += bytes([n + 1])
    return out + run_tail(**tail)


def dense_tail(seed=1, **tail):
    """DenseRun::run: a seed byte for each of its nine tensors, then the host and backend."""
    return bytes(range(seed, seed + 9)) + run_tail(**tail)


def layout_seed(dtype=0, backward=True, heads=2, len_q=6, len_k=7, dims=(4, 3), block_q=4,
                block_k=64, layouts=1, shuffles=None, takes=None, visits=b"", reverse=False,
                edits=(), null=None, causal=False, **tail):
    """layout_fuzz: the params, the blocks, per layout and side a shuffle byte (with its swap
    bytes) and a tile fill, a byte per (query tile, key tile) pair (bit 0 skip, bit 1 all pairs,
    else two seed bytes of a mask), the backward order, the edits and a null array."""
    out = bytes([dtype, int(backward) | int(causal) << 2, 0, heads - 1])
    out += size(len_q) + size(len_k) + bytes(dims)
    out += bytes([block_q // 4 - 1]) if block_q % 4 == 0 and 4 <= block_q <= 256 else \
        bytes([0xF0]) + size(block_q)
    out += bytes([0]) if block_k == 64 else bytes([0xF0]) + size(block_k)
    out += bytes([layouts - 1])
    for side, (length, block) in enumerate([(len_q, block_q), (len_k, block_k)]):
        for l in range(layouts):
            if length > 320:
                out += bytes([0])  # no tiles: too many rows to lay out
                continue
            sh = (shuffles or {}).get((side, l), 0)
            out += bytes([sh]) + (bytes(range(3, 3 + max(length - 1, 0))) if sh else b"")
            take = (takes or {}).get((side, l), block)
            out += bytes([(take - 1) % 256])
    out += visits + bytes([int(reverse)])
    if edits:
        out += bytes([5, len(edits) - 1])
        for which, value, at in edits:
            out += bytes([which]) + (bytes([1]) + i32(value) if not 0 <= value + 8 < 256
                                     else bytes([2, value + 8]))
            out += bytes([at]) if which != 12 else b""
    else:
        out += bytes([0])
    out += bytes([0, null]) if null is not None else bytes([1])
    return out + dense_tail(**tail)


def grid(v):
    """window_fuzz's grid_size: 1..12 in one byte, else any size."""
    return bytes([v - 1]) if 1 <= v <= 12 else bytes([0xF0]) + size(v)


def window_seed(height=8, width=8, shape=0, rh=1, rw=1, sh=1, sw=1, drop=0, drops=b"",
                free=None, edits=(), dtype=0, backward=True, flags=0, extra=b"", layout=False,
                **tail):
    """window_fuzz: the grid, a rectangle (shape 0), diamond (1) or free offsets (3), edits, the
    params (`extra`: the sizes their flags read), the layout flag, the chooser's host, then the
    run."""
    out = grid(height) + grid(width) + bytes([shape])
    if shape % 4 < 3:
        out += bytes([rh, rw, sh - 1, sw - 1, drop]) + drops
    else:
        out += bytes([len(free)]) + b"".join(struct.pack("<bb", r, c) for r, c in free)
    if edits:
        out += bytes([5, len(edits) - 1])
        for at, what in edits:
            if isinstance(what, tuple):
                out += bytes([at, 1]) + i32(what[0]) + i32(what[1])
            else:
                out += bytes([at, 0, what])
    else:
        out += bytes([0])
    out += bytes([dtype, int(backward) | flags, 0, 0, 4, 3]) + extra
    return out + bytes([int(layout)]) + host() + dense_tail(**tail)


def side(v):
    """patterns_fuzz's grid side: 1..24 in one byte, else any size."""
    return bytes([v - 1]) if 1 <= v <= 24 else bytes([0xF0]) + size(v)


def pattern_grids(q_hw, kv_hw=None, pooled=False):
    out = side(q_hw[0]) + side(q_hw[1])
    if pooled:
        return out + bytes([1])
    if kv_hw is None:
        return out + bytes([0])
    return out + bytes([2]) + side(kv_hw[0]) + side(kv_hw[1])


def run_bits(dims=(4, 3), dtype=0):
    """After a valid pattern: the head widths (1..8) and the dtype."""
    return bytes([dims[0] - 1, dims[1] - 1, dtype])


def window_pattern_seed(q_hw=(8, 8), kv_hw=None, pooled=False, size_=3, metric=0, dilation=1,
                        border=0, heads=1, wild_heads=None, dtype=0, **tail):
    """patterns_fuzz with a Window: grids, size, metric, dilation, border, heads; when valid and
    small, the params of the run."""
    which = 0 if wild_heads is None else 4
    out = bytes([which]) + pattern_grids(q_hw, kv_hw, pooled)
    out += bytes([size_ - 1]) if 1 <= size_ <= 16 else bytes([0xF0]) + size(size_)
    out += bytes([metric])
    out += bytes([dilation - 1]) if 1 <= dilation <= 4 else bytes([0xF0]) + size(dilation)
    out += bytes([border])
    out += size(wild_heads) if wild_heads is not None else bytes([heads - 1])
    out += run_bits(dtype=dtype)
    # With offsets (a clip window on one grid): no layout beside, run, then the backward flag;
    # without: run, then the backward flag.
    same_grid = kv_hw is None and not pooled and border == 0
    out += bytes([0, 1, 1]) if same_grid else bytes([1, 1])
    return out + dense_tail(**tail)


def window1d_part(size_=5, dilation=1, causal=False):
    """draw_pattern's bytes for a Window1D."""
    return bytes([2, size_ - 1, 0, dilation - 1, int(causal)])


def random_part(per_row=1, block=8, seed=7, global_tokens=0):
    return bytes([3, 0, per_row, 0, block - 1]) + struct.pack("<Q", seed) + bytes([0, global_tokens])


def block_mask_part(block=(8, 8), rows=2, cols=2, bits=(1, 0, 1, 1)):
    """A one-head BlockMask whose entries match its shape (rows and cols up to 7)."""
    return bytes([4, 0, block[0] - 1, 0, block[1] - 1, 0, 0, rows, cols, 0]) + bytes(bits)


def combination_part(parts, union=True):
    return bytes([5, len(parts)]) + b"".join(parts) + bytes([int(union)])


def sequence_pattern_seed(part, q_hw=(1, 16), heads=2, **tail):
    """patterns_fuzz with an attn2d::Pattern (first byte 0x10): grids, the drawn pattern, heads,
    then the run."""
    out = bytes([0x10]) + pattern_grids(q_hw) + part + bytes([heads - 1])
    return out + run_bits() + bytes([1, 1]) + dense_tail(**tail)


def ylg_pattern_seed(q_hw=(8, 8), kv_hw=None, pooled=False, kinds=(0, 1, 2, 3), mapping=0,
                     with_heads=None, heads=None, **tail):
    """patterns_fuzz with a YLG: grids, kinds per head, mapping (or YLG::with_heads), heads."""
    which = 1 | (2 if with_heads is not None else 0) | (4 if heads is not None else 0)
    out = bytes([which]) + pattern_grids(q_hw, kv_hw, pooled)
    out += bytes([len(kinds)]) + bytes(kinds) + bytes([mapping])
    if with_heads is not None:
        out += size(with_heads) + bytes([mapping])
    if heads is not None:
        out += size(heads)
    return out + run_bits() + bytes([1, 1]) + dense_tail(**tail)


SEEDS = {
    "validate_fuzz": {
        "valid_float32_backward": validate_seed(backward=True),
        "valid_float64_bool_mask_broadcast_causal": validate_seed(
            dtype=1, mask=1, causal=True, backward=True,
            strides={"mask": [0, 0, None, None]}, backend="reference"),
        "valid_bfloat16_additive_channels_first": validate_seed(
            dtype=2, mask=2, backward=True, sizes=(2, 1, 6, 5, 3, 2),
            strides={"q": [18, 18, 1, 6], "k": [15, 15, 1, 5]}, backend="cpu", threads=2,
            order=1, pairs=True),
        "valid_float16_past_a_tile": validate_seed(
            dtype=3, sizes=(1, 1, 17, 71, 8, 8), backward=True, wild=True, stream=0),
        "valid_negative_and_zero_strides": validate_seed(
            strides={"q": [0, 0, -4, 1], "v": [0, 0, 3, -1]}, backward=True, threads=3, order=2),
        "valid_empty_batch_null_pointers": validate_seed(
            sizes=(0, 3, 5, 5, 4, 4), nulls=("q", "k", "v", "out", "lse"), backward=True),
        "valid_bfloat16_out_accum_backward": validate_seed(
            dtype=2, backward=True, out_accum=True, nulls=("out",)),
        "invalid_float32_out_accum": validate_seed(out_accum=True),
        "out_of_memory": validate_seed(backward=True, fail_at=0),
        "invalid_negative_len_q": validate_seed(sizes=(1, 1, -1, 4, 2, 2)),
        "invalid_null_q": validate_seed(nulls=("q",)),
        "invalid_nan_scale": validate_seed(scale_=float("nan")),
        "invalid_dtype_and_mask_kind": validate_seed(dtype=5, mask=3),
        "invalid_null_lse_backward": validate_seed(backward=True, nulls=("lse",)),
        "huge_sizes": validate_seed(sizes=(1, 1, 1 << 40, 1 << 40, 1 << 20, 3)),
    },
    "layout_fuzz": {
        "valid_one_layout_masked": layout_seed(
            takes={(0, 0): 4}, visits=bytes([0x02, 0x00, 0x11, 0x22])),
        "valid_two_layouts_shuffled_reversed": layout_seed(
            dtype=1, heads=3, len_q=20, len_k=71, block_q=8, layouts=2,
            shuffles={(0, 0): 5, (1, 1): 7}, takes={(0, 0): 6, (0, 1): 8, (1, 0): 40},
            visits=bytes([0x00, 1, 2, 0x02, 0x01, 0x06, 0x00, 3, 4, 0x02, 0x00, 5, 6, 0x01,
                          0x02, 0x00, 7, 8, 0x02, 0x00, 9, 9, 0x02, 0x02, 0x00, 1, 1]),
            reverse=True),
        "valid_float32_query_lanes": layout_seed(
            len_q=33, len_k=65, block_q=16, takes={(0, 0): 16},
            visits=bytes([0x02, 0x00, 1, 2, 0x00, 3, 4, 0x02, 0x00, 5, 6, 0x02])),
        "invalid_duplicate_query_row": layout_seed(
            takes={(0, 0): 4}, visits=bytes([0x02, 0x02]), edits=[(1, 0, 1)]),
        "invalid_block_k": layout_seed(block_k=32, visits=bytes([0x02, 0x02])),
        "invalid_decreasing_tile_ranges": layout_seed(
            len_q=20, layouts=2, takes={(0, 0): 4, (0, 1): 4},
            visits=bytes([0x02] * 10), edits=[(3, 12, 1)]),
        "invalid_visit_offsets": layout_seed(
            takes={(0, 0): 4}, visits=bytes([0x02, 0x02]), edits=[(5, 7, 1)]),
        "invalid_mask_index": layout_seed(
            takes={(0, 0): 4}, visits=bytes([0x00, 1, 1, 0x02]), edits=[(7, 9, 0)]),
        "invalid_null_rows": layout_seed(takes={(0, 0): 4}, visits=bytes([0x02, 0x02]),
                                         null=1),
        "invalid_causal": layout_seed(causal=True, visits=bytes([0x02, 0x02])),
        "invalid_huge_len_q": layout_seed(len_q=1 << 40, visits=b""),
    },
    "window_fuzz": {
        "valid_3x3_on_8x8": window_seed(),
        "valid_7x7_dilated_on_12x12_float64": window_seed(
            height=12, width=12, rh=3, rw=3, sh=2, sw=2, dtype=1),
        "valid_diamond_bfloat16_with_layout": window_seed(
            height=12, width=10, shape=1, rh=3, rw=3, dtype=2, layout=True),
        "valid_sparse_square_float16": window_seed(
            height=9, width=11, rh=2, rw=4, drop=200, drops=bytes(range(0, 250, 5)), dtype=3),
        "valid_free_offsets": window_seed(
            height=5, width=9, shape=3, free=[(0, 0), (1, 3), (-2, -1), (4, 8), (0, -8)]),
        "valid_wide_pitched_rows": window_seed(height=3, width=12, rh=1, rw=5, stream=0),
        "invalid_repeated_offset": window_seed(edits=[(0, 4)]),
        "invalid_offset_outside": window_seed(edits=[(2, (9, 0))]),
        "invalid_len_k": window_seed(flags=4, extra=size(63)),
        "invalid_causal": window_seed(flags=8),
        "invalid_no_offsets": window_seed(flags=0x40, extra=bytes([0])),
        "invalid_huge_grid": window_seed(height=1 << 32, width=1 << 32, extra=size(16)),
    },
    "patterns_fuzz": {
        "window_7x7_on_16x16": window_pattern_seed(q_hw=(16, 16), size_=7),
        "window_diamond_dilated_float64": window_pattern_seed(
            q_hw=(12, 10), size_=5, metric=1, dilation=2, dtype=1),
        "window_disk_pooled_keys": window_pattern_seed(q_hw=(16, 16), pooled=True, size_=5,
                                                       metric=2),
        "window_shift_two_heads": window_pattern_seed(q_hw=(9, 9), size_=3, border=1, heads=2),
        "window_on_other_grid": window_pattern_seed(q_hw=(6, 10), kv_hw=(5, 7), size_=3),
        "ylg_four_heads": ylg_pattern_seed(q_hw=(8, 8)),
        "ylg_geometric_pooled": ylg_pattern_seed(q_hw=(16, 16), pooled=True, kinds=(2, 3),
                                                 mapping=1),
        "ylg_with_heads_8": ylg_pattern_seed(q_hw=(6, 6), with_heads=8),
        "invalid_window_size_0": window_pattern_seed(size_=0),
        "invalid_window_too_large": window_pattern_seed(q_hw=(4, 4), size_=9, dilation=3),
        "invalid_shift_manhattan": window_pattern_seed(metric=1, border=1),
        "invalid_unknown_metric_border": window_pattern_seed(metric=3, border=2),
        "invalid_huge_dilation": window_pattern_seed(dilation=1 << 62),
        "invalid_window_heads": window_pattern_seed(wild_heads=-3),
        "invalid_grid_past_int32": window_pattern_seed(q_hw=(1 << 20, 1 << 20)),
        "invalid_ylg_unknown_kind": ylg_pattern_seed(kinds=(0, 4), mapping=2),
        "invalid_ylg_heads_mismatch": ylg_pattern_seed(heads=3),
        "invalid_ylg_no_heads": ylg_pattern_seed(kinds=()),
        "window1d_causal": sequence_pattern_seed(window1d_part(5, 2, True), q_hw=(1, 20)),
        "random_with_global_tokens": sequence_pattern_seed(random_part(1, 4, 99, 2)),
        "block_mask": sequence_pattern_seed(block_mask_part()),
        "union_window1d_random": sequence_pattern_seed(
            combination_part([window1d_part(3), random_part(1, 8, 3, 0)]), q_hw=(4, 8)),
        "intersection_block_mask_window1d": sequence_pattern_seed(
            combination_part([block_mask_part(), window1d_part(7)], union=False)),
        "invalid_block_mask_shape": sequence_pattern_seed(block_mask_part(rows=3, cols=3)),
        "invalid_empty_union": sequence_pattern_seed(combination_part([])),
    },
}


def main():
    for target, seeds in SEEDS.items():
        folder = HERE / "corpus" / target
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.iterdir():
            old.unlink()
        for name, data in seeds.items():
            (folder / name).write_bytes(data)
        print(f"{target}: {len(seeds)} seeds in {folder.relative_to(HERE.parent.parent)}")


if __name__ == "__main__":
    main()
