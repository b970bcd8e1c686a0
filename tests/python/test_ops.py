"""torch.library integration: gradcheck, opcheck, torch.compile, and error messages."""

from __future__ import annotations

import pytest
import torch

import attn2d
from attn2d.patterns import YLG, Window


def _inputs(B=2, H=2, Lq=9, Lk=13, E=5, Ev=3, dtype=torch.float64):
    return tuple(
        torch.randn(shape, dtype=dtype, requires_grad=True)
        for shape in ((B, H, Lq, E), (B, H, Lk, E), (B, H, Lk, Ev))
    )


@pytest.mark.parametrize("variant", ["plain", "strided", "bool_mask", "float_mask", "causal"])
def test_gradcheck_float64(variant):
    q, k, v = _inputs()
    kwargs = {}
    if variant == "strided":
        q = torch.randn(2, 9, 2, 5, dtype=torch.float64).transpose(1, 2).requires_grad_()
        k = torch.randn(2, 2, 5, 13, dtype=torch.float64).transpose(-1, -2).requires_grad_()
    elif variant == "bool_mask":
        mask = torch.rand(9, 13) < 0.6
        mask[2] = False  # a fully masked row
        kwargs["attn_mask"] = mask
    elif variant == "float_mask":
        kwargs["attn_mask"] = torch.randn(2, 1, 9, 13, dtype=torch.float64)
    elif variant == "causal":
        kwargs["is_causal"] = True
    assert torch.autograd.gradcheck(
        lambda a, b, c: attn2d.attention(a, b, c, **kwargs), (q, k, v), eps=1e-6, atol=1e-8
    )


@pytest.mark.parametrize("with_mask", [False, True])
def test_opcheck(with_mask):
    q, k, v = _inputs(dtype=torch.float32)
    mask = (torch.rand(9, 13) < 0.7) if with_mask else None
    torch.library.opcheck(
        torch.ops.attn2d.attention_forward.default, (q, k, v, mask, False, 0.3)
    )
    out, lse, _ = torch.ops.attn2d.attention_forward(q, k, v, mask, False, 0.3)
    grad = torch.randn_like(out)
    torch.library.opcheck(
        torch.ops.attn2d.attention_backward.default,
        (grad, q.detach(), k.detach(), v.detach(), out.detach(), lse, mask, False, 0.3),
    )


@pytest.mark.parametrize("pattern", ["global", Window(3, "manhattan"), YLG(2)],
                         ids=["global", "window", "tiles"])
def test_torch_compile_fullgraph_forward_and_backward(pattern):
    # Each forward operator's autograd (C++, binding/torch_autograd.cc) traced by AOTAutograd.
    torch._dynamo.reset()

    if pattern == "global":
        def block(q, k, v):
            return attn2d.attention(q * 2.0, k, v, is_causal=True).sin()

        q, k, v = _inputs(dtype=torch.float32)
    else:
        def block(q, k, v):
            return attn2d.attention2d(q * 2.0, k, v, pattern=pattern).sin()

        q, k, v = (torch.randn(2, 2, 5, 7, 4, requires_grad=True) for _ in range(3))
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    out = compiled(q, k, v)
    out.sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    block(q, k, v).sum().backward()
    assert torch.allclose(out, block(q, k, v))
    for g, t in zip(grads, (q, k, v)):
        assert torch.allclose(g, t.grad)


def test_opcheck_sparse_layout_forward():
    from attn2d import _compiled_layout

    q, k, v = (torch.randn(1, 2, 36, 8, requires_grad=True) for _ in range(3))
    layout = list(_compiled_layout.build(YLG(2), (6, 6), (6, 6), 2))
    torch.library.opcheck(torch.ops.attn2d.attention2d_forward.default,
                          (q, k, v, layout, _compiled_layout.BLOCK_Q, 0.35))


def test_raw_sparse_op_checks_the_layout():
    """The layout is a list of tensors anyone can pass to torch.ops.attn2d.attention2d_forward:
    wrong count, dtype or sizes must raise, not read past the end of a tensor."""
    from attn2d import _compiled_layout

    q, k, v = (torch.randn(1, 2, 36, 8) for _ in range(3))
    good = list(_compiled_layout.build(YLG(2), (6, 6), (6, 6), 2))
    op = torch.ops.attn2d.attention2d_forward

    def run(layout):
        return op(q, k, v, layout, _compiled_layout.BLOCK_Q, 0.35)

    run(good)
    with pytest.raises(ValueError, match="must hold"):
        run(good[:-1])
    with pytest.raises(ValueError, match="layout tensor 1 must be a contiguous CPU"):
        run([good[0], good[1].int()] + good[2:])
    # Each of these breaks one size the kernels rely on; the last elements of the offset
    # tensors (1, 2, 5, 8) are checked against the tile counts and the list lengths.
    for i, bad in ((1, good[1][:1]), (1, good[1] + 1), (2, good[2] + 1), (5, good[5] + 1),
                   (6, good[6][:-1]), (8, good[8] + 1), (9, good[9][:-1]), (4, good[4][:-1])):
        layout = list(good)
        layout[i] = bad.contiguous()
        with pytest.raises(ValueError, match="inconsistent sizes"):
            run(layout)


