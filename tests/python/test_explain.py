"""attn2d.explain: the kernel chooser's answer for each kernel family, and its refusals."""

import pytest
import torch

import attn2d
from attn2d import _compiled_layout
from attn2d.patterns import YLG, Random, Window, Window1D


def grids(hq, wq, hk=None, wk=None, heads=2, e=16, ev=16, dtype=torch.float32):
    hk, wk = hk or hq, wk or wq
    return (torch.randn(1, heads, hq, wq, e, dtype=dtype),
            torch.randn(1, heads, hk, wk, e, dtype=dtype),
            torch.randn(1, heads, hk, wk, ev, dtype=dtype))


def dense(lq=40, lk=50, e=16, ev=24, dtype=torch.float32, heads=2, batch=2):
    return (torch.randn(batch, heads, lq, e, dtype=dtype),
            torch.randn(batch, heads, lk, e, dtype=dtype),
            torch.randn(batch, heads, lk, ev, dtype=dtype))


def refused(report):
    return dict(report.refused)


def test_dense_float32_runs_on_dense_tiles():
    x = attn2d.explain(*dense())
    assert x.forward.kernel == "dense_tiles" and x.backward.kernel == "dense_tiles"
    assert x.forward.products == "float32"
    assert x.backward.schedule in ("whole heads", "key-tile groups", "two passes")
    assert "no pattern" in x.forward.reason
    assert set(refused(x.forward)) == {"reference", "sparse_tiles", "query_lanes", "window"}


def test_dense_float64_runs_on_dense_tiles_in_float64():
    x = attn2d.explain(*dense(dtype=torch.float64))
    assert (x.forward.kernel, x.forward.products) == ("dense_tiles", "float64")
    assert (x.backward.kernel, x.backward.products) == ("dense_tiles", "float64")


def test_dense_backward_schedule_follows_heads_and_threads():
    # One head of 700 queries cannot keep two threads busy as a whole head.
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        one = attn2d.explain(*dense(lq=700, lk=650, heads=1, batch=1))
        many = attn2d.explain(*dense(heads=8))
    finally:
        torch.set_num_threads(threads)
    assert one.backward.schedule in ("key-tile groups", "two passes")
    assert many.backward.schedule == "whole heads"


@pytest.fixture
def bf16_choice():
    yield
    attn2d.set_bf16_products("auto")


def test_dense_bf16_float_products(bf16_choice):
    attn2d.set_bf16_products("float")
    x = attn2d.explain(*dense(dtype=torch.bfloat16))
    assert (x.forward.kernel, x.forward.products) == ("dense_tiles", "float")
    assert x.backward.products == "float"
    assert "set_bf16_products(\"float\")" in x.forward.reason


def test_dense_bf16_pair_products(bf16_choice):
    attn2d.set_bf16_products("pairs")
    if attn2d.bf16_products() != "pairs" or attn2d.cpu_simd_target() not in ("AVX3", "AVX3_DL"):
        pytest.skip("this CPU or SIMD target has no AVX512-BF16 pair kernels")
    x = attn2d.explain(*dense(dtype=torch.bfloat16))
    assert (x.forward.kernel, x.forward.products) == ("dense_tiles", "bf16 pairs")
    assert x.backward.products == "bf16 pairs"


def test_float16_is_widened():
    x = attn2d.explain(*dense(dtype=torch.float16))
    assert x.forward.products == "float"


def test_square_window_runs_on_window_kernels():
    x = attn2d.explain(*grids(32, 32), pattern=Window(15))
    assert x.forward.kernel == "window" and x.backward.kernel == "window"
    assert x.backward.schedule == "blocked rows"  # 32 columns: whole vectors a row
    assert "clip window of 225 offsets" in x.forward.reason
    assert "sparse_tiles" in refused(x.forward)


def test_manhattan_window_runs_on_window_kernels():
    x = attn2d.explain(*grids(32, 32), pattern=Window(15, "manhattan"))
    assert x.forward.kernel == "window" and x.backward.kernel == "window"
    assert "113 offsets" in x.forward.reason


