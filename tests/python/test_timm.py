"""attn2d.nn.Attention as a drop-in for timm's ViT attention (timm 1.0.31): the constructor and
forward take timm's arguments, every supported option matches timm's own module numerically,
unsupported ones are refused by name, and whole timm ViTs built with or swapped to attn2d's
attention match the timm originals' logits and gradients.

Skipped when timm is not installed. timm declares torchvision as a dependency and imports it
(for timm.data's transforms and datasets, and FrozenBatchNorm2d), but no torchvision wheel works
beside a CPU build of torch: the PyPI wheels link against torch's CUDA libraries and fail on
import. So timm is installed with --no-deps, and when torchvision cannot be imported, timm is
imported with stand-in torchvision modules whose names resolve to placeholder classes. Nothing
tested here uses them (ViTs need no torchvision); calling one raises a RuntimeError that says
so. The stand-ins are removed from sys.modules once timm is imported, so they are seen by timm
alone.
"""

from __future__ import annotations

import copy
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import sys
from functools import partial

import pytest
import torch
from torch import nn

import attn2d.nn as ann
from reference import max_err

if importlib.util.find_spec("timm") is None:
    pytest.skip("timm is not installed (scripts/setup.sh installs timm==1.0.31 with --no-deps)",
                allow_module_level=True)