def _graph_nodes(fn):
    seen, todo = [], [fn]
    while todo:
        node = todo.pop()
        if node is not None and node not in seen:
            seen.append(node)
            todo.extend(n for n, _ in node.next_functions)
    return seen


@pytest.mark.parametrize("entry,pattern,backward_op", [
    ("attention", None, "attention_backward"),
    ("attention2d", None, "attention_backward"),
    ("attention2d", Window(3, "manhattan"), "attention2d_window_backward"),
    ("attention2d", Window(3, border="shift"), "attention2d_backward"),  # on the tiled layout
], ids=["attention", "attention2d-global", "attention2d-window", "attention2d-tiles"])
def test_each_backward_op_has_a_double_backward_matching_naive_attention(entry, pattern,
                                                                        backward_op):
    from reference import naive_attention

    if entry == "attention":
        q, k, v = _inputs()
        grid = None
    else:
        q, k, v = (torch.randn(1, 2, 6, 7, 4, dtype=torch.float64, requires_grad=True)
                   for _ in range(3))
        grid = (6, 7)

    def run(naive: bool):
        if not naive:
            out = (attn2d.attention(q, k, v) if grid is None
                   else attn2d.attention2d(q, k, v, pattern=pattern))
        elif grid is None:
            out = naive_attention(q, k, v)
        else:
            mask = None if pattern is None else pattern.dense_mask(grid, grid, 2)
            out = naive_attention(q.flatten(2, 3), k.flatten(2, 3), v.flatten(2, 3),
                                  attn_mask=mask).unflatten(2, grid)
        (gq,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
        return gq, torch.autograd.grad(gq.pow(2).sum(), (q, k, v))

    gq, ours = run(naive=False)
    # The gradient's graph holds the backward op this case is meant to cover.
    assert any(f"attn2d_{backward_op}_default" in type(n).__name__
               for n in _graph_nodes(gq.grad_fn))
    for a, b in zip(ours, run(naive=True)[1]):
        assert (a - b).abs().max() < 1e-10


@pytest.mark.parametrize("pattern", [None, Window(3, "manhattan"), Window(3, border="shift")],
                         ids=["global", "window", "tiles"])
def test_backward_fills_no_zero_gradient_for_the_log_sum_exp(pattern):
    # lse is an output no loss can reach; a materialized zero gradient for it would be a
    # (B, H, Lq) tensor allocated and filled every step. The step's only fill or zeroing op
    # would be that one: the output gradient is made beforehand.
    from torch.profiler import ProfilerActivity, profile

    q, k, v = (torch.randn(2, 4, 6, 7, 8, requires_grad=True) for _ in range(3))
    out = attn2d.attention2d(q, k, v, pattern=pattern)
    grad_out = torch.randn_like(out)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        grads = torch.autograd.grad(out, (q, k, v), grad_out)
    ops = {e.key for e in prof.key_averages()}
    assert any(op.startswith("attn2d::") and op.endswith("_backward") for op in ops), ops
    assert not ops & {"aten::zeros", "aten::zero_", "aten::fill_", "aten::zeros_like"}, ops
    assert all(torch.isfinite(g).all() for g in grads)


def _good():
    return torch.randn(2, 3, 5, 4), torch.randn(2, 3, 7, 4), torch.randn(2, 3, 7, 6)


BAD_INPUTS = [
    # (description, args, kwargs, exception, words the message must contain)
    ("q rank 3", lambda q, k, v: (q[0], k, v), {}, ValueError, ["q", "4-D"]),
    ("k rank 5", lambda q, k, v: (q, k[None], v), {}, ValueError, ["k", "4-D"]),
    ("batch mismatch", lambda q, k, v: (q, k[:1], v[:1]), {}, ValueError, ["k", "batch"]),
    ("heads mismatch", lambda q, k, v: (q, k[:, :2], v[:, :2]), {}, ValueError, ["k", "heads"]),
    ("E mismatch", lambda q, k, v: (q, k[..., :3], v), {}, ValueError, ["k", "E"]),
    ("Lk mismatch", lambda q, k, v: (q, k, v[:, :, :6]), {}, ValueError, ["v", "Lk"]),
    ("int dtype", lambda q, k, v: (q.long(), k.long(), v.long()), {}, TypeError, ["q", "float32"]),
    ("mixed dtypes", lambda q, k, v: (q, k.double(), v), {}, TypeError, ["k", "dtype"]),
    ("bf16 mixed with f32", lambda q, k, v: (q.bfloat16(), k, v), {}, TypeError,
     ["k", "bfloat16"]),
    ("bf16 with f64 mask", lambda q, k, v: (q.bfloat16(), k.bfloat16(), v.bfloat16()),
     {"attn_mask": torch.zeros(7, 9, dtype=torch.float64)}, TypeError, ["attn_mask", "float32"]),
    ("not a tensor", lambda q, k, v: (q.tolist(), k, v), {}, TypeError, ["q", "Tensor"]),
    ("meta device", lambda q, k, v: (q.to("meta"), k.to("meta"), v.to("meta")), {}, ValueError,
     ["q", "CPU"]),
    ("mask wrong shape", lambda q, k, v: (q, k, v), {"attn_mask": torch.ones(5, 6, dtype=torch.bool)},
     ValueError, ["attn_mask", "broadcast"]),
    ("mask rank 5", lambda q, k, v: (q, k, v), {"attn_mask": torch.ones(1, 2, 3, 5, 7, dtype=torch.bool)},
     ValueError, ["attn_mask"]),
    ("mask int", lambda q, k, v: (q, k, v), {"attn_mask": torch.ones(5, 7, dtype=torch.int32)},
     TypeError, ["attn_mask", "bool"]),
    ("mask float64 vs float32", lambda q, k, v: (q, k, v), {"attn_mask": torch.zeros(5, 7, dtype=torch.float64)},
     TypeError, ["attn_mask"]),
    ("scale inf", lambda q, k, v: (q, k, v), {"scale": float("inf")}, ValueError, ["scale"]),
    ("scale str", lambda q, k, v: (q, k, v), {"scale": "1"}, TypeError, ["scale"]),
    ("is_causal int", lambda q, k, v: (q, k, v), {"is_causal": 1}, TypeError, ["is_causal"]),
]


@pytest.mark.parametrize("case", BAD_INPUTS, ids=lambda c: c[0])
def test_bad_input_raises_a_clear_error(case):
    _, make_args, kwargs, exc, words = case
    with pytest.raises(exc) as info:
        attn2d.attention(*make_args(*_good()), **kwargs)
    for word in words:
        assert word in str(info.value), str(info.value)


@pytest.mark.parametrize("case", [c for c in BAD_INPUTS if c[0] not in (
    "not a tensor", "scale str", "is_causal int", "bf16", "meta device")], ids=lambda c: c[0])
def test_the_raw_op_checks_its_input_too(case):
    """torch.ops.attn2d.* is public as well: the C++ binding raises the same kinds of error.
    (Meta tensors are left out: on the raw op they rightly go to the fake kernel.)"""
    _, make_args, kwargs, exc, words = case
    q, k, v = make_args(*_good())
    with pytest.raises(exc) as info:
        torch.ops.attn2d.attention_forward(
            q, k, v, kwargs.get("attn_mask"), False, kwargs.get("scale", 0.5)
        )
    assert words[0] in str(info.value), str(info.value)


def test_mask_that_requires_grad_is_refused():
    q, k, v = _inputs()
    mask = torch.zeros(9, 13, dtype=torch.float64, requires_grad=True)
    with pytest.raises(ValueError, match="attn_mask"):
        attn2d.attention(q, k, v, attn_mask=mask)
    # Under no_grad no gradient is asked for: the mask is read as it is.
    with torch.no_grad():
        out = attn2d.attention(q, k, v, attn_mask=mask)
    assert torch.equal(out, attn2d.attention(q, k, v, attn_mask=mask.detach()).detach())


def test_backward_op_checks_shapes():
    q, k, v = _inputs(dtype=torch.float32)
    out, lse, _ = torch.ops.attn2d.attention_forward(q, k, v, None, False, 0.5)
    with pytest.raises(ValueError, match="grad_out"):
        torch.ops.attn2d.attention_backward(out[:, :, :3], q, k, v, out, lse, None, False, 0.5)
    with pytest.raises(ValueError, match="lse"):
        torch.ops.attn2d.attention_backward(out, q, k, v, out, lse[:1], None, False, 0.5)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_kernels_run_on_every_torch_thread(threads):
    # OpenMP creates the requested threads whatever the machine's core count, so this holds on
    # one core too; a binding built without OpenMP would run every task on thread 0.
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        assert torch.ops.attn2d.host_threads_used(64) == threads
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="tasks must be"):
        torch.ops.attn2d.host_threads_used(0)
