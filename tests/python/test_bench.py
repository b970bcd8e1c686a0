"""`attn2d bench`: one run holds attn2d and every peer on the same case, with medians, ratios,
rates against the measured FMA peak, and memory from subprocesses."""

from __future__ import annotations

import itertools
import json
import mmap
import os
import statistics
import time

import pytest
import torch

from attn2d import bench
from attn2d.cli import main as cli_main


def test_fma_peak_is_measured_and_plausible():
    peak = float(torch.ops.attn2d.fma_peak_gflops(0.05))
    assert 1.0 < peak < 100000.0
    with pytest.raises(ValueError, match="seconds"):
        torch.ops.attn2d.fma_peak_gflops(0.0)


def test_side_by_side_report(tmp_path):
    # Large enough that every implementation's buffers (the scores; attn2d's 240 KiB of tile
    # scratch) exceed the probe's 64 KiB mmap threshold: a warm step of a tiny case can reuse
    # freed heap memory and honestly show no growth at all.
    case = bench.Case("small E=8 Ev=16", 1, 2, 256, 192, 8, 16)
    threads_before = torch.get_num_threads()
    report = bench.run(str(tmp_path), cases=[case], reps=2, peers=["unfused", "sdpa-flash"],
                       with_memory=True, thread_scaling=True, paired_seconds=0.0,
                       log=lambda line: None)
    results = report["cases"][0]["results"]
    bf16 = results["attn2d-bf16"]
    assert bf16["forward_s"] > 0 and bf16["peak_bytes"] > 0
    acc = bf16["accuracy"]
    assert acc["within_2x_rule"] and 0 < acc["error"] <= 2 * acc["naive_bf16_error"]
    assert results["attn2d-1thread"]["fwd_bwd_s"] > 0
    one = results["attn2d-1thread"]
    assert one["attn2d_scaling_forward"] > 0 and len(one["forward_runs_s"]) == 2
    assert bf16["bf16_speedup_backward"] == pytest.approx(
        bench.paired_speedup(results["attn2d"], bf16, "backward"))
    assert torch.get_num_threads() == threads_before  # the interleaved 1-thread runs restore it
    ours, peer = results["attn2d"], results["unfused"]
    for key in ("forward_s", "backward_s", "fwd_bwd_s", "forward_gflops", "peak_bytes"):
        assert ours[key] > 0 and peer[key] > 0
    # Each peer's ratio against the attn2d runs interleaved with it, kept in its row.
    assert len(peer["attn2d_forward_runs_s"]) == len(peer["forward_runs_s"]) == 2
    assert peer["attn2d_speedup_forward"] == bench.paired_speedup(
        peer, {"forward_runs_s": peer["attn2d_forward_runs_s"]}, "forward")
    assert bf16["attn2d_speedup_backward"] == bench.paired_speedup(bf16, ours, "backward")
    assert one["attn2d_speedup_fwd_bwd"] == bench.paired_speedup(
        one, {"fwd_bwd_runs_s": one["attn2d_fwd_bwd_runs_s"]}, "fwd_bwd")
    assert "same last dimension" in results["sdpa-flash"]["refused"]  # Ev != E on the CPU
    with open(tmp_path / "bench.json") as f:
        saved = json.load(f)
    assert saved["cases"][0]["case"]["name"] == case.name
    assert "median over reps" in saved["ratios"]
    md = (tmp_path / "bench.md").read_text()
    assert "| small E=8 Ev=16 | unfused |" in md and "refused" in md
    assert "bf16 speed" in md and "thread scaling" in md
    assert "never a ratio of two medians" in md
    assert os.path.getsize(tmp_path / "bench.png") > 1000


def test_bad_arguments_are_clear_errors(capsys):
    assert cli_main(["bench", "--reps", "0", "--quick", "--no-memory"]) == 2
    assert "reps" in capsys.readouterr().err
    assert cli_main(["bench", "--paired-seconds", "-1", "--quick", "--no-memory"]) == 2
    assert "paired_seconds" in capsys.readouterr().err
    assert cli_main(["bench", "--patterns", "--paired-seconds", "-1", "--no-memory"]) == 2
    assert "paired_seconds" in capsys.readouterr().err
    assert cli_main(["bench", "--cases", "no such case", "--no-memory"]) == 2
    assert "matches no case" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown peers"):
        bench.run("unused", cases=[], peers=["tensorflow"], log=lambda line: None)


def test_interleaved_training_steps_alternate_and_time_each():
    calls = []

    def tagged(tag):
        def fn(x):
            calls.append(tag)
            return x * 2.0
        return fn

    x = torch.randn(3, 4)
    results = bench.time_training_steps([tagged("a"), tagged("b")], [x], reps=3)
    # One warm-up each, then rep 1 of a and b, rep 2 of b and a, rep 3 of a and b.
    assert calls == ["a", "b"] + ["a", "b", "b", "a", "a", "b"]
    assert len(results) == 2
    for r in results:
        assert r["forward_s"] > 0 and r["backward_s"] > 0
        assert r["fwd_bwd_s"] >= max(r["forward_s"], r["backward_s"]) * 0.5


def test_training_steps_count_the_page_faults_of_each_timed_span():
    """A forward that writes a fresh 64 MiB anonymous mapping (its own mmap, so whatever malloc's
    settings, e.g. the README's MALLOC_MMAP_THRESHOLD_, every call's pages are new) faults at
    least once per 2 MiB page, huge pages or not; a backward that allocates nothing new does not
    fault that much, nor does a small function."""
    class FreshForward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            region = mmap.mmap(-1, 64 << 20)
            pages = torch.frombuffer(region, dtype=torch.uint8)
            pages.fill_(1)  # every page touched
            first = float(pages[0])
            del pages
            region.close()
            return x * first

        @staticmethod
        def backward(ctx, g):
            return g

    small, fresh = bench.time_training_steps(
        [lambda x: x * 2.0, FreshForward.apply], [torch.randn(3, 4)], reps=3)
    assert fresh["forward_faults"] >= 32
    assert fresh["forward_faults"] > 8 * max(small["forward_faults"], 1)
    assert fresh["backward_faults"] < fresh["forward_faults"] / 8


def test_interleaved_training_steps_run_at_least_min_seconds():
    calls = []

    def slow(x):
        calls.append(1)
        time.sleep(0.01)
        return x * 2.0

    results = bench.time_training_steps([slow, slow], [torch.randn(3)], reps=2, min_seconds=0.3)
    # 0.3 s of pairs of >= 10 ms steps: more than the 2 reps asked for, fewer than 16.
    reps = len(results[0]["forward_runs_s"])
    assert 2 < reps < 16 and len(results[1]["forward_runs_s"]) == reps
    assert len(calls) == 2 * (reps + 1)


