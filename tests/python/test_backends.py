"""The backend chooser (attn2d/backends.py) and attn2d.use_backend: each decision on CPU and on
CUDA (tensors of a FakeTensorMode on a "cuda" device where this machine has none), and a clear
error for every call a backend cannot take."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import attn2d
from attn2d import backends
from attn2d.patterns import Window


def _cuda(*shapes, dtype=torch.float32):
    with FakeTensorMode(allow_non_fake_inputs=True):
        return [torch.empty(s, device="cuda", dtype=dtype) for s in shapes]


def _sagan():
    """SAGAN's head: E = 8 (q, k), Ev = 64 (v), keys pooled 2x2."""
    return _cuda((2, 1, 4096, 8), (2, 1, 1024, 8), (2, 1, 1024, 64))


@pytest.fixture
def compiled_triton(monkeypatch):
    """A CUDA machine: triton importable, kernels compiled (not interpreted)."""
    monkeypatch.setattr(backends, "triton_status", lambda: (True, False, ""))


@pytest.fixture
def flash_accepts(monkeypatch):
    monkeypatch.setattr(torch.backends.cuda, "can_use_flash_attention", lambda p, d=False: True)


def choose(q, k, v, mask=None, causal=False, pattern=False, setting=None):
    return backends.choose_backend("f", q, k, v, mask, causal, pattern=pattern, setting=setting)


def test_cpu_tensors_run_on_the_cpu_kernels():
    q = torch.randn(1, 1, 4, 8)
    c = choose(q, q, q)
    assert c.backend == "cpu" and "CPU tensors" in c.reason
    assert {name for name, _ in c.refused} == {"triton", "sdpa"}


def test_cuda_sagan_heads_run_on_triton_and_say_why_not_sdpa(compiled_triton):
    c = choose(*_sagan())
    assert c.backend == "triton"
    assert "flash" in dict(c.refused)["sdpa"] and "cuDNN" in dict(c.refused)["sdpa"]


def test_cuda_global_call_that_flash_takes_runs_on_sdpa(compiled_triton, flash_accepts):
    q, k, v = _cuda((2, 4, 256, 64), (2, 4, 256, 64), (2, 4, 256, 64), dtype=torch.float16)
    c = choose(q, k, v)
    assert (c.backend, "flash" in c.reason) == ("sdpa", True)
    assert "faster" in dict(c.refused)["triton"]


def test_cuda_masks_and_patterns_stay_on_triton_even_where_flash_would_run(compiled_triton,
                                                                           flash_accepts):
    q, k, v = _cuda((1, 2, 64, 64), (1, 2, 64, 64), (1, 2, 64, 64), dtype=torch.float16)
    mask = _cuda((64, 64), dtype=torch.bool)[0]
    masked = choose(q, k, v, mask=mask)
    assert masked.backend == "triton" and "no allowed key" in dict(masked.refused)["sdpa"]
    patterned = choose(q, k, v, pattern=True)
    assert patterned.backend == "triton" and "pattern" in dict(patterned.refused)["sdpa"]


def test_cuda_without_triton_runs_global_calls_on_sdpa_and_refuses_patterns(monkeypatch):
    monkeypatch.setattr(backends, "triton_status",
                        lambda: (False, False, "triton is not installed; pip install triton"))
    q, k, v = _sagan()
    assert choose(q, k, v).backend == "sdpa"
    with pytest.raises(ValueError, match="no backend runs this call.*pip install triton"):
        choose(q, k, v, pattern=True)


def test_cuda_with_the_interpreter_on_refuses_triton(monkeypatch):
    monkeypatch.setattr(backends, "triton_status", lambda: (True, True, ""))
    q, k, v = _sagan()
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        choose(q, k, v, setting="triton")


