"""Limits: workspace requests the host refuses raise MemoryError with the size asked, and a
tensor past 2^31 elements is addressed with 64-bit offsets. (Batch x heads past 65,535:
test_threads.py.)"""

from __future__ import annotations

import re

import pytest
import torch

import attn2d
from attn2d.patterns import YLG
from reference import naive_attention


@pytest.fixture
def restore_workspace_limit():
    yield
    attn2d.set_workspace_limit(None)


def _backward(q, k, v, **kw):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    attn2d.attention(q, k, v, **kw).sum().backward()
    return q.grad


def test_a_refused_workspace_raises_memory_error_with_its_size(restore_workspace_limit):
    """Raising the limit to each size a MemoryError names lets that request through, until the
    forward and backward (raised inside the autograd engine) both run, with the same bits."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 200, 16) for _ in range(3))
    want = _backward(q, k, v)
    limit, asked = 0, []
    while True:
        attn2d.set_workspace_limit(limit)
        assert attn2d.workspace_limit() == limit
        try:
            got = _backward(q, k, v)
            break
        except MemoryError as e:
            size = int(re.search(r"could not allocate (\d+) bytes of workspace", str(e)).group(1))
            assert size > limit and len(asked) < 4, (size, limit, asked)
            asked.append(size)
            limit = size
    assert asked and torch.equal(got, want)
    attn2d.set_workspace_limit(max(asked) - 1)
    with pytest.raises(MemoryError, match=f"allocate {max(asked)} bytes"):
        _backward(q, k, v)
    attn2d.set_workspace_limit(None)
    assert attn2d.workspace_limit() is None


def test_a_refused_workspace_on_a_pattern_raises_memory_error(restore_workspace_limit):
    x = torch.randn(1, 8, 16, 16, 16)
    attn2d.set_workspace_limit(0)
    with pytest.raises(MemoryError, match="bytes of workspace"):
        q = x.clone().requires_grad_()
        attn2d.attention2d(q, x, x, pattern=YLG(8)).sum().backward()


@pytest.mark.parametrize("bad,exc", [(-1, ValueError), (1.5, TypeError), (True, TypeError),
                                     ("1", TypeError)])
def test_set_workspace_limit_checks_its_argument(bad, exc):
    with pytest.raises(exc, match="limit_bytes"):
        attn2d.set_workspace_limit(bad)


def test_output_past_2_to_the_31_elements():
    """out of 65,537 x 32,768 = 2^31 + 32,768 bfloat16 elements (4 GiB): heads past 65,536
    write at element offsets past 2^31. q and k vary by head, v is one (2, Ev) tensor expanded
    over the heads (stride 0), so each head's output mixes v's two rows in its own proportion."""
    H, Ev, E = 65537, 32768, 8
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, H, 1, E, generator=gen).bfloat16()
    k = torch.randn(1, H, 2, E, generator=gen).bfloat16()
    v = torch.randn(1, 1, 2, Ev, generator=gen).bfloat16().expand(1, H, 2, Ev)
    assert v.numel() > 2**31 and v.stride(1) == 0
    with torch.no_grad():
        out = attn2d.attention(q, k, v)
    assert out.shape == (1, H, 1, Ev) and out.numel() > 2**31
    for h in (0, 1, 65535, 65536):  # 65536 * 32768 = 2^31: the last head starts past it
        want = naive_attention(q[:, h:h + 1], k[:, h:h + 1], v[:, h:h + 1])
        assert (out[:, h:h + 1].double() - want).abs().max() <= 2**-7 * want.abs().max(), h