def test_timed_steps_run_without_the_cyclic_collector_and_restore_it():
    import gc

    seen = []

    def record(x):
        seen.append(gc.isenabled())
        return x * 2.0

    assert gc.isenabled()
    bench.time_training_steps([record], [torch.randn(3)], reps=2)
    assert seen == [True, False, False]  # the warm-up, then the timed reps
    assert gc.isenabled()


def test_timed_steps_start_with_the_leaves_grad_cleared():
    # As optimizer.zero_grad() leaves them (set_to_none): no step pays for summing its gradients
    # into the last step's .grad.
    seen = []

    def record(x):
        seen.append(x.grad is None)
        return x * 2.0

    bench.time_training_steps([record], [torch.randn(3)], reps=3)
    assert seen == [True, True, True, True]


def test_timed_steps_start_with_every_functions_gradients_freed():
    # A network's gradients of q, k and v do not outlive the backward that uses them: when a
    # function's step starts, no other function's last gradients are still held.
    leaves = []
    seen = []

    def record(x):
        if all(x is not t for t in leaves):
            leaves.append(x)
        seen.append(all(t.grad is None for t in leaves))
        return x * 2.0

    x = torch.randn(3)
    bench.time_training_steps([record, record], [], reps=2, per_fn_inputs=[[x], [x.clone()]])
    assert len(leaves) == 2
    assert seen[:2] == [True, False]  # the warm-up keeps the first function's gradient
    assert seen[2:] == [True] * 4


def test_every_backward_gets_the_same_output_gradient():
    # The timed backwards read a copy of the warm-up's gradient written just before them (as the
    # layer above would have just written it): the same values every step.
    seen = []

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2.0

        @staticmethod
        def backward(ctx, g):
            seen.append(g.clone())
            return g * 2.0

    bench.time_training_steps([Probe.apply], [torch.randn(3, 4)], reps=3)
    assert len(seen) == 4
    assert all(torch.equal(g, seen[0]) for g in seen[1:])


def test_paired_speedup_is_the_median_of_per_rep_ratios():
    # Rep 3 is a slow phase for both: the per-rep ratios are 2, 2, 2 (the ratio of the medians
    # would be 2 as well here); rep 2 is slow for `fast` only, an outlier the median drops.
    slow = {"forward_runs_s": [2.0, 2.0, 8.0, 2.0], "backward_runs_s": [1.0, 1.0, 1.0, 1.0]}
    fast = {"forward_runs_s": [1.0, 1.0, 4.0, 1.0], "backward_runs_s": [0.5, 2.0, 0.5, 0.5]}
    assert bench.paired_speedup(slow, fast, "forward") == 2.0
    assert bench.paired_speedup(slow, fast, "backward") == 2.0
    with pytest.raises(ValueError, match="not paired"):
        bench.paired_speedup(slow, {"forward_runs_s": [1.0]}, "forward")
    with pytest.raises(ValueError, match="key must be one of"):
        bench.paired_speedup(slow, fast, "forward_s")
    with pytest.raises(ValueError, match="need fwd_bwd_runs_s"):
        bench.paired_speedup(slow, fast, "fwd_bwd")
    with pytest.raises(ValueError, match="no runs"):
        bench.paired_speedup({"forward_runs_s": []}, {"forward_runs_s": []}, "forward")


def test_interleaved_training_steps_take_each_functions_own_inputs():
    seen = []

    def record(x):
        seen.append(x.dtype)
        return x * 2.0

    x = torch.randn(3, 4)
    bench.time_training_steps([record, record], [], reps=2,
                              per_fn_inputs=[[x], [x.bfloat16()]])
    assert seen == [torch.float32, torch.bfloat16] * 2 + [torch.bfloat16, torch.float32]
    with pytest.raises(ValueError, match="per_fn_inputs"):
        bench.time_training_steps([record, record], [], reps=1, per_fn_inputs=[[x]])


def test_pattern_bench_side_by_side(tmp_path):
    from attn2d import bench_patterns
    from attn2d.patterns import Window

    case = bench_patterns.PatternCase("window 3, 12x12", 2, (12, 12), (12, 12), 8, 8, Window(3))
    report = bench_patterns.run(str(tmp_path), cases=[case], reps=1, with_memory=False,
                                with_flex=True, paired_seconds=0.0, log=lambda line: None)
    c = report["cases"][0]
    assert set(c["results"]) == {"attn2d-pattern", "attn2d-pattern-steady", "attn2d-global",
                                 "dense-masked-math", "flex-forward"}
    s = c["summary"]
    assert s["allowed_pairs"] == 2 * int(Window(3).dense_mask((12, 12), (12, 12)).sum())
    assert s["allowed_pairs"] <= s["visited_pairs"] <= s["global_pairs"]
    # The window kernels compute all 9 offsets of every query (the border's included).
    assert s["visited_pairs"] == 2 * 144 * 9
    assert s["per_pair_ratio_fwd"] > 0 and s["per_pair_ratio_bwd"] > 0
    assert s["per_pair_ratio_fwd_steady"] > 0 and s["per_pair_ratio_bwd_steady"] > 0
    assert s["flex_over_attn2d_fwd"] > 0
    assert s["dense_over_attn2d_fwd"] > 0 and s["dense_over_attn2d_bwd"] > 0
    for name in ("attn2d-pattern", "attn2d-pattern-steady"):
        assert c["results"][name]["forward_faults"] >= 0
        assert c["results"][name]["backward_faults"] >= 0
    ramp = report["memory_ramp"]
    assert len(ramp["copy_s"]) == 8 and min(ramp["copy_s"]) > 0
    text = (tmp_path / "bench_patterns.md").read_text()
    assert "| window 3, 12x12 | attn2d-pattern |" in text
    assert "page faults a pattern step" in text
    assert "a 32.0 MiB copy, call by call, " in text


def test_pattern_bench_runs_reps_until_paired_seconds_pass():
    # A case's rounds (the global step, then the pattern's) go on past --reps until they have run
    # paired_seconds, so that a slow phase of the machine is a minority of the reps.
    from attn2d import bench_patterns
    from attn2d.patterns import Window

    case = bench_patterns.PatternCase("w", 1, (6, 6), (6, 6), 4, 4, Window(3))
    start = time.perf_counter()
    out = bench_patterns.run_case(case, reps=1, with_memory=False, with_flex=False,
                                  log=lambda line: None, paired_seconds=0.3)
    assert time.perf_counter() - start >= 0.3
    r = out["results"]
    reps = len(r["attn2d-global"]["forward_runs_s"])
    assert reps > 1
    assert all(len(r[name]["backward_runs_s"]) == reps
               for name in ("attn2d-pattern", "attn2d-pattern-steady"))


