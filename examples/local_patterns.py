"""Local and sparse attention between pixels: what each pattern lets a query see, a check of the
fused kernels against dense-masked attention, and the YLG-SAGAN block beside the SAGAN one.

    .venv/bin/python examples/local_patterns.py [--res 64] [--channels 64]

attn2d.attention2d(q, k, v, pattern=...) takes q (B, heads, Hq, Wq, E) and k, v (B, heads, Hk,
Wk, E | Ev); each query pixel attends only to the keys its pattern allows, in time and memory
proportional to those keys. pattern.dense_mask(...) shows the same pattern as a dense boolean
mask (heads, Hq*Wq, Hk*Wk), for inspection.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

import attn2d
from attn2d.bench import paired_speedup, time_training_steps
from attn2d.patterns import YLG, Window


def picture(mask_row: torch.Tensor, kv_hw: tuple[int, int], centre: int) -> list[str]:
    """One query's keys as text: Q the query's own key pixel, # another allowed key."""
    allowed = mask_row.view(kv_hw)
    rows = []
    for i in range(kv_hw[0]):
        row = ""
        for j in range(kv_hw[1]):
            here = i * kv_hw[1] + j == centre
            row += ("Q" if allowed[i, j] else "q") if here else ("#" if allowed[i, j] else ".")
        rows.append(row)
    return rows


def keys(mask_row: torch.Tensor) -> str:
    n = int(mask_row.sum())
    return f"{n} key" + ("" if n == 1 else "s")


def show_patterns() -> None:
    side = 11
    hw = (side, side)
    middle, corner = (side // 2) * side + side // 2, side + 1
    cases = [
        ("Window(7)", Window(7), middle),
        ('Window(7, "manhattan")', Window(7, "manhattan"), middle),
        ('Window(7, "euclidean")', Window(7, "euclidean"), middle),
        ("Window(3, dilation=2)", Window(3, dilation=2), middle),
        ("Window(5) near a corner", Window(5), corner),
        ('Window(5, border="shift") near a corner', Window(5, border="shift"), corner),
    ]
    for name, pattern, query in cases:
        row = pattern.dense_mask(hw, hw, 1)[0, query]
        print(f"{name}: {keys(row)}")
        print("\n".join("    " + r for r in picture(row, hw, query)))
    # YLG over an 8x8 key grid: head h's pattern for query 27 (pixel (3, 3)).
    ylg, kv = YLG(4), (8, 8)
    mask = ylg.dense_mask(kv, kv)
    for h, name in enumerate(ylg.patterns):
        print(f"YLG head {h} ({name}), query (3, 3): {keys(mask[h, 27])}")
        print("\n".join("    " + r for r in picture(mask[h, 27], kv, 27)))


def check_against_dense_mask() -> None:
    """Outputs and gradients of the fused kernels against SDPA's math path under the dense
    mask, in float64, on a prime-sided map and on pooled keys."""
    cases = [
        (Window(7, "manhattan"), (13, 17), (13, 17), 2),
        (Window(5, dilation=2, border="shift"), (13, 17), (13, 17), 2),
        (Window(5, "euclidean"), (26, 34), (13, 17), 2),  # keys pooled 2x2
        (YLG(4), (16, 16), (8, 8), 4),
    ]
    for pattern, q_hw, kv_hw, heads in cases:
        q = torch.randn(2, heads, *q_hw, 8, dtype=torch.float64, requires_grad=True)
        k = torch.randn(2, heads, *kv_hw, 8, dtype=torch.float64, requires_grad=True)
        v = torch.randn(2, heads, *kv_hw, 5, dtype=torch.float64, requires_grad=True)
        grad = torch.randn(2, heads, *q_hw, 5, dtype=torch.float64)
        ours = attn2d.attention2d(q, k, v, pattern=pattern)
        mask = pattern.dense_mask(q_hw, kv_hw, heads)
        dense = F.scaled_dot_product_attention(q.flatten(2, 3), k.flatten(2, 3), v.flatten(2, 3),
                                               attn_mask=mask).unflatten(2, q_hw)
        errs = [float((ours - dense).detach().abs().max())]
        for a, b in zip(torch.autograd.grad(ours, (q, k, v), grad),
                        torch.autograd.grad(dense, (q, k, v), grad)):
            errs.append(float((a - b).abs().max()))
        print(f"{pattern!r} {q_hw} over {kv_hw}: largest error of out, dq, dk, dv against "
              f"dense-masked attention {max(errs):.1e}")
        # float64 sums in different orders: ~1e-15; a wrong key set is off by O(1).
        if max(errs) > 1e-10:
            raise SystemExit(f"{pattern!r}: the fused kernel disagrees with its dense mask")


def sagan_beside_ylg_sagan(res: int, channels: int) -> None:
    """A training step (forward and backward) of the SAGAN block (global attention over 2x2
    pooled keys) and of the YLG-SAGAN block (8 heads of ESA patterns over the same keys)."""
    x = torch.randn(1, channels, res, res)
    sagan = attn2d.nn.SelfAttention2d(channels)
    ylg_sagan = attn2d.nn.SelfAttention2d(channels, heads=8, pattern=YLG(8))
    # attn2d's own timing loop: the two blocks interleaved rep by rep, medians of 5.
    a, b = time_training_steps([sagan, ylg_sagan], [x], reps=5)
    print(f"{res}x{res}, {channels} channels, forward + backward (medians of 5): SAGAN "
          f"{1e3 * a['fwd_bwd_s']:.1f} ms, YLG-SAGAN {1e3 * b['fwd_bwd_s']:.1f} ms "
          f"(time ratio SAGAN / YLG-SAGAN, paired by rep: forward "
          f"{paired_speedup(a, b, 'forward'):.2f}, backward {paired_speedup(a, b, 'backward'):.2f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--res", type=int, default=64, help="map side of the block comparison")
    ap.add_argument("--channels", type=int, default=64,
                    help="channels of the block comparison (a multiple of 64: 8 heads of C/8)")
    args = ap.parse_args()
    if args.res < 2 or args.res % 2:
        ap.error(f"--res must be an even number >= 2 (keys are pooled 2x2); got {args.res}")
    if args.channels < 64 or args.channels % 64:
        ap.error(f"--channels must be a positive multiple of 64; got {args.channels}")
    torch.manual_seed(0)
    show_patterns()
    check_against_dense_mask()
    sagan_beside_ylg_sagan(args.res, args.channels)


if __name__ == "__main__":
    main()