class _StandIn(type):
    """A placeholder class for any torchvision name: attributes are placeholders too (timm
    reads e.g. InterpolationMode.NEAREST at import time), and calling one raises."""

    _made: dict = {}

    def __getattr__(cls, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _stand_in(f"{cls.__qualname__}.{attr}")

    def __call__(cls, *args, **kwargs):
        raise RuntimeError(f"{cls.__qualname__} is a stand-in: torchvision is not importable here")


def _stand_in(qualname: str) -> type:
    if qualname not in _StandIn._made:
        _StandIn._made[qualname] = _StandIn(qualname.rsplit(".", 1)[-1], (), {
            "__qualname__": qualname, "__module__": qualname.rsplit(".", 1)[0]})
    return _StandIn._made[qualname]


class _StandInTorchvision(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves torchvision and any submodule of it as a module of stand-ins."""

    def find_spec(self, fullname, path, target=None):
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        prefix = module.__name__
        if prefix == "torchvision.models.feature_extraction":
            # timm imports it inside try/except ImportError and then goes without fx features.
            raise ImportError("torchvision's fx feature extraction is unavailable")

        def getattr_(attr):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return _stand_in(f"{prefix}.{attr}")

        module.__getattr__ = getattr_


def _drop_torchvision_modules() -> None:
    for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
        del sys.modules[name]


def _import_timm():
    try:
        import torchvision  # noqa: F401
    except Exception:
        # A CUDA torchvision wheel raises RuntimeError half-way through its import; its partly
        # imported modules would shadow the stand-ins.
        _drop_torchvision_modules()
    else:
        import timm

        return timm
    finder = _StandInTorchvision()
    sys.meta_path.insert(0, finder)
    try:
        import timm
        import timm.layers
        import timm.models.vision_transformer  # noqa: F401
    finally:
        sys.meta_path.remove(finder)
        _drop_torchvision_modules()
    return timm


timm = _import_timm()
from timm.layers import Attention as TimmAttention  # noqa: E402
from timm.layers import LayerNorm as TimmLayerNorm, RmsNorm  # noqa: E402
from timm.models.vision_transformer import VisionTransformer  # noqa: E402

TIMM_VERSION = "1.0.31"


def test_timm_is_the_pinned_version():
    assert timm.__version__ == TIMM_VERSION


def test_constructor_and_forward_take_timms_arguments():
    """timm's parameters, in timm's order, with timm's defaults; attn2d adds only the
    keyword-only pattern."""
    ours = inspect.signature(ann.Attention.__init__).parameters
    theirs = inspect.signature(TimmAttention.__init__).parameters
    assert list(ours)[: len(theirs)] == list(theirs)
    for name, p in theirs.items():
        assert ours[name].kind == p.kind, name
        assert ours[name].default == p.default, name
    assert [(n, p.kind) for n, p in ours.items() if n not in theirs] == [
        ("pattern", inspect.Parameter.KEYWORD_ONLY)]
    fwd = inspect.signature(ann.Attention.forward).parameters
    timm_fwd = inspect.signature(TimmAttention.forward).parameters
    assert [(n, p.kind, p.default) for n, p in fwd.items()] == [
        (n, p.kind, p.default) for n, p in timm_fwd.items()]


def _randomize(module: nn.Module, seed: int = 1) -> None:
    """Non-trivial weights everywhere: timm's norms start at weight 1, bias 0."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.3)


def _run(model: nn.Module, inputs, out_grad_seed: int = 2, fwd_kwargs=None, rng_seed=None):
    """Output, input gradients and parameter gradients of one forward and backward."""
    model.zero_grad()
    dtype = next(model.parameters()).dtype
    xs = [x.to(dtype).detach().requires_grad_() for x in inputs]
    if rng_seed is not None:
        torch.manual_seed(rng_seed)
    out = model(*xs, **(fwd_kwargs or {}))
    g = torch.Generator().manual_seed(out_grad_seed)
    out.backward(torch.randn(out.shape, generator=g, dtype=torch.float64).to(dtype))
    return [out.detach()] + [x.grad for x in xs] + [p.grad for p in model.parameters()]


def _names(model: nn.Module, inputs) -> list:
    return (["output"] + [f"grad of input {i}" for i in range(len(inputs))]
            + [f"grad of {n}" for n, _ in model.named_parameters()])


def _check_float64(ours, theirs: nn.Module, inputs, **run_kwargs) -> None:
    """ours (a module or a list of them) against theirs: outputs and all gradients within 1e-10
    of the largest value compared."""
    b = _run(theirs.double(), inputs, **run_kwargs)
    size = max([1.0] + [float(t.abs().max()) for t in b if t is not None and t.numel()])
    for model in ours if isinstance(ours, list) else [ours]:
        a = _run(model.double(), inputs, **run_kwargs)
        for what, x, y in zip(_names(model, inputs), a, b, strict=True):
            assert (x is None) == (y is None), what
            if x is not None:
                assert max_err(x, y) <= 1e-10 * size, (what, max_err(x, y), size)


def _check_float32(ours: nn.Module, theirs: nn.Module, inputs) -> None:
    """ours and theirs in float32, both measured against theirs in float64: each tensor's error
    within 2x timm's own float32 error plus a floor of 1e-7 (float32's epsilon) of the largest
    value compared. The floor is global, not per tensor: some gradients are sums that cancel to
    ~0 (a key bias shifts every score of a row equally), so they are rounding noise of the size
    of the other gradients' rounding, and timm's noise there may happen to be smaller than
    attn2d's."""
    ref = _run(copy.deepcopy(theirs).double(), inputs)
    a = _run(ours.float(), inputs)
    b = _run(theirs.float(), inputs)
    size = max([1.0] + [float(t.abs().max()) for t in ref if t is not None and t.numel()])
    for what, x, y, r in zip(_names(ours, inputs), a, b, ref, strict=True):
        ours_err, timm_err = max_err(x, r), max_err(y, r)
        assert ours_err <= 2 * timm_err + 1e-7 * size, (what, ours_err, timm_err, size)


# Each supported option of timm's Attention (and combinations that interact), on a 48-wide
# module with timm's default of 8 heads unless the case says otherwise.
OPTIONS = {
    "defaults": {},
    "num_heads=2": dict(num_heads=2),
    "num_heads=1": dict(num_heads=1),
    "qkv_bias": dict(qkv_bias=True),
    "proj_bias=False": dict(proj_bias=False),
    "qk_norm LayerNorm": dict(qk_norm=True, norm_layer=nn.LayerNorm),
    "qk_norm timm LayerNorm": dict(qk_norm=True, norm_layer=TimmLayerNorm),
    "qk_norm RmsNorm": dict(qk_norm=True, norm_layer=RmsNorm),
    "qk_norm LayerNorm eps": dict(qk_norm=True, norm_layer=partial(nn.LayerNorm, eps=1e-6)),
    "scale_norm": dict(scale_norm=True, norm_layer=TimmLayerNorm),
    "qk_norm+scale_norm": dict(qk_norm=True, scale_norm=True, norm_layer=RmsNorm),
    "norm_layer unused": dict(norm_layer=TimmLayerNorm),
    "attn_head_dim": dict(attn_head_dim=20),
    "attn_head_dim with dim % num_heads": dict(num_heads=5, attn_head_dim=8),
    "dim_out": dict(dim_out=40),
    "gated": dict(gated=True),
    "gated+qkv_bias": dict(gated=True, qkv_bias=True),
    "attn_drop=0": dict(attn_drop=0.0),
    "proj_drop (eval)": dict(proj_drop=0.4),
    "dtype float64": dict(dtype=torch.float64),
    "device cpu": dict(device="cpu"),
    "everything": dict(num_heads=3, attn_head_dim=10, dim_out=36, qkv_bias=True, qk_norm=True,
                       scale_norm=True, proj_bias=False, gated=True, proj_drop=0.1,
                       norm_layer=TimmLayerNorm, device=torch.device("cpu"),
                       dtype=torch.float32),
}


def _module_pair(kwargs):
    theirs = TimmAttention(48, **kwargs)
    _randomize(theirs)
    ours = ann.Attention(48, **kwargs)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    return ours.eval(), theirs.eval()


@pytest.mark.parametrize("fused", [True, False], ids=["timm-sdpa", "timm-unfused"])
@pytest.mark.parametrize("kwargs", OPTIONS.values(), ids=OPTIONS.keys())
def test_option_matches_timm(kwargs, fused):
    torch.manual_seed(0)
    ours, theirs = _module_pair(kwargs)
    theirs.fused_attn = fused
    if "dtype" in kwargs:
        assert ours.qkv.weight.dtype == kwargs["dtype"]
    _check_float64(ours, theirs, [torch.randn(2, 13, 48)])


def _masks():
    g = torch.Generator().manual_seed(3)
    keep = torch.rand(2, 1, 13, 13, generator=g) > 0.4
    keep |= torch.eye(13, dtype=torch.bool)  # every token may attend to itself: no empty row
    return {
        "is_causal": dict(is_causal=True),
        "bool mask (B, 1, N, N)": dict(attn_mask=keep),
        "bool mask (N, N)": dict(attn_mask=keep[0, 0]),
        "float mask (B, heads, N, N)": dict(
            attn_mask=torch.randn(2, 8, 13, 13, generator=g, dtype=torch.float64)),
    }


@pytest.mark.parametrize("fused", [True, False], ids=["timm-sdpa", "timm-unfused"])
@pytest.mark.parametrize("case", _masks().keys())
def test_forward_mask_arguments_match_timm(case, fused):
    ours, theirs = _module_pair(dict(qkv_bias=True))
    theirs.fused_attn = fused
    _check_float64(ours, theirs, [torch.randn(2, 13, 48)], fwd_kwargs=_masks()[case])


def test_mask_with_is_causal_matches_timms_fused_path():
    """Both apply, as in scaled_dot_product_attention (timm's unfused path drops the mask)."""
    ours, theirs = _module_pair(dict(qkv_bias=True))
    theirs.fused_attn = True
    both = dict(_masks()["bool mask (B, 1, N, N)"], is_causal=True)
    _check_float64(ours, theirs, [torch.randn(2, 13, 48)], fwd_kwargs=both)


def test_proj_drop_in_training_matches_timm():
    """Dropout after proj draws the same mask from the same seed: the attention kernel draws
    no random numbers."""
    ours, theirs = _module_pair(dict(proj_drop=0.4))
    _check_float64(ours.train(), theirs.train(), [torch.randn(2, 13, 48)], rng_seed=5)


def test_attributes_match_timm():
    kwargs = dict(num_heads=3, attn_head_dim=10, dim_out=36, gated=True)
    ours, theirs = ann.Attention(48, **kwargs), TimmAttention(48, **kwargs)
    for attr in ("num_heads", "head_dim", "attn_dim", "scale"):
        assert getattr(ours, attr) == getattr(theirs, attr), attr
    assert ann.Attention(48).gate is None and TimmAttention(48).gate is None
    # timm's attn_drop is absent: attn2d refuses attention dropout.
    assert ([(n, type(m)) for n, m in ours.named_modules() if n]
            == [(n, type(m)) for n, m in theirs.named_modules() if n not in ("", "attn_drop")])


def test_meta_device_builds_without_storage():
    m = ann.Attention(48, qk_norm=True, gated=True, norm_layer=RmsNorm, device="meta")
    assert all(p.device.type == "meta" for p in m.parameters())


def test_norm_layer_none_means_layer_norm_with_qk_norm_or_scale_norm():
    """timm asserts a norm_layer there; attn2d keeps its LayerNorm default."""
    m = ann.Attention(48, qk_norm=True, scale_norm=True)
    assert type(m.q_norm) is type(m.k_norm) is type(m.norm) is nn.LayerNorm


@pytest.mark.parametrize("kwargs,error,word", [
    (dict(attn_drop=0.1), ValueError, "attn_drop"),
    (dict(attn_drop="0"), TypeError, "attn_drop"),
    (dict(pattern="window"), TypeError, "pattern"),
    (dict(num_heads=5), ValueError, "num_heads"),
    (dict(num_heads=0), ValueError, "num_heads"),
    (dict(num_heads=4.0), TypeError, "num_heads"),
    (dict(attn_head_dim=0), ValueError, "attn_head_dim"),
    (dict(attn_head_dim=True), TypeError, "attn_head_dim"),
    (dict(dim_out=0), ValueError, "dim_out"),
    (dict(dim_out=48.0), TypeError, "dim_out"),
    (dict(qkv_bias=1), TypeError, "qkv_bias"),
    (dict(qk_norm="yes"), TypeError, "qk_norm"),
    (dict(scale_norm=None), TypeError, "scale_norm"),
    (dict(proj_bias=0), TypeError, "proj_bias"),
    (dict(gated=1), TypeError, "gated"),
    (dict(proj_drop=1.5), ValueError, "proj_drop"),
    (dict(proj_drop=None), TypeError, "proj_drop"),
    (dict(qk_norm=True, norm_layer="LayerNorm"), TypeError, "norm_layer"),
    (dict(device="no-such-device"), ValueError, "device"),
    (dict(dtype="float32"), TypeError, "dtype"),
    (dict(dtype=torch.int64), ValueError, "dtype"),
    (dict(fused_attn=True), TypeError, "fused_attn"),
])
def test_unsupported_or_bad_options_are_refused_by_name(kwargs, error, word):
    with pytest.raises(error, match=word):
        ann.Attention(48, **kwargs)


def test_refused_attn_drop_says_why():
    with pytest.raises(ValueError, match="attn2d.nn.Attention: attn_drop must be 0.0"):
        ann.Attention(48, attn_drop=0.1)


def test_bad_forward_arguments_are_refused_by_name():
    m = ann.Attention(48, dim_out=40)
    with pytest.raises(TypeError, match="x"):
        m([[0.0] * 48])
    with pytest.raises(ValueError, match="channels"):
        m(torch.randn(2, 5, 40))
    with pytest.raises(TypeError, match="is_causal"):
        m(torch.randn(2, 5, 48), is_causal=1)


def _norm_layer_of(attn: nn.Module):
    """The class timm built attn's norms with, or None where it has none."""
    for norm in (attn.norm, attn.q_norm):
        if not isinstance(norm, nn.Identity):
            return type(norm)
    return None


def _swap_attention(model: nn.Module) -> int:
    """Replaces every timm Attention in model's blocks by attn2d's, built from the timm
    module's configuration and loaded strictly from its weights; returns how many."""
    swapped = 0
    for block in model.blocks:
        old = block.attn
        assert type(old) is TimmAttention
        new = ann.Attention(
            old.qkv.in_features, num_heads=old.num_heads, attn_head_dim=old.head_dim,
            dim_out=old.proj.out_features, qkv_bias=old.qkv.bias is not None,
            qk_norm=not isinstance(old.q_norm, nn.Identity),
            scale_norm=not isinstance(old.norm, nn.Identity),
            proj_bias=old.proj.bias is not None, gated=old.gate is not None,
            proj_drop=old.proj_drop.p, norm_layer=_norm_layer_of(old),
            dtype=old.qkv.weight.dtype)
        # The same eps, so that the new norms compute what the old ones do.
        for name in ("q_norm", "k_norm", "norm"):
            if hasattr(getattr(old, name), "eps"):
                getattr(new, name).eps = getattr(old, name).eps
        new.load_state_dict(old.state_dict(), strict=True)
        block.attn = new
        swapped += 1
    return swapped


# Small timm ViTs (2 blocks, width 48, about 40k parameters, 17 or 18 tokens) covering the
# block options that reach the attention module.
SMALL_VITS = {
    "cls token": dict(),
    "qkv_bias, qk_norm": dict(qkv_bias=True, qk_norm=True),
    "scale_attn_norm, no proj bias": dict(scale_attn_norm=True, proj_bias=False),
    "registers, avg pool, layer scale": dict(class_token=False, reg_tokens=2,
                                             global_pool="avg", init_values=0.1),
}


def _small_vit(**kwargs):
    torch.manual_seed(0)
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=4,
                              mlp_ratio=2.0, num_classes=10, **kwargs)
    _randomize(model)
    return model.eval()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kwargs", SMALL_VITS.values(), ids=SMALL_VITS.keys())
def test_swapped_small_vit_matches_timm(kwargs, dtype):
    theirs = _small_vit(**kwargs)
    ours = copy.deepcopy(theirs)
    assert _swap_attention(ours) == 2
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    if dtype == torch.float64:
        _check_float64(ours, theirs, [images])
    else:
        _check_float32(ours, theirs, [images])


def test_create_model_with_attn2d_attention_builds_and_runs():
    """vit_tiny_patch16_224 at its full size (197 tokens): built by timm with attn2d's
    attention, it loads the timm model's weights strictly, and its float32 logits are within 2x
    the timm model's float32 error (both against the timm model in float64)."""
    torch.manual_seed(0)
    theirs = timm.create_model("vit_tiny_patch16_224", pretrained=False).eval()
    # weight_init="skip": the weights come from theirs.
    ours = timm.create_model("vit_tiny_patch16_224", pretrained=False, weight_init="skip",
                             attn_layer=ann.Attention).eval()
    assert len(ours.blocks) == 12 and all(type(b.attn) is ann.Attention for b in ours.blocks)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    images = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        logits, timm_logits = ours(images), theirs(images)
        ref = copy.deepcopy(theirs).double()(images.double())
    assert logits.shape == (1, 1000) and torch.isfinite(logits).all()
    floor = 1e-7 * float(ref.abs().max())
    assert max_err(logits, ref) <= 2 * max_err(timm_logits, ref) + floor


def test_vit_tiny_patch16_224_with_attn2d_attention_matches_timm():
    """The whole vit_tiny_patch16_224 (12 blocks, 3 heads, width 192) at img_size 64 (17
    tokens), so that float64 runs take seconds: created with attn_layer=attn2d.nn.Attention and
    loaded strictly from timm's model, and timm's model with its blocks' attention swapped.
    Logits, image gradients and every parameter's gradient, in float64 and float32."""
    torch.manual_seed(0)
    theirs = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64).eval()
    ours = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64,
                             weight_init="skip", attn_layer=ann.Attention).eval()
    ours.load_state_dict(theirs.state_dict(), strict=True)
    swapped = copy.deepcopy(theirs)
    assert _swap_attention(swapped) == 12
    images = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(4))
    _check_float32(ours, theirs, [images])
    _check_float64([ours, swapped], theirs, [images])