def test_window_on_unpadded_width_runs_one_vector_at_a_time():
    # 20 columns would pad to 32, more than a third more: no blocked rows.
    x = attn2d.explain(*grids(20, 20), pattern=Window(7))
    assert x.backward.kernel == "window"
    assert x.backward.schedule == "one vector at a time"


def test_window_over_pooled_keys_runs_on_query_lanes():
    x = attn2d.explain(*grids(24, 24, 12, 12), pattern=Window(7))
    assert x.forward.kernel == "query_lanes"
    assert x.backward.kernel == "sparse_tiles"
    assert "no window offsets" in refused(x.forward)["window"]
    assert refused(x.backward)["query_lanes"] == "forward only"


def test_shift_border_runs_on_query_lanes():
    x = attn2d.explain(*grids(19, 23), pattern=Window(7, border="shift"))
    assert x.forward.kernel == "query_lanes" and x.backward.kernel == "sparse_tiles"


def test_ylg_runs_on_query_lanes_in_float32_and_tiles_in_bf16():
    x = attn2d.explain(*grids(16, 16, 8, 8, heads=8), pattern=YLG(8))
    assert x.forward.kernel == "query_lanes" and x.backward.kernel == "sparse_tiles"
    y = attn2d.explain(*grids(16, 16, 8, 8, heads=8, dtype=torch.bfloat16), pattern=YLG(8))
    assert y.forward.kernel == "sparse_tiles"
    assert "take float32" in refused(y.forward)["query_lanes"]


def test_wide_heads_refuse_query_lanes():
    x = attn2d.explain(*grids(8, 8, 4, 4, e=264, ev=8), pattern=Window(3))
    assert x.forward.kernel == "sparse_tiles"
    assert "up to 256 wide" in refused(x.forward)["query_lanes"]


def test_window_past_twice_the_allowed_pairs_runs_on_tiles():
    # 11x11 on a 5x23 map: the window kernels would compute 2.04x the allowed pairs.
    x = attn2d.explain(*grids(5, 23), pattern=Window(11))
    assert x.forward.kernel == "query_lanes" and x.backward.kernel == "sparse_tiles"
    assert "2.04x the allowed pairs" in refused(x.forward)["window"]
    assert _compiled_layout.window_offsets(Window(11), (5, 23), (5, 23)) is None
    assert _compiled_layout.window_offsets(Window(9), (5, 23), (5, 23)) is not None


def test_float64_window_runs_on_window_kernels():
    x = attn2d.explain(*grids(16, 16, dtype=torch.float64), pattern=Window(5))
    assert (x.forward.kernel, x.forward.products) == ("window", "float64")


def test_global_grids_run_on_dense_tiles():
    x = attn2d.explain(*grids(9, 11))
    assert x.forward.kernel == "dense_tiles"


def test_text_names_the_backend_both_directions_and_every_refusal():
    x = attn2d.explain(*grids(32, 32), pattern=Window(15))
    text = str(x)
    assert text.startswith("backend: cpu\n")
    assert "\nforward: window" in text
    assert "\nbackward: window (blocked rows)" in text
    for name, _ in x.forward.refused + x.backend.refused:
        assert f"not {name}:" in text


def test_a_sequence_pattern_on_4d_inputs_runs_on_the_sparse_tiles():
    q, k, v = dense()
    info = attn2d.explain(q, k, v, pattern=Window1D(9) | Random(1, 16, 0, 2))
    assert info.forward.kernel in ("sparse_tiles", "query_lanes")
    assert info.backward.kernel == "sparse_tiles"


def test_bad_input_raises_naming_the_argument():
    q, k, v = dense()
    with pytest.raises(ValueError, match="a pattern takes 4-D sequences"):
        attn2d.explain(q, k, v, is_causal=True, pattern=Window1D(3))
    with pytest.raises(TypeError, match="is_causal"):
        attn2d.explain(q, k, v, is_causal=1)
    with pytest.raises(ValueError, match="k"):
        attn2d.explain(q, k[:, :1], v)
    with pytest.raises(TypeError, match="pattern"):
        attn2d.explain(*grids(8, 8), pattern="window")
    with pytest.raises(ValueError, match="attn_mask"):
        attn2d.explain(*grids(8, 8), attn_mask=torch.ones(64, 64, dtype=torch.bool))