def test_set_backends_run_or_refuse_with_the_reason(compiled_triton):
    q, k, v = _sagan()
    assert choose(q, k, v, setting="sdpa").backend == "sdpa"
    assert choose(q, k, v, setting="triton").backend == "triton"
    with pytest.raises(ValueError, match=r"use_backend\('cpu'\).*CPU tensors"):
        choose(q, k, v, setting="cpu")
    with pytest.raises(ValueError, match=r"use_backend\('sdpa'\).*patterns"):
        choose(q, k, v, pattern=True, setting="sdpa")
    mask = _cuda((4096, 1024), dtype=torch.bool)[0]
    assert choose(q, k, v, mask=mask, setting="sdpa").backend == "sdpa"


def test_triton_on_cpu_tensors_needs_the_interpreter(monkeypatch):
    q = torch.randn(1, 1, 4, 8)
    monkeypatch.setattr(backends, "triton_status", lambda: (True, False, ""))
    with attn2d.use_backend("triton"), pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        attn2d.attention(q, q, q)
    monkeypatch.setattr(backends, "triton_status",
                        lambda: (False, False, "triton is not installed; pip install triton"))
    with attn2d.use_backend("triton"), pytest.raises(ValueError, match="pip install triton"):
        attn2d.attention(q, q, q)


def test_tensors_on_two_devices_are_refused():
    q = torch.randn(1, 1, 4, 8)
    k = _cuda((1, 1, 4, 8))[0]
    with pytest.raises(ValueError, match="k is on cuda.*q is on cpu"):
        attn2d.attention(q, k, q)
    with pytest.raises(ValueError, match="attn_mask is on cuda"):
        attn2d.attention(q, q, q, attn_mask=_cuda((4, 4), dtype=torch.bool)[0])


def test_use_backend_is_a_process_setting_and_a_context_manager():
    assert attn2d.backend_setting() == "auto"
    with attn2d.use_backend("cpu"):
        assert attn2d.backend_setting() == "cpu"
        with attn2d.use_backend("sdpa"):
            assert attn2d.backend_setting() == "sdpa"
        assert attn2d.backend_setting() == "cpu"
    assert attn2d.backend_setting() == "auto"
    attn2d.use_backend("cpu")
    try:
        assert attn2d.backend_setting() == "cpu"
    finally:
        attn2d.use_backend("auto")


@pytest.mark.parametrize("bad,exc", [("cuda", ValueError), ("", ValueError), (None, TypeError),
                                     (1, TypeError)])
def test_use_backend_rejects_unknown_backends(bad, exc):
    with pytest.raises(exc, match="backend"):
        attn2d.use_backend(bad)
    assert attn2d.backend_setting() == "auto"


def test_a_dtype_no_backend_has_is_refused_before_choosing():
    q = torch.randn(1, 1, 4, 8).to(torch.int32)
    with attn2d.use_backend("sdpa"), pytest.raises(TypeError, match="q must be float32"):
        attn2d.attention(q, q, q)


def test_sdpa_backend_on_cpu_matches_the_cpu_kernels():
    q, k, v = torch.randn(2, 2, 33, 8), torch.randn(2, 2, 17, 8), torch.randn(2, 2, 17, 24)
    want = attn2d.attention(q, k, v, is_causal=True)
    with attn2d.use_backend("sdpa"):
        got = attn2d.attention(q, k, v, is_causal=True)
        x = attn2d.explain(q, k, v, is_causal=True)
    assert (got - want).abs().max() < 1e-5
    assert (x.backend.backend, x.forward.kernel) == ("sdpa", "sdpa")


def test_explain_reports_the_triton_kernels_for_cuda_tensors(compiled_triton):
    q, k, v = _cuda((1, 2, 16, 16, 8), (1, 2, 16, 16, 8), (1, 2, 16, 16, 8))
    x = attn2d.explain(q, k, v, pattern=Window(5))
    assert x.backend.backend == "triton"
    assert (x.forward.kernel, x.backward.kernel) == ("triton_sparse_tiles",) * 2
    assert "compiled layout" in x.forward.reason and "no atomics" in x.backward.reason
    g = attn2d.explain(*_sagan())
    assert (g.forward.kernel, g.forward.products) == ("triton_dense_tiles",
                                                     "float32 (exact, not TF32)")