def test_memory_ramp_times_each_call_after_the_busy_loop(monkeypatch):
    from attn2d import bench_patterns

    # Each round: the busy loop, then the copies; the i-th median is the i-th call's.
    copies = []
    real_copy = torch.Tensor.copy_

    def counting_copy(self, src, *args, **kwargs):
        copies.append(time.perf_counter())
        return real_copy(self, src, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "copy_", counting_copy)
    start = time.perf_counter()
    ramp = bench_patterns.memory_ramp(nbytes=1 << 16, idle_s=0.05, calls=3, rounds=2)
    assert ramp["bytes"] == 1 << 16 and ramp["idle_s"] == 0.05
    assert len(ramp["copy_s"]) == 3 and min(ramp["copy_s"]) > 0
    assert ramp["first_over_last"] == pytest.approx(ramp["copy_s"][0] / ramp["copy_s"][-1])
    # One untimed copy to fault the buffers in, then 3 a round, each round after 0.05 s idle.
    assert len(copies) == 1 + 3 * 2
    assert copies[1] - start >= 0.05 and copies[4] - copies[3] >= 0.05
    for bad in (dict(nbytes=2), dict(calls=1), dict(rounds=0), dict(idle_s=-1.0),
                dict(idle_s=float("nan"))):
        with pytest.raises(ValueError, match="memory_ramp"):
            bench_patterns.memory_ramp(**bad)


def test_pattern_bench_times_first_and_steady_steps_after_global(monkeypatch):
    """Each rep: the global step, then STEADY_STEPS + 1 pattern steps; the first pattern step is
    'attn2d-pattern' and the last 'attn2d-pattern-steady' (the ratios come from those runs)."""
    import attn2d
    from attn2d import bench_patterns
    from attn2d.patterns import Window

    real = attn2d.attention2d
    calls = []
    last = bench_patterns.STEADY_STEPS + 1

    def recording(q, k, v, **kw):
        calls.append("P" if kw.get("pattern") is not None else "G")
        since_global = len(calls) - 1 - max(i for i, c in enumerate(calls) if c == "G")
        if since_global == last:  # marks the steady step's forward: 50 ms longer
            time.sleep(0.05)
        return real(q, k, v, **kw)

    monkeypatch.setattr(attn2d, "attention2d", recording)
    case = bench_patterns.PatternCase("w", 1, (6, 6), (6, 6), 4, 4, Window(3))
    out = bench_patterns.run_case(case, reps=2, with_memory=False, with_flex=False,
                                  log=lambda line: None, paired_seconds=0.0)
    one_rep = ["G"] + ["P"] * (bench_patterns.STEADY_STEPS + 1)
    # The warm-up round, then 2 reps, in a fixed order; then the pattern's steps of its pair
    # with the dense-masked peer (a warm-up and 2 reps).
    assert calls == one_rep * 3 + ["P"] * 3
    r = out["results"]
    assert len(r["attn2d-pattern"]["forward_runs_s"]) == 2
    assert min(r["attn2d-pattern-steady"]["forward_runs_s"]) >= 0.05
    assert max(r["attn2d-pattern"]["forward_runs_s"]) < 0.05


@pytest.mark.parametrize("pattern,q_hw,kv_hw,heads", [
    ("manhattan", (24, 20), (12, 10), 2), ("euclidean", (9, 9), (9, 9), 1),
    ("ylg", (12, 12), (6, 6), 8), ("ylg-geometric", (10, 6), (5, 3), 8),
    ("shift", (12, 10), (12, 10), 2), ("shift-pooled", (16, 14), (8, 7), 1),
    ("shift-dilated", (13, 12), (13, 12), 1)])
def test_flex_mask_mods_are_the_patterns(pattern, q_hw, kv_hw, heads):
    from torch.nn.attention.flex_attention import create_mask

    from attn2d import bench_patterns
    from attn2d.patterns import YLG, Window

    p = {"manhattan": Window(5, "manhattan", 2), "euclidean": Window(5, "euclidean"),
         "ylg": YLG(8), "ylg-geometric": YLG(8, mapping="geometric"),
         "shift": Window(5, border="shift"), "shift-pooled": Window(4, border="shift"),
         "shift-dilated": Window(3, dilation=2, border="shift")}[pattern]
    case = bench_patterns.PatternCase("x", heads, q_hw, kv_hw, 8, 8, p)
    got = create_mask(bench_patterns._mask_mod(case), 1, heads, q_hw[0] * q_hw[1],
                      kv_hw[0] * kv_hw[1], device="cpu")[0]
    assert torch.equal(got, p.dense_mask(q_hw, kv_hw, heads))


def test_dense_masked_peer_runs_where_its_matrices_fit(monkeypatch):
    from attn2d import bench_patterns as bp

    scores = 1 << 30
    enough = int(bp.DENSE_BYTES_PER_SCORE * scores / bp.DENSE_MEMORY_SHARE)
    assert bp.dense_masked_skip_reason(scores, available=enough + 16) is None
    reason = bp.dense_masked_skip_reason(scores, available=enough - 16)
    assert "1.0 G scores need ~16.0 GiB" in reason and "available" in reason
    # By default the system's available memory decides; where it is unknown, the peer never runs.
    monkeypatch.setattr(bp, "available_memory_bytes", lambda: enough + 16)
    assert bp.dense_masked_skip_reason(scores) is None
    monkeypatch.setattr(bp, "available_memory_bytes", lambda: None)
    assert "unknown" in bp.dense_masked_skip_reason(1)


def test_available_memory_is_what_the_system_reports():
    from attn2d.memory import available_memory_bytes

    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    reported = int(fields["MemAvailable"].split()[0]) * 1024
    # MemAvailable moves as other processes run: within 10% of a second reading.
    got = available_memory_bytes()
    assert abs(got - reported) <= 0.1 * reported
    # In bytes, not kiB or pages: more than a 64 MiB floor and at most the machine's total.
    assert 64 << 20 < got <= int(fields["MemTotal"].split()[0]) * 1024


