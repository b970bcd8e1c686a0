"""Saves attn2d's outputs and gradients over a fixed set of cases, or compares them bit for bit
with a saved set: a refactor of the kernels must leave every bit where it was.

    python scripts/compare_outputs.py save FILE      # with the build before the change
    python scripts/compare_outputs.py compare FILE   # with the build after it

The cases cover every kernel family: dense tiles (both backward schedules, masks, causal,
channels-first views), the window kernels (blocked rows and whole heads), block-sparse tiles
and query lanes (pooled keys, border "shift", YLG), in float32 and float64, and bfloat16 on
the dense and window kernels. Two threads, fixed seeds.
"""

from __future__ import annotations

import sys

import torch

import attn2d
from attn2d.patterns import YLG, Window


def _grid(seed, b, h, hq, wq, hk, wk, e, ev, dtype, channels_first=False):
    g = torch.Generator().manual_seed(seed)

    def make(hh, ww, width):
        if channels_first:
            # An NCHW conv output viewed as (B, heads, H, W, width) without a copy.
            x = torch.randn(b, h * width, hh, ww, generator=g, dtype=torch.float64)
            return x.to(dtype).view(b, h, width, hh, ww).permute(0, 1, 3, 4, 2)
        return torch.randn(b, h, hh, ww, width, generator=g, dtype=torch.float64).to(dtype)

    return make(hq, wq, e), make(hk, wk, e), make(hk, wk, ev)


def _dense(seed, b, h, lq, lk, e, ev, dtype):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, n, w, generator=g, dtype=torch.float64).to(dtype)
                 for n, w in ((lq, e), (lk, e), (lk, ev)))


def _run(fn, tensors, seed):
    leaves = [t.detach().requires_grad_(True) for t in tensors]
    out = fn(*leaves)
    g = torch.Generator().manual_seed(seed + 1)
    dout = torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.dtype)
    out.backward(dout)
    return [out.detach().clone()] + [t.grad.detach().clone() for t in leaves]


def cases():
    """(name, thunk) pairs; each thunk returns [out, dq, dk, dv]."""
    out = []
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        dn = str(dtype).replace("torch.", "")
        dense = [
            ("whole heads", (2, 4, 37, 53, 24, 40), {}),
            ("split heads", (1, 1, 700, 650, 16, 16), {}),
            ("odd widths", (1, 3, 29, 31, 7, 5), {}),
            ("causal", (2, 2, 61, 61, 32, 32), {"is_causal": True}),
        ]
        for i, (name, shape, kw) in enumerate(dense):
            ts = _dense(10 + i, *shape, dtype)
            out.append((f"dense {name} {dn}",
                        lambda ts=ts, kw=kw, s=10 + i: _run(
                            lambda q, k, v: attn2d.attention(q, k, v, **kw), ts, s)))
        ts = _dense(20, 2, 3, 41, 43, 16, 24, dtype)
        mask = torch.rand(2, 1, 41, 43, generator=torch.Generator().manual_seed(21)) > 0.3
        mask[0, 0, 5] = False
        out.append((f"dense bool mask {dn}", lambda ts=ts, m=mask: _run(
            lambda q, k, v: attn2d.attention(q, k, v, attn_mask=m), ts, 20)))
        if dtype == torch.bfloat16:
            patterns = [("window 15 chebyshev 32x32", Window(15), (32, 32), (32, 32), 16, 16),
                        ("window 9 dilation 2 20x20", Window(9, "manhattan", dilation=2),
                         (20, 20), (20, 20), 16, 16)]
        else:
            patterns = [
                ("window 15 chebyshev 32x32", Window(15), (32, 32), (32, 32), 16, 16),
                ("window 7 chebyshev 28x28", Window(7), (28, 28), (28, 28), 16, 16),
                ("window 9 dilation 2 20x20", Window(9, "manhattan", dilation=2),
                 (20, 20), (20, 20), 8, 24),
                ("window 5 euclidean 13x17", Window(5, "euclidean"), (13, 17), (13, 17), 7, 9),
                ("window 11 over 5x23 (tiles)", Window(11), (5, 23), (5, 23), 16, 16),
                ("window 7 pooled keys", Window(7), (24, 24), (12, 12), 16, 16),
                ("window 7 shift", Window(7, border="shift"), (19, 23), (19, 23), 16, 32),
                ("ylg 8 heads 16x16 over 8x8", YLG(8), (16, 16), (8, 8), 16, 16),
                ("ylg 8 heads 16x16 over 8x8 e8", YLG(8), (16, 16), (8, 8), 8, 32),
            ]
        for i, (name, pat, qhw, khw, e, ev) in enumerate(patterns):
            heads = 8 if isinstance(pat, YLG) else 2
            for cf in (False, True):
                ts = _grid(100 + i, 2, heads, *qhw, *khw, e, ev, dtype, channels_first=cf)
                tag = " channels-first" if cf else ""
                out.append((f"{name}{tag} {dn}", lambda ts=ts, p=pat, s=100 + i: _run(
                    lambda q, k, v: attn2d.attention2d(q, k, v, pattern=p), ts, s)))
        ts = _grid(200, 1, 2, 9, 11, 9, 11, 16, 16, dtype)
        out.append((f"global 9x11 {dn}", lambda ts=ts: _run(
            lambda q, k, v: attn2d.attention2d(q, k, v), ts, 200)))
    return out


def main(argv):
    if len(argv) != 3 or argv[1] not in ("save", "compare"):
        print(__doc__)
        return 2
    torch.set_num_threads(2)
    results = {}
    for name, thunk in cases():
        results[name] = thunk()
    if argv[1] == "save":
        torch.save(results, argv[2])
        print(f"saved {len(results)} cases to {argv[2]} (attn2d at {attn2d.__file__})")
        return 0
    saved = torch.load(argv[2])
    names = ("out", "dq", "dk", "dv")
    differ = 0
    for name, tensors in results.items():
        if name not in saved:
            print(f"MISSING from the saved set: {name}")
            differ += 1
            continue
        for what, new, old in zip(names, tensors, saved[name]):
            if not torch.equal(new, old):
                diff = (new.double() - old.double()).abs().max().item()
                print(f"DIFFER {name} {what}: max abs difference {diff:.3g}")
                differ += 1
    print(f"{len(results)} cases, {4 * len(results)} tensors: "
          f"{'all bitwise equal' if differ == 0 else f'{differ} differ'}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