def test_pattern_bench_measures_each_peers_memory(monkeypatch):
    """With memory on, each implementation that ran gets its peak from a probe of its own: the
    dense and Flex peers' specs name their probe paths and the pattern; skipped peers get none."""
    from attn2d import bench_patterns as bp
    from attn2d.patterns import Window

    specs = []

    def fake_measure(spec, timeout=None):
        specs.append(spec)
        return {"peak_above_baseline_bytes": 1000 + len(specs)}

    monkeypatch.setattr(bp, "measure", fake_measure)
    # Flex stood in for by a plain forward (its compile is the probe test's below).
    monkeypatch.setattr(bp, "flex_forward", lambda case, q, k, v: (lambda: q * 1.0))
    case = bp.PatternCase("w", 1, (6, 6), (6, 6), 4, 4, Window(3))
    out = bp.run_case(case, reps=1, with_memory=True, with_flex=True, log=lambda line: None,
                      paired_seconds=0.0)
    impls = [s["impl"] for s in specs]
    assert impls == ["attn2d", "attn2d", "sdpa-math-masked", "flex-masked"], specs
    assert "pattern" in specs[0] and "pattern" not in specs[1]
    for spec in specs[2:]:
        assert spec["pattern"] == Window(3).to_spec() and spec["q_hw"] == [6, 6]
    assert specs[3]["backward"] is False and "backward" not in specs[2]
    r = out["results"]
    assert [r[k]["peak_bytes"] for k in ("attn2d-pattern", "attn2d-global",
                                         "dense-masked-math", "flex-forward")] == [
        1001, 1002, 1003, 1004]
    assert out["summary"]["dense_peak_over_attn2d"] == pytest.approx(1003 / 1001)
    # Too little memory for the dense peer: skipped with its reason, and not probed.
    specs.clear()
    monkeypatch.setattr(bp, "available_memory_bytes", lambda: 1)
    out = bp.run_case(case, reps=1, with_memory=True, with_flex=False, log=lambda line: None,
                      paired_seconds=0.0)
    assert "available" in out["results"]["dense-masked-math"]["skipped"]
    assert [s["impl"] for s in specs] == ["attn2d", "attn2d"]


# ---------------------------------------------------------------------------------------------
# bench --device cuda (attn2d.bench_cuda): its cases, harness, Flex peer and report, on the CPU


def test_gpu_bench_cases_are_the_targets():
    from attn2d import bench_cuda as bc
    from attn2d.patterns import YLG, Window

    cases = bc.default_cases()
    dense = [c for c in cases if isinstance(c, bc.DenseCase)]
    # The CPU bench's SAGAN shapes with 2x2-pooled keys, at the GPU batch, in both dtypes.
    assert sorted((c.shape.Lq, c.shape.Lk, c.dtype) for c in dense) == [
        (4096, 1024, "bfloat16"), (4096, 1024, "float32"),
        (16384, 4096, "bfloat16"), (16384, 4096, "float32")]
    assert all((c.shape.E, c.shape.Ev, c.shape.B) == (8, 64, bc.GPU_BATCH) for c in dense)
    cpu_names = {c.name for c in bench.default_cases()}
    assert all(c.shape.name.rsplit(", batch", 1)[0] in cpu_names for c in dense)
    patterns = [c for c in cases if bc.is_pattern_case(c)]
    assert {(repr(c.shape.pattern), c.shape.q_hw) for c in patterns} == {
        (repr(Window(15)), (128, 128)), (repr(Window(15, border="shift")), (128, 128)),
        (repr(YLG(8)), (128, 128))}
    assert [(c.res, c.batch) for c in cases if isinstance(c, bc.MemoryCase)] == [(64, 8), (128, 8)]
    assert len({c.name for c in cases}) == len(cases)  # --cases picks them by name


def test_gpu_bench_interleaves_calls_rep_by_rep():
    from attn2d import bench_cuda as bc

    calls = []

    def tagged(tag):
        def fn(x):
            calls.append(tag)
            return x * 2.0
        return fn

    x = torch.randn(4)
    out = bc.time_interleaved([tagged("a"), tagged("b")], [[x], [x]], reps=2, backward=True,
                              calls=3)
    # One untimed call each, then per rep three calls of each, the order reversed in rep 2.
    assert calls == ["a", "b"] + ["a"] * 3 + ["b"] * 3 + ["b"] * 3 + ["a"] * 3
    for r in out:
        assert len(r["forward_runs_s"]) == 2 and len(r["backward_runs_s"]) == 2
        assert r["fwd_bwd_runs_s"] == [f + b for f, b in zip(r["forward_runs_s"],
                                                            r["backward_runs_s"])]
    forward_only = bc.time_interleaved([tagged("a")], [[x]], reps=1, backward=False, calls=1)[0]
    assert set(forward_only) == {"forward_runs_s", "forward_s"}
    start = time.perf_counter()
    long = bc.time_interleaved([tagged("a")], [[x]], reps=1, backward=False, calls=1,
                               min_seconds=0.05)[0]
    assert time.perf_counter() - start >= 0.05 and len(long["forward_runs_s"]) > 1
    with pytest.raises(ValueError, match="2 functions but 1 input lists"):
        bc.time_interleaved([tagged("a"), tagged("b")], [[x]], reps=1, backward=False)


def test_gpu_bench_harness_runs_on_the_cpu(tmp_path):
    from attn2d import bench_cuda as bc

    cases = [c for c in bc.quick_cases() if not isinstance(c, bc.PatternGpuCase)
             or c.shape.pattern.__class__.__name__ == "Window"]
    report = bc.run(str(tmp_path), cases=cases, reps=1, paired_seconds=0.0, with_flex=False,
                    device="cpu", log=lambda line: None)
    assert report["device_type"] == "cpu" and report["device"].startswith("CPU")
    dense = [c for c in report["cases"] if c["kind"] == "dense"]
    assert [c["dtype"] for c in dense] == ["float32", "bfloat16"]
    for c in dense:
        r = c["results"]
        assert c["attn2d_backend"] == "cpu" and c["device"] == report["device"]
        assert r["sdpa-math"]["over_attn2d_fwd_bwd"] == pytest.approx(
            bench.paired_speedup(r["sdpa-math"], r["attn2d"], "fwd_bwd"))
        assert r["sdpa-math"]["max_abs_difference"] < (1e-4 if c["dtype"] == "float32" else 0.05)
        assert "same last dimension" in r["sdpa-flash"]["refused"]  # Ev != E
        assert "peak_bytes" not in r["attn2d"]  # memory is measured on CUDA only
    pattern = [c for c in report["cases"] if c["kind"] == "pattern"]
    assert [c["pattern"].split("border=")[1] for c in pattern] == ["'clip')", "'shift')"]
    assert "backward_s" not in pattern[0]["results"]["attn2d"]
    assert "natten" not in pattern[0]["results"]  # only the shifted window has a NATTEN peer
    assert "natten" in pattern[1]["results"]
    memory = [c for c in report["cases"] if c["kind"] == "memory"]
    assert "CUDA" in memory[0]["skipped"]
    text = (tmp_path / "bench_cuda.md").read_text()
    assert json.loads((tmp_path / "bench_cuda.json").read_text())["cases"][0]["kind"] == "dense"
    for heading in ("## SAGAN attention against SDPA's kernels", "## Local patterns against "
                    "FlexAttention and NATTEN", "## Memory of the SAGAN block"):
        assert heading in text
    assert text.count(f"On {report['device']}") == 3  # every table names its device
    assert "| sdpa-flash | refused: " in text


@pytest.mark.parametrize("width,padded", [(8, 16), (16, 16), (24, 32), (64, 64)])
def test_flex_widths_are_zero_padded(width, padded):
    from attn2d import bench_cuda as bc

    t = torch.randn(1, 2, 5, width)
    for p in bc.flex_padded(t, t, t):
        assert p.shape[-1] == padded
        assert torch.equal(p[..., :width], t) and not p[..., width:].any()


@pytest.mark.parametrize("pattern,q_hw,kv_hw,heads,E,Ev", [
    ("window", (12, 10), (12, 10), 2, 8, 16), ("shift", (12, 10), (6, 5), 2, 8, 8),
    ("ylg", (8, 8), (4, 4), 8, 8, 16)])
def test_flex_peer_gives_attn2d_outputs(pattern, q_hw, kv_hw, heads, E, Ev):
    """The Flex peer (eager here: compiling takes minutes on a CPU) under the pattern's block
    mask, with widths padded to 16 and the scale passed, gives attn2d's outputs."""
    import math
    import warnings

    import attn2d
    from attn2d import bench_cuda as bc
    from attn2d import bench_patterns
    from attn2d.patterns import YLG, Window

    p = {"window": Window(5), "shift": Window(5, border="shift"), "ylg": YLG(8)}[pattern]
    shape = bench_patterns.PatternCase("x", heads, q_hw, kv_hw, E, Ev, p)
    q, k, v = (torch.randn(2, heads, *hw, w) for hw, w in ((q_hw, E), (kv_hw, E), (kv_hw, Ev)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex_attention's warning that it runs uncompiled
        fn, inputs = bc.flex_peer(shape, *(t.flatten(2, 3) for t in (q, k, v)),
                                  1.0 / math.sqrt(E), compile=False)
        got = fn(*inputs).unflatten(2, q_hw)
    assert got.shape == (2, heads, *q_hw, Ev)
    torch.testing.assert_close(got, attn2d.attention2d(q, k, v, pattern=p), atol=1e-5, rtol=1e-5)


def test_natten_peer_is_only_for_the_shifted_window():
    from attn2d import bench_cuda as bc
    from attn2d.patterns import YLG, Window

    t = torch.randn(1, 1, 6, 6, 8)
    assert "shifted" in bc.natten_peer(t, t, t, Window(3))
    assert "shifted" in bc.natten_peer(t, t, t, YLG(8))
    try:
        import natten  # noqa: F401
    except ImportError:
        assert "natten is not installed" in bc.natten_peer(t, t, t, Window(3, border="shift"))


def test_memory_case_module_is_the_planners_sagan_block():
    from attn2d import bench_cuda as bc

    block, module = bc.memory_case_module(bc.MemoryCase(64, 8))
    assert (module.channels, module.qk_channels, module.v_channels, module.heads,
            module.pool_kv) == (block.channels, block.qk_channels, block.v_channels,
                                block.heads, block.pool_kv)
    assert (module.out is not None, module.gamma is not None, module.residual) == (
        block.out_conv, block.gamma, block.residual)


def test_gpu_bench_markdown_names_the_device_and_the_planner_target():
    from attn2d import bench_cuda as bc

    runs = {"forward_runs_s": [1e-3], "backward_runs_s": [2e-3], "fwd_bwd_runs_s": [3e-3],
            "forward_s": 1e-3, "backward_s": 2e-3, "fwd_bwd_s": 3e-3}
    report = {
        "device": "Some GPU", "device_description": "Some GPU (80 GiB)", "device_type": "cuda",
        "reps": 5, "paired_seconds": 1.0, "calls_per_rep": 10,
        "cases": [
            {"kind": "dense", "name": "SAGAN x", "attn2d_backend": "triton", "results": {
                "attn2d": {**runs, "peak_bytes": 1 << 20},
                "sdpa-efficient": {**runs, "over_attn2d_forward": 1.5, "over_attn2d_backward": 2.0,
                                   "over_attn2d_fwd_bwd": 1.75, "max_abs_difference": 1e-6,
                                   "peak_bytes": 3 << 20},
                "sdpa-flash": {"refused": "Flash attention requires the same last dimension"}}},
            {"kind": "pattern", "name": "window x", "results": {
                "attn2d": {"forward_runs_s": [1e-3], "forward_s": 1e-3},
                "flex": {"forward_runs_s": [2e-3], "forward_s": 2e-3, "over_attn2d_forward": 2.0,
                         "max_abs_difference": 4e-3},
                "natten": {"refused": "natten is not installed"}}},
            {"kind": "memory", "name": "SAGAN block 64x64", "results": {
                "attn2d-global": {"measured_bytes": 100 << 20, "predicted_bytes": 95 << 20,
                                  "error": 0.05, "within_tolerance": True},
                "sdpa-math": {"measured_bytes": 100 << 20, "predicted_bytes": 50 << 20,
                              "error": 0.5, "within_tolerance": False}}}]}
    text = bc.markdown(report)
    assert "Device: Some GPU (80 GiB)" in text and text.count("On Some GPU;") == 3
    assert "| SAGAN x | attn2d (triton) | 1.000 ms | 2.000 ms | 3.000 ms |  | 1.0 MiB |  |" in text
    assert "| SAGAN x | sdpa-efficient | 1.000 ms | 2.000 ms | 3.000 ms | 1.50 / 2.00 / 1.75 | " \
        "3.0 MiB | 1.0e-06 |" in text
    assert "| SAGAN x | sdpa-flash | refused: Flash attention" in text
    assert "| window x | flex | 2.000 ms | 2.00 | 4.0e-03 |" in text
    assert "| window x | natten | unavailable: natten is not installed |" in text
    assert "| SAGAN block 64x64 | attn2d-global | 100.0 MiB | 95.0 MiB | 5.0% | yes |" in text
    assert "| SAGAN block 64x64 | sdpa-math | 100.0 MiB | 50.0 MiB | 50.0% | NO |" in text


def test_splice_between_markers_replaces_only_the_marked_part(tmp_path):
    from attn2d import bench_cuda as bc

    text = f"# Doc\n\nbefore\n{bc.BEGIN_MARKER}\nold figures\n{bc.END_MARKER}\nafter\n"
    spliced = bc.splice_between_markers(text, "\nnew table\n\n")
    assert spliced == f"# Doc\n\nbefore\n{bc.BEGIN_MARKER}\nnew table\n{bc.END_MARKER}\nafter\n"
    assert bc.splice_between_markers(spliced, "new table") == spliced  # a rerun changes nothing
    doc, body = tmp_path / "doc.md", tmp_path / "body.md"
    doc.write_text(text)
    body.write_text("| a | b |\n")
    bc.splice_file(str(doc), str(body))
    assert doc.read_text() == (f"# Doc\n\nbefore\n{bc.BEGIN_MARKER}\n| a | b |\n"
                               f"{bc.END_MARKER}\nafter\n")
    for bad, match in ((text.replace(bc.END_MARKER, ""), "once each"),
                       (text + bc.BEGIN_MARKER, "once each"),
                       (f"{bc.END_MARKER}\n{bc.BEGIN_MARKER}", "comes before")):
        with pytest.raises(ValueError, match=match):
            bc.splice_between_markers(bad, "x")


def test_benchmarks_doc_has_the_gpu_check_markers():
    from pathlib import Path

    from attn2d import bench_cuda as bc

    doc = (Path(__file__).parents[2] / "docs" / "benchmarks.md").read_text()
    assert doc.count(bc.BEGIN_MARKER) == 1 and doc.count(bc.END_MARKER) == 1
    assert doc.index(bc.BEGIN_MARKER) > doc.index("## GPU")


def test_gpu_check_script_parses():
    import subprocess
    from pathlib import Path

    script = Path(__file__).parents[2] / "scripts" / "gpu_check.sh"
    r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    text = script.read_text()
    assert "set -euo pipefail" in text and "bench --device cuda" in text
    assert "plan --validate --device cuda" in text and '-m "triton or gpu"' in text


# ---------------------------------------------------------------------------------------------
# Reported statistics, on a fake clock: workloads whose every forward and backward takes a
# known time, so that each reported time must be the median of its recorded runs and each ratio
# the median of per-rep ratios, which the schedules below make differ from the ratio of medians.

UNIT = 2.0**-10  # dyadic, so that every difference of the fake clock's readings is exact


class FakeClock:
    """Seconds that pass only when a fake workload runs."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class _Cost(torch.autograd.Function):
    """Identity whose backward advances the clock by backward_s."""

    @staticmethod
    def forward(ctx, x, clock, backward_s):
        ctx.clock, ctx.backward_s = clock, backward_s
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        ctx.clock.now += ctx.backward_s
        return g, None, None


def _workload(clock, log, tag, forward, backward=(1,), compute=lambda *t: t[0] * 1.0):
    """fn(*inputs) whose i-th call (the warm-up's included) takes forward[i % len] units and
    its backward backward[i % len]; every call appends `tag` to `log`."""
    count = itertools.count()

    def fn(*t):
        i = next(count)
        log.append(tag)
        clock.now += forward[i % len(forward)] * UNIT
        out = compute(*t)
        return _Cost.apply(out, clock, backward[i % len(backward)] * UNIT) if out.requires_grad \
            else out

    return fn


def _assert_paired(peer_runs, ours_runs, reported):
    """reported is the median of per-rep ratios of the two sides' runs, not their medians'."""
    per_rep = statistics.median(p / o for p, o in zip(peer_runs, ours_runs))
    of_medians = statistics.median(peer_runs) / statistics.median(ours_runs)
    assert len(peer_runs) == len(ours_runs)
    assert reported == per_rep
    assert reported != pytest.approx(of_medians)  # the schedules tell the two apart


def _assert_medians(r, keys=("forward", "backward", "fwd_bwd")):
    for key in keys:
        assert r[f"{key}_s"] == statistics.median(r[f"{key}_runs_s"])


def _fake_timed(monkeypatch, module, clock):
    """module's time_training_steps reading `clock`."""
    real = bench.time_training_steps

    def timed(*args, **kwargs):
        return real(*args, clock=clock, **kwargs)

    monkeypatch.setattr(module, "time_training_steps", timed)


def test_fake_clock_times_are_medians_of_runs_and_ratios_medians_of_per_rep_ratios():
    clock, log = FakeClock(), []
    # Index 0 is the warm-up's; then 5 reps.
    a = _workload(clock, log, "A", forward=[1, 1, 2, 3, 5, 8], backward=[1, 1, 16, 2, 8, 4])
    b = _workload(clock, log, "B", forward=[1, 4, 3, 9, 6, 40], backward=[1, 2, 1, 8, 4, 32])
    ours, peer = bench.time_training_steps([a, b], [torch.randn(3)], reps=5, clock=clock)
    # A and B alternate which goes first: AB BA AB BA AB after the warm-ups.
    assert log == ["A", "B"] + ["A", "B", "B", "A"] * 2 + ["A", "B"]
    assert ours["forward_runs_s"] == [x * UNIT for x in (1, 2, 3, 5, 8)]
    assert peer["forward_runs_s"] == [x * UNIT for x in (4, 3, 9, 6, 40)]
    assert ours["backward_runs_s"] == [x * UNIT for x in (1, 16, 2, 8, 4)]
    assert peer["backward_runs_s"] == [x * UNIT for x in (2, 1, 8, 4, 32)]
    for r in (ours, peer):
        _assert_medians(r)
    assert ours["forward_s"] == 3 * UNIT and peer["forward_s"] == 6 * UNIT
    for key in ("forward", "backward"):
        _assert_paired(peer[f"{key}_runs_s"], ours[f"{key}_runs_s"],
                       bench.paired_speedup(peer, ours, key))
    assert bench.paired_speedup(peer, ours, "forward") == 3.0  # 2.0 as a ratio of medians
    # The pattern bench's fixed order: A B in every rep.
    log.clear()
    bench.time_training_steps([a, b], [torch.randn(3)], reps=3, clock=clock, order="fixed")
    assert log == ["A", "B"] * 4


def test_forward_only_steps_time_forwards_alone():
    clock, log = FakeClock(), []
    plain = _workload(clock, log, "A", forward=[1, 2, 3])
    no_grad = _workload(clock, log, "B", forward=[4], compute=lambda *t: t[0].detach() * 1.0)
    a, b = bench.time_training_steps([plain, no_grad], [torch.randn(3)], reps=2,
                                     backward=False, clock=clock)
    assert set(a) == set(b) == {"forward_s", "forward_runs_s", "forward_faults"}
    assert a["forward_runs_s"] == [2 * UNIT, 3 * UNIT] and b["forward_runs_s"] == [4 * UNIT] * 2
    assert log == ["A", "B", "A", "B", "B", "A"]


def test_rep_order_alternates_or_stays_fixed():
    assert [bench.rep_order(3, r) for r in range(3)] == [[0, 1, 2], [2, 1, 0], [0, 1, 2]]
    assert bench.rep_order(2, 1, "fixed") == [0, 1]
    assert bench.rep_order(0, 5) == []
    with pytest.raises(ValueError, match="order must be one of"):
        bench.rep_order(2, 0, "random")
    with pytest.raises(ValueError, match=">= 0"):
        bench.rep_order(2, -1)
    with pytest.raises(TypeError, match="count must be an int"):
        bench.rep_order(2.0, 0)


def test_time_training_steps_rejects_bad_arguments():
    x = [torch.randn(3)]
    for kwargs, error, match in (
            (dict(fns=[]), TypeError, "non-empty list of callables"),
            (dict(fns=[1]), TypeError, "non-empty list of callables"),
            (dict(reps=0), ValueError, "reps must be >= 1"),
            (dict(reps=2.0), TypeError, "reps must be an int"),
            (dict(min_seconds=-1.0), ValueError, "min_seconds"),
            (dict(min_seconds=float("nan")), ValueError, "min_seconds"),
            (dict(order="abba"), ValueError, "order must be one of"),
            (dict(clock=3.0), TypeError, "clock must be callable")):
        args = {"fns": [lambda t: t * 2.0], "inputs": x, "reps": 1, **kwargs}
        with pytest.raises(error, match=match):
            bench.time_training_steps(**args)


def _fake_attention(clock, log):
    """attn2d.attention on a fake clock: naive attention, fp32 and bf16 with schedules of their
    own."""
    def naive(q, k, v, scale=None):
        return torch.softmax(q @ k.transpose(-1, -2) * scale, -1) @ v

    fp32 = _workload(clock, log, "A", [3, 1, 2, 3, 5, 8, 2], [2, 1, 16, 2, 8, 4], compute=naive)
    bf16 = _workload(clock, log, "H", [2, 1, 1, 4, 2], [1, 3, 1, 5, 2], compute=naive)
    one_thread = _workload(clock, log, "1", [5, 4, 9, 7, 12, 6], [3, 9, 5, 20, 4],
                           compute=naive)

    def attention(q, k, v, scale=None):
        if q.dtype == torch.bfloat16:
            return bf16(q, k, v, scale)
        return (one_thread if torch.get_num_threads() == 1 else fp32)(q, k, v, scale)

    return attention


def test_dense_bench_reports_paired_ratios_and_medians(monkeypatch):
    import attn2d

    clock, log = FakeClock(), []
    monkeypatch.setattr(attn2d, "attention", _fake_attention(clock, log))
    _fake_timed(monkeypatch, bench, clock)

    def naive(q, k, v, scale):
        return torch.softmax(q @ k.transpose(-1, -2) * scale, -1) @ v

    def refuses(q, k, v, scale):
        raise RuntimeError("no kernel for these shapes")

    peer = _workload(clock, log, "P", [4, 3, 9, 6, 40, 7], [2, 3, 8, 4, 32, 1], compute=naive)
    monkeypatch.setattr(bench, "PEERS", {"peer": peer, "refuses": refuses})
    case = bench.Case("tiny", 1, 1, 16, 16, 8, 8)
    out = bench.run_case(case, reps=5, peers=["peer", "refuses"], with_memory=False,
                         paired_seconds=0.0)
    r = out["results"]
    assert list(r) == ["attn2d", "peer", "refuses", "attn2d-bf16"]
    assert r["refuses"] == {"refused": "no kernel for these shapes"}
    # The fp32 / bf16 pair, then the peer's pair with attn2d, each alternating after its warm-up.
    assert log[:12] == ["A", "H"] + ["A", "H", "H", "A"] * 2 + ["A", "H"]
    assert log[12:24] == ["A", "P"] + ["A", "P", "P", "A"] * 2 + ["A", "P"]
    for name in ("attn2d", "peer", "attn2d-bf16"):
        _assert_medians(r[name])
        assert len(r[name]["forward_runs_s"]) == 5
    p, ours, bf16 = r["peer"], r["attn2d"], r["attn2d-bf16"]
    for key in ("forward", "backward", "fwd_bwd"):
        _assert_paired(p[f"{key}_runs_s"], p[f"attn2d_{key}_runs_s"],
                       p[f"attn2d_speedup_{key}"])
    # The peer's own attn2d runs, not the attn2d row's (those are from its pair with bf16).
    assert p["attn2d_forward_runs_s"] != ours["forward_runs_s"]
    for key in ("forward", "backward"):
        _assert_paired(ours[f"{key}_runs_s"], bf16[f"{key}_runs_s"],
                       bf16[f"bf16_speedup_{key}"])
        _assert_paired(bf16[f"{key}_runs_s"], ours[f"{key}_runs_s"],
                       bf16[f"attn2d_speedup_{key}"])
    report = {"machine": "m", "threads": 1, "fma_peak_gflops": 1.0, "reps": 5,
              "paired_seconds": 0.0, "peers": ["peer", "refuses"], "cases": [out]}
    text = bench._markdown(report)
    assert (f"| {p['attn2d_speedup_forward']:.2f} / {p['attn2d_speedup_backward']:.2f} |"
            in text)
    # The plot's bar: attn2d's time over the peer's, the median of per-rep ratios.
    _assert_paired(p["attn2d_fwd_bwd_runs_s"], p["fwd_bwd_runs_s"],
                   bench._relative_speed(r, "peer"))
    assert bench._relative_speed(r, "refuses") == 0.0 and bench._relative_speed(r, "attn2d") == 1


def test_dense_bench_thread_scaling_is_paired_with_all_threads(monkeypatch):
    import attn2d

    clock, log = FakeClock(), []
    monkeypatch.setattr(attn2d, "attention", _fake_attention(clock, log))
    _fake_timed(monkeypatch, bench, clock)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # "all threads" differs from one on any machine
    try:
        out = bench.run_case(bench.Case("tiny", 1, 1, 16, 16, 8, 8), reps=5, peers=[],
                             with_memory=False, thread_scaling=True, paired_seconds=0.0)
        assert torch.get_num_threads() == 2  # the interleaved 1-thread runs restore it
    finally:
        torch.set_num_threads(threads)
    one = out["results"]["attn2d-1thread"]
    # The all-thread and 1-thread steps alternate which goes first.
    assert log[-12:] == ["A", "1"] + ["A", "1", "1", "A"] * 2 + ["A", "1"]
    _assert_medians(one)
    for key in ("forward", "backward"):
        _assert_paired(one[f"{key}_runs_s"], one[f"attn2d_{key}_runs_s"],
                       one[f"attn2d_scaling_{key}"])
    _assert_paired(one["fwd_bwd_runs_s"], one["attn2d_fwd_bwd_runs_s"],
                   one["attn2d_speedup_fwd_bwd"])


def test_dense_bench_rejects_bad_arguments():
    case = bench.Case("tiny", 1, 1, 16, 16, 8, 8)
    with pytest.raises(ValueError, match="unknown peers"):
        bench.run_case(case, reps=1, peers=["tensorflow"], with_memory=False)
    with pytest.raises(TypeError, match="reps must be an int"):
        bench.run_case(case, reps="5", peers=[], with_memory=False)
    with pytest.raises(ValueError, match="paired_seconds"):
        bench.run_case(case, reps=1, peers=[], with_memory=False, paired_seconds=-1.0)


def test_pattern_bench_peer_ratios_are_paired(monkeypatch):
    import attn2d
    from attn2d import bench_patterns as bp
    from attn2d.patterns import Window

    clock, log = FakeClock(), []
    glob = _workload(clock, log, "G", [8, 9, 7], [16, 17])
    pattern = _workload(clock, log, "P", [3, 1, 2, 3, 5, 8, 2], [2, 1, 16, 2, 8, 4])
    dense = _workload(clock, log, "D", [4, 3, 9, 6, 40, 7], [2, 3, 8, 4, 32, 1])
    flex = _workload(clock, log, "F", [1, 1, 7, 12, 2, 9], compute=lambda q: q.detach() * 1.0)

    def attention2d(q, k, v, pattern=None, **kw):
        return (glob if pattern is None else pattern_step)(q, k, v)

    pattern_step = pattern
    monkeypatch.setattr(attn2d, "attention2d", attention2d)
    monkeypatch.setattr(bp, "dense_masked_math", lambda q, k, v, mask: dense(q, k, v))
    monkeypatch.setattr(bp, "flex_forward", lambda case, q, k, v: (lambda: flex(q)))
    _fake_timed(monkeypatch, bp, clock)
    case = bp.PatternCase("w", 1, (6, 6), (6, 6), 4, 4, Window(3))
    reps = 5
    out = bp.run_case(case, reps=reps, with_memory=False, with_flex=True, log=lambda line: None,
                      paired_seconds=0.0)
    r, s = out["results"], out["summary"]
    steps = ["G"] + ["P"] * (bp.STEADY_STEPS + 1)
    main = len(steps) * (reps + 1)
    assert log[:main] == steps * (reps + 1)  # fixed order: "after global" is the first P
    pair = ["P", "D", "D", "P"] * 2 + ["P", "D"]
    assert log[main:main + 12] == ["P", "D"] + pair
    assert log[main + 12:] == ["P", "F"] + [x.replace("D", "F") for x in pair]
    for name in ("attn2d-pattern", "attn2d-global", "attn2d-pattern-steady", "dense-masked-math"):
        _assert_medians(r[name])
    _assert_medians(r["flex-forward"], keys=("forward",))
    d, f = r["dense-masked-math"], r["flex-forward"]
    _assert_paired(d["forward_runs_s"], d["attn2d_forward_runs_s"], s["dense_over_attn2d_fwd"])
    _assert_paired(d["backward_runs_s"], d["attn2d_backward_runs_s"], s["dense_over_attn2d_bwd"])
    _assert_paired(f["forward_runs_s"], f["attn2d_forward_runs_s"], s["flex_over_attn2d_fwd"])
    assert "attn2d_backward_runs_s" not in f  # Flex's pair times forwards alone
    # The per-pair ratios: the pattern's step right after the global one, rep by rep.
    ours, g = r["attn2d-pattern"], r["attn2d-global"]
    scale = s["global_pairs"] / s["allowed_pairs"]
    assert s["per_pair_ratio_fwd"] == statistics.median(
        o / x for o, x in zip(ours["forward_runs_s"], g["forward_runs_s"])) * scale
    report = {"machine": "m", "threads": 1, "reps": reps, "paired_seconds": 0.0, "cases": [out]}
    text = bp._markdown(report)
    assert f"| {s['flex_over_attn2d_fwd']:.2f} | {s['dense_over_attn2d_fwd']:.1f} / " in text


def test_double_backward_bench_ratio_is_paired(monkeypatch):
    from attn2d import bench_double_backward as bdb

    clock, log = FakeClock(), []
    steps = {"attn2d": _workload(clock, log, "A", [3, 1, 2, 3, 5, 8], [2, 1, 16, 2, 8, 4],
                                 compute=lambda x: x.sum() * 1.0),
             "math": _workload(clock, log, "M", [4, 3, 9, 6, 40, 7], [2, 3, 8, 4, 32, 1],
                               compute=lambda x: x.sum() * 1.0)}
    monkeypatch.setattr(bdb, "r1_penalty_fn", lambda impl, module, readout: steps[impl])
    monkeypatch.setattr(bdb, "check_agreement", lambda fns, x: 0.0)  # its calls are not timed
    _fake_timed(monkeypatch, bench, clock)
    row = bdb.run_case(8, 4, reps=5, with_memory=False)
    assert log == ["A", "M"] + ["A", "M", "M", "A"] * 2 + ["A", "M"]
    runs = row["runs_s"]
    for impl in ("attn2d", "math"):
        assert row["median_s"][impl] == statistics.median(runs[impl]) and len(runs[impl]) == 5
    _assert_paired(runs["math"], runs["attn2d"], row["speedup_median_of_ratios"])
    text = bdb.markdown([row], "m")
    assert f"{row['speedup_median_of_ratios']:.2f}x" in text and "median over reps" in text


def test_gpu_bench_ratios_are_paired(monkeypatch):
    from attn2d import bench_cuda as bc

    clock, log = FakeClock(), []
    monkeypatch.setattr(bc._Clock, "mark", lambda self: clock())
    ours = _workload(clock, log, "A", [3, 1, 2, 3, 5, 8], [2, 1, 16, 2, 8, 4])
    peer = _workload(clock, log, "P", [4, 3, 9, 6, 40, 7], [2, 3, 8, 4, 32, 1])
    x = torch.randn(3)
    timed = bc.time_interleaved([ours, peer], [[x], [x]], reps=5, backward=True, calls=1)
    assert log == ["A", "P"] + ["A", "P", "P", "A"] * 2 + ["A", "P"]
    results = {"attn2d": timed[0], "peer": timed[1], "refused": {"refused": "no"}}
    bc._add_ratios(results, ("forward", "backward", "fwd_bwd"))
    for key in ("forward", "backward", "fwd_bwd"):
        _assert_medians(results["peer"], (key,))
        _assert_paired(results["peer"][f"{key}_runs_s"], results["attn2d"][f"{key}_runs_s"],
                       results["peer"][f"over_attn2d_{key}"])
    assert "over_attn2d_forward" not in results["attn2d"] and results["refused"] == {
        "refused": "no"}


def test_reports_name_the_cpu_model_its_numbers_and_instruction_sets():
    from attn2d._machine import cpu_name

    cpuinfo = ("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
               "model name\t: Intel(R) Xeon(R) Platinum 8480+\n"
               "flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16\n\n"
               "processor\t: 1\nmodel name\t: another\n")
    name = cpu_name(cpuinfo)
    assert name.startswith("Intel(R) Xeon(R) Platinum 8480+ (family 6, model 143; "
                           "AVX-512, AVX512-BF16, AMX; ")
    assert name.endswith(" CPUs)")
    assert "AVX512-FP16" not in name and "another" not in name
    # This machine's: its model name from /proc/cpuinfo, not only "x86_64".
    with open("/proc/cpuinfo") as f:
        model = next((line.split(":", 1)[1].strip() for line in f
                      if line.startswith("model name")), None)
    if model:
        assert cpu_name().startswith(model + " (")
