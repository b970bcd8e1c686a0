"""Memory planner: will an attention block fit on a GPU, at what batch, and which configuration
should be used? Answers come from a memory model (below) that tests/python/test_planner.py checks
against memory measured on the CPU.

The model, per sample, for one forward + backward (training) of the block:

- Quadratic term, implementations that materialise attention: c * heads * N * M * bytes, with
  N queries and M keys. c counts the N x M matrices alive at the peak; it was counted in the code
  and confirmed by measurement (tests/python/test_planner.py): the ProGAN conv block (bmm,
  softmax, bmm) keeps energy and attention, then its backward holds attention, its gradient, the
  softmax gradient and a temporary: c = 4; nn.MultiheadAttention and SDPA's math path fuse the
  softmax backward: c = 3. Inference: scores and probabilities, c = 2. attn2d: c = 0.
- Linear term: the block's saved activations and their gradients, LIN_TRAIN x the forward's
  saved elements per token x N x bytes (LIN_TRAIN = 2.75 for the conv block, where 1x1 conv
  backward holds extra copies, and 1.3 for the token block, measured on warm runs; inference: 1).
- Fused kernels (attn2d's, SDPA's flash, mem-efficient and cuDNN) store no N x M matrix; each
  keeps one float32 log-sum-exp per head and query (and its backward one more, rowsum(dO * O)).
  SDPA's flash backward and its mem-efficient backward in 16-bit add a float32 dQ accumulator
  (torch's kernels; flash rounds the head width up to 32).
- Not modelled: weights, optimizer state, the CUDA context (the `usable` memory of a device
  leaves 10% or at least 1 GiB for them).

Every device is a CUDA GPU; each row says whether it runs there (`refusal`: SDPA's kernels by
torch's sdp_utils rules, attn2d's by Triton's) and the recommendation is the fastest exact row
that runs and fits, by SPEED_ORDER. `validate` measures the model: on the CPU the ProGAN blocks
in a subprocess (peak resident memory), on CUDA every row that runs
(torch.cuda.max_memory_allocated).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Optional

GiB = 1 << 30

# Card memory in GiB; usable = total - max(1 GiB, 10%).
DEVICES = {
    "rtx3060": ("RTX 3060 12 GB", 12.0),
    "t4": ("T4 16 GB (Colab)", 16.0),
    "rtx3090": ("RTX 3090 24 GB", 24.0),
    "v100": ("V100 32 GB", 32.0),
    "a100-40": ("A100 40 GB", 40.0),
    "a100-80": ("A100 80 GB", 80.0),
    "h100": ("H100 80 GB", 80.0),
    "h200": ("H200 141 GB", 141.0 * 1e9 / GiB),
}

# Compute capability of each preset: which SDPA kernels and which Triton code paths exist.
COMPUTE_CAPABILITY = {
    "rtx3060": (8, 6), "t4": (7, 5), "rtx3090": (8, 6), "v100": (7, 0), "a100-40": (8, 0),
    "a100-80": (8, 0), "h100": (9, 0), "h200": (9, 0),
}
# A card given only by --memory is taken to be sm80 or newer, and the plan's header says so.
ASSUMED_CAPABILITY = (8, 0)

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
IMPLEMENTATIONS = ("pytorch-unfused", "sdpa-math", "sdpa-mem-efficient", "sdpa-flash",
                   "sdpa-cudnn", "attn2d-global", "attn2d-local", "attn2d-downsampled")
# Rows that compute exact global attention, fastest first on CUDA. An assumption, which
# `attn2d plan --validate --device cuda` times: FlashAttention-2 and cuDNN beat a Triton port
# of FlashAttention-2 on the shapes they accept; attn2d's Triton tiles fit E != Ev and narrow
# heads (SAGAN's E=8, Ev=64), which mem-efficient runs in tiles cut for wider heads. Below sm80
# Triton has no supported tensor-core path (sm70 falls back to FMA), so mem-efficient leads.
SPEED_ORDER = ("sdpa-flash", "sdpa-cudnn", "attn2d-global", "sdpa-mem-efficient", "sdpa-math",
               "pytorch-unfused")
SPEED_ORDER_BELOW_SM80 = ("sdpa-flash", "sdpa-cudnn", "sdpa-mem-efficient", "attn2d-global",
                          "sdpa-math", "pytorch-unfused")
FUSED = ("sdpa-mem-efficient", "sdpa-flash", "sdpa-cudnn", "attn2d-global", "attn2d-local",
         "attn2d-downsampled")
# What runs each row on CUDA, for the recommendation's text.
RUNS_ON = {
    "pytorch-unfused": "the block's own matmul-softmax-matmul",
    "sdpa-math": "torch SDPA's math kernel",
    "sdpa-mem-efficient": "torch SDPA's mem-efficient kernel",
    "sdpa-flash": "torch SDPA's flash kernel",
    "sdpa-cudnn": "torch SDPA's cuDNN kernel",
    "attn2d-global": "attn2d's Triton kernels",
    "attn2d-local": "attn2d's Triton kernels",
    "attn2d-downsampled": "attn2d's Triton kernels",
}
QUADRATIC_TRAIN = {"conv": 4, "tokens": 3}  # pytorch-unfused, by block kind
QUADRATIC_TRAIN_SDPA_MATH = 3
QUADRATIC_INFER = 2
# Token block 1.3: fitted to attn2d's warm (second) training step at 64x64 and 128x128 (52.4 MiB
# at 128x128); a process's first step also maps thread stacks and allocator pools, which are not
# activations and are left out.
LIN_TRAIN = {"conv": 2.75, "tokens": 1.3}


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"attn2d.planner: {name} must be an int; got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"attn2d.planner: {name} must be >= 1; got {value}")
    return value


@dataclass(frozen=True)
class Block:
    """An attention block. kind "conv": SAGAN-style 1x1 convs (the ProGAN generator's
    SelfAttention2, the SAGAN/BigGAN block); kind "tokens": LayerNorm + multi-head attention +
    feed-forward (the ProGAN generator's SelfAttention). qk_channels and v_channels are totals
    over the heads."""

    name: str
    kind: str
    channels: int
    heads: int = 1
    qk_channels: Optional[int] = None
    v_channels: Optional[int] = None
    pool_kv: int = 1
    out_conv: bool = False
    gamma: bool = False
    residual: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("conv", "tokens"):
            raise ValueError(f"attn2d.planner: kind must be 'conv' or 'tokens'; got {self.kind!r}")
        _positive("channels", self.channels)
        _positive("heads", self.heads)
        _positive("pool_kv", self.pool_kv)
        if self.kind == "tokens":
            object.__setattr__(self, "qk_channels", self.channels)
            object.__setattr__(self, "v_channels", self.channels)
        if self.qk_channels is None:
            object.__setattr__(self, "qk_channels", max(self.channels // 8, 1))
        if self.v_channels is None:
            object.__setattr__(self, "v_channels", self.channels)
        _positive("qk_channels", self.qk_channels)
        _positive("v_channels", self.v_channels)
        for name in ("qk_channels", "v_channels"):
            if getattr(self, name) % self.heads:
                raise ValueError(
                    f"attn2d.planner: heads ({self.heads}) must divide {name} "
                    f"({getattr(self, name)})"
                )
        if self.channels % self.heads:
            raise ValueError(
                f"attn2d.planner: heads ({self.heads}) must divide channels ({self.channels})"
            )

    def saved_per_token(self, pool: int) -> float:
        """Elements the forward keeps for the backward, per query token."""
        C, dq, dv = self.channels, self.qk_channels, self.v_channels
        if self.kind == "tokens":
            # LN out, qkv (3C), attention out, residual sum, FF LN, linear, GELU, output.
            return 10.0 * C
        extra = C * (int(self.out_conv) + int(self.gamma) + int(self.residual))
        return dq + (dq + dv) / pool**2 + dv + extra

    def projection_flops_per_token(self) -> float:
        C, dq, dv = self.channels, self.qk_channels, self.v_channels
        if self.kind == "tokens":
            return 2.0 * (3 * C * C + C * C + 2 * C * C)  # in_proj, out_proj, feed-forward
        return 2.0 * C * (2 * dq + dv) + (2.0 * dv * C if self.out_conv else 0.0)


def progan_blocks(channels: int) -> list[Block]:
    """Both attention blocks of the ProGAN generator (attn2d.unfused_blocks): LayerNorm +
    nn.MultiheadAttention, and the conv block."""
    return [
        Block("ProGAN SelfAttention (LN + MHA 4 heads + FF)", "tokens", channels, heads=4),
        Block("ProGAN SelfAttention2 (convs, q/k C/8, v C)", "conv", channels,
              qk_channels=channels // 8 if channels >= 8 else None, v_channels=channels),
    ]


def sagan_block(channels: int) -> Block:
    return Block("SAGAN/BigGAN (q/k C/8, v C/2, 2x2-pooled keys)", "conv", channels,
                 qk_channels=max(channels // 8, 1), v_channels=max(channels // 2, 1), pool_kv=2,
                 out_conv=True, gamma=True, residual=True)


@dataclass(frozen=True)
class Pattern:
    """global, a window of size x size (chebyshev/manhattan/euclidean), or YLG."""

    kind: str = "global"
    size: int = 0
    metric: str = "chebyshev"

    @staticmethod
    def parse(text: str) -> "Pattern":
        parts = text.split(":")
        if parts[0] == "global" and len(parts) == 1:
            return Pattern()
        if parts[0] == "ylg" and len(parts) == 1:
            return Pattern("ylg")
        if parts[0] == "window" and len(parts) in (2, 3):
            try:
                size = int(parts[1])
            except ValueError:
                size = 0
            metric = parts[2] if len(parts) == 3 else "chebyshev"
            if size < 1:
                raise ValueError(f"attn2d.planner: window size must be an int >= 1; got {text!r}")
            if metric not in ("chebyshev", "manhattan", "euclidean"):
                raise ValueError(f"attn2d.planner: unknown window metric {metric!r}")
            return Pattern("window", size, metric)
        raise ValueError(
            f"attn2d.planner: pattern must be 'global', 'ylg' or 'window:SIZE[:METRIC]'; "
            f"got {text!r}"
        )

    def keys_per_query(self, keys: int, grid_w: int) -> float:
        if self.kind == "global":
            return float(keys)
        if self.kind == "ylg":
            # ESA heads: floor patterns see half a block of sqrt(n) on average, repetitive ones
            # one key per block: ~0.75 sqrt(n) over the official head mix.
            return min(float(keys), 0.75 * math.sqrt(keys) + 1.0)
        r = self.size // 2
        if self.metric == "manhattan":
            area = 2 * r * r + 2 * r + 1
        elif self.metric == "euclidean":
            area = math.pi * r * r
        else:
            area = self.size * self.size
        return min(float(keys), float(area))

    def label(self) -> str:
        if self.kind == "window":
            return f"window {self.size} ({self.metric})"
        return self.kind


@dataclass(frozen=True)
class Setting:
    height: int
    width: int
    batch: int = 1
    dtype: str = "fp32"
    training: bool = True
    pattern: Pattern = field(default_factory=Pattern)
    downsample: int = 1
    checkpoint: bool = False

    def __post_init__(self) -> None:
        _positive("height", self.height)
        _positive("width", self.width)
        _positive("batch", self.batch)
        _positive("downsample", self.downsample)
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(
                f"attn2d.planner: dtype must be one of {sorted(DTYPE_BYTES)}; got {self.dtype!r}"
            )


@dataclass
class Estimate:
    implementation: str
    memory_bytes: float  # peak activation memory of the block at the setting's batch
    per_sample_bytes: float
    flops: float
    available: bool
    note: str = ""
    fits: Optional[bool] = None
    max_batch: Optional[int] = None


def estimate(block: Block, setting: Setting, implementation: str) -> Estimate:
    """Peak activation memory and FLOPs of one forward (+ backward when training)."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"attn2d.planner: implementation must be one of {IMPLEMENTATIONS}; "
            f"got {implementation!r}"
        )
    e = DTYPE_BYTES[setting.dtype]
    s = setting.downsample
    if implementation == "attn2d-downsampled" and s == 1:
        s = 2
    h, w = max(setting.height // s, 1), max(setting.width // s, 1)
    n = h * w
    pool = block.pool_kv
    m = max(h // pool, 1) * max(w // pool, 1)
    pattern = setting.pattern
    if implementation == "attn2d-local" and pattern.kind == "global":
        pattern = Pattern("window", 16)  # the local row's default: a 16 x 16 window
    # Only the local row visits fewer keys; dense-masked implementations of a pattern (YLG's
    # official code) still compute all N x M scores.
    keys = pattern.keys_per_query(m, w) if implementation == "attn2d-local" else float(m)

    kind = block.kind
    if implementation == "pytorch-unfused":
        c = QUADRATIC_TRAIN[kind] if setting.training else QUADRATIC_INFER
    elif implementation == "sdpa-math":
        c = QUADRATIC_TRAIN_SDPA_MATH if setting.training else QUADRATIC_INFER
    else:
        c = 0
    quadratic = c * block.heads * n * m * e
    saved = block.saved_per_token(pool)
    if setting.training:
        if setting.checkpoint and implementation.startswith("attn2d"):
            # Only the block's input and output are kept; the backward recomputes the rest.
            linear = (block.channels + LIN_TRAIN[kind] * saved) * n * e
        else:
            linear = LIN_TRAIN[kind] * saved * n * e
    else:
        linear = saved * n * e
    if implementation in FUSED:
        linear += (2 if setting.training else 1) * block.heads * n * 4
        if setting.training and (implementation == "sdpa-flash"
                                 or (implementation == "sdpa-mem-efficient" and e == 2)):
            width = block.qk_channels // block.heads
            if implementation == "sdpa-flash":
                width = -(-width // 32) * 32
            linear += block.heads * n * width * 4
    if s > 1:
        # The stride-s conv's output and the transposed conv's full-size output (and grads).
        full = setting.height * setting.width
        linear += (2 if setting.training else 1) * block.channels * (n + full) * e
    per_sample = quadratic + linear
    attention_flops = 2.0 * n * keys * (block.qk_channels + block.v_channels)
    flops_fwd = attention_flops + block.projection_flops_per_token() * n
    flops = flops_fwd * (3.5 if setting.training else 1.0)
    available, note = True, ""
    if implementation == "attn2d-local":
        note = f"{pattern.label()}: {keys:.0f} keys per query"
    elif implementation == "attn2d-downsampled":
        note = f"attention on {h}x{w} (downsample {s})"
    elif implementation == "pytorch-unfused" and pattern.kind != "global":
        note = "dense mask: still N x M scores"
    return Estimate(implementation, per_sample * setting.batch, per_sample,
                    flops * setting.batch, available, note)


def usable_bytes(total_bytes: float) -> float:
    return total_bytes - max(1.0 * GiB, 0.1 * total_bytes)


def _sm(capability: tuple[int, int]) -> str:
    return f"sm{capability[0]}{capability[1]}"


def _check_capability(capability: object) -> tuple[int, int]:
    if (not isinstance(capability, tuple) or len(capability) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                       for x in capability)):
        raise ValueError(f"attn2d.planner: capability must be a (major, minor) tuple of ints; "
                         f"got {capability!r}")
    return capability


def _mem_efficient_alignment(half: bool, capability: tuple[int, int]) -> int:
    """The head-width multiple SDPA's mem-efficient kernel needs: torch's
    minimum_gemm_alignment (4 from sm80 on, 128 bits where tensor cores run the dtype)."""
    tensor_cores = capability >= (8, 0) or (capability >= (7, 0) and half)
    alignment = 4 if capability >= (8, 0) else 1
    return max(alignment, 128 // (16 if half else 32)) if tensor_cores else alignment


def refusal(block: Block, setting: Setting, implementation: str,
            capability: tuple[int, int] = ASSUMED_CAPABILITY) -> str:
    """Why `implementation` cannot run the block's global attention on a CUDA GPU of compute
    capability `capability`, or "" where it can. SDPA's kernels follow torch's rules
    (sdp_utils.cpp: can_use_flash_attention, can_use_mem_efficient_attention,
    can_use_cudnn_attention), conservative where they vary with the torch or cuDNN version;
    attn2d's rows run on its Triton kernels."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"attn2d.planner: implementation must be one of {IMPLEMENTATIONS}; "
                         f"got {implementation!r}")
    capability = _check_capability(capability)
    sm, dtype = _sm(capability), setting.dtype
    e, ev = block.qk_channels // block.heads, block.v_channels // block.heads
    half = dtype in ("fp16", "bf16")
    why = []
    if implementation in ("pytorch-unfused", "sdpa-math"):
        return ""
    if implementation.startswith("attn2d"):
        if capability < (7, 0):
            why.append(f"Triton compiles for sm70 or newer, got {sm}")
        elif dtype == "bf16" and capability < (8, 0):
            why.append(f"Triton's bf16 needs sm80 or newer, got {sm} (use fp16)")
    elif implementation == "sdpa-mem-efficient":
        alignment = _mem_efficient_alignment(half, capability)
        if capability < (5, 0):
            why.append(f"needs sm50 or newer, got {sm}")
        if dtype == "bf16" and capability < (8, 0):
            why.append(f"bf16 needs sm80 or newer, got {sm}")
        if e % alignment or ev % alignment:
            why.append(f"needs head widths that are multiples of {alignment} in {dtype} on "
                       f"{sm}, got E={e}, Ev={ev}")
    else:
        # flash and cuDNN: torch's rules, except that a head width off a multiple of 8 (which
        # newer torch pads for flash) and cuDNN's E != Ev (which some cuDNN versions take)
        # count as refusals, so that a plan never names a kernel an older install lacks.
        limit = 256 if implementation == "sdpa-flash" else 128
        if capability < (8, 0):
            why.append(f"needs sm80 or newer, got {sm}")
        if not half:
            why.append(f"needs fp16 or bf16, got {dtype}")
        if e != ev:
            why.append(f"needs equal head widths, got E={e}, Ev={ev}")
        elif e % 8:
            why.append(f"needs a head width that is a multiple of 8, got E={e}")
        elif e > limit:
            why.append(f"takes head widths up to {limit}, got E={e}")
        elif (implementation == "sdpa-flash" and setting.training and e > 192
              and (capability[0] == 12 or (8, 6) <= capability <= (8, 9))):
            why.append(f"its backward takes head widths up to 192 on {sm}, got E={e}")
    return "; ".join(why)


def speed_order(capability: tuple[int, int]) -> tuple[str, ...]:
    """The exact global rows, fastest first on a GPU of this compute capability (an
    assumption: see SPEED_ORDER)."""
    return SPEED_ORDER if _check_capability(capability) >= (8, 0) else SPEED_ORDER_BELOW_SM80


@dataclass
class Plan:
    block: Block
    setting: Setting
    device: str
    memory_bytes: float
    usable_bytes: float
    estimates: list[Estimate]
    recommendation: str
    capability: tuple[int, int] = ASSUMED_CAPABILITY


def plan(block: Block, setting: Setting, *, device: Optional[str] = None,
         memory_gib: Optional[float] = None,
         capability: Optional[tuple[int, int]] = None) -> Plan:
    """Every implementation's memory, FLOPs, whether it runs on the GPU and fits, its largest
    batch, and a recommendation: the fastest exact global path that runs and fits, else the
    cheapest option that does. `device` is a preset of DEVICES (default rtx3090 unless
    memory_gib is given); memory_gib overrides its memory; capability (major, minor) overrides
    its compute capability (a card given by memory_gib alone is taken to be sm80)."""
    if device is not None and device not in DEVICES:
        raise ValueError(
            f"attn2d.planner: unknown device {device!r}; presets: {', '.join(DEVICES)}"
        )
    key = device if device is not None or memory_gib is not None else "rtx3090"
    if memory_gib is not None:
        if not isinstance(memory_gib, (int, float)) or isinstance(memory_gib, bool) or memory_gib <= 0:
            raise ValueError(f"attn2d.planner: memory must be a positive number of GiB; got {memory_gib!r}")
        total = float(memory_gib) * GiB
        name = f"{DEVICES[key][0]} with {memory_gib:g} GiB" if key else f"{memory_gib:g} GiB"
    else:
        name, total = DEVICES[key][0], DEVICES[key][1] * GiB
    if capability is None:
        capability = COMPUTE_CAPABILITY[key] if key else ASSUMED_CAPABILITY
        if not key:
            name += f" ({_sm(capability)} assumed)"
    capability = _check_capability(capability)
    usable = usable_bytes(total)
    rows = []
    for impl in IMPLEMENTATIONS:
        est = estimate(block, setting, impl)
        est.fits = est.memory_bytes <= usable
        est.max_batch = int(usable // est.per_sample_bytes) if est.per_sample_bytes > 0 else None
        refused = refusal(block, setting, impl, capability)
        if refused:
            est.available, est.note = False, refused
        elif impl == "attn2d-global" and capability < (8, 0):
            est.note = (f"{_sm(capability)} is below the sm80 Triton supports: ranked after "
                        "sdpa-mem-efficient")
        rows.append(est)
    rec = _recommend(block, rows, name, usable, capability)
    return Plan(block, setting, name, total, usable, rows, rec, capability)


def _recommend(block: Block, rows: list[Estimate], device: str, usable: float,
               capability: tuple[int, int]) -> str:
    by = {r.implementation: r for r in rows}
    order = [by[name] for name in speed_order(capability)]
    chosen = next((r for r in order if r.available and r.fits), None)
    if chosen is None:
        options = [r for r in rows if r.fits and r.available]
        if not options:
            return "nothing fits at this batch: lower the batch (see max batch) or the resolution"
        best = min(options, key=lambda r: r.flops)
        return (f"{best.implementation}: no exact global path fits; the cheapest option that "
                f"fits ({best.note or 'exact'})")
    name = chosen.implementation
    rec = (f"{name}: {RUNS_ON[name]}, the fastest exact path that runs on {device} "
           f"({_sm(capability)}) and fits ({_gib(chosen.memory_bytes)} of {_gib(usable)} usable)")
    if name in ("sdpa-flash", "sdpa-cudnn"):
        rec += "; attn2d's 'auto' backend hands it the global calls it accepts"
    rec += "."
    refused: dict[str, list[str]] = {}
    too_big = []
    for r in order[:order.index(chosen)]:
        if r.available:
            too_big.append(f"{r.implementation} needs {_gib(r.memory_bytes)} and does not fit")
        else:
            refused.setdefault(r.note, []).append(r.implementation)
    passed = [f"{' and '.join(names)} {'refuses' if len(names) == 1 else 'refuse'} ({why})"
              for why, names in refused.items()] + too_big
    if passed:
        rec += " Faster paths passed over: " + "; ".join(passed) + "."
    if name == "attn2d-global" and by["sdpa-mem-efficient"].available:
        e, ev = block.qk_channels // block.heads, block.v_channels // block.heads
        rec += (f" sdpa-mem-efficient also runs; it ranks after attn2d's Triton kernels at "
                f"E={e}, Ev={ev} (an assumption, planner.SPEED_ORDER, which "
                "`attn2d plan --validate --device cuda` times).")
    if name != "pytorch-unfused" and not by["pytorch-unfused"].fits:
        rec += (f" The unfused PyTorch block needs {_gib(by['pytorch-unfused'].memory_bytes)}"
                " and does not fit.")
    return rec


def _gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB" if n >= 0.01 * GiB else f"{n / (1 << 20):.1f} MiB"


def format_plan(p: Plan) -> str:
    s = p.setting
    lines = [
        f"{p.block.name}: {s.height}x{s.width}, batch {s.batch}, {s.dtype}, "
        f"{'training' if s.training else 'inference'}, pattern {s.pattern.label()}"
        f"{', checkpointing' if s.checkpoint else ''} on {p.device}, {_sm(p.capability)} "
        f"({_gib(p.usable_bytes)} usable)",
        "",
        "| implementation | runs | peak memory | fits | max batch | GFLOP | note |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in p.estimates:
        lines.append(
            f"| {r.implementation} | {'yes' if r.available else 'no'} | {_gib(r.memory_bytes)} | "
            f"{'yes' if r.fits else 'NO'} | {r.max_batch} | {r.flops / 1e9:,.1f} | {r.note} |"
        )
    lines += ["", f"Recommendation: {p.recommendation}"]
    return "\n".join(lines)


def plan_to_dict(p: Plan) -> dict:
    return {
        "block": asdict(p.block),
        "setting": {**asdict(p.setting), "pattern": p.setting.pattern.label()},
        "device": p.device,
        "memory_bytes": p.memory_bytes,
        "usable_bytes": p.usable_bytes,
        "estimates": [asdict(r) for r in p.estimates],
        "recommendation": p.recommendation,
        "compute_capability": list(p.capability),
    }


REFERENCE_TABLES = ("resolution", "hardware")


def reference_tables(channels: int = 64, tables=REFERENCE_TABLES) -> str:
    """Reference tables for the SAGAN block (q/k C/8, v C), computed from the model: "resolution",
    its training memory against resolution at typical batches; "hardware", the largest map each
    device preset trains at batch 8 and the configuration it should use at 256x256. `tables`
    selects and orders them."""
    if isinstance(tables, str):
        tables = (tables,)
    tables = tuple(tables)
    unknown = [t for t in tables if t not in REFERENCE_TABLES]
    if unknown or not tables:
        raise ValueError(f"attn2d.planner: tables must be one or more of "
                         f"{', '.join(REFERENCE_TABLES)}; got {', '.join(map(str, tables)) or 'none'}")
    block = Block("SAGAN block (q/k C/8, v C)", "conv", channels, v_channels=channels)
    parts = []
    for table in tables:
        parts.append(_resolution_table(block) if table == "resolution" else _hardware_table(block))
    return "\n\n".join(parts)


def _resolution_table(block: Block) -> str:
    lines = [
        f"Memory of one training step of the SAGAN attention block (C={block.channels}, fp32):",
        "",
        "| resolution | batch | SAGAN unfused | attn2d global | attn2d YLG |",
        "|---|---|---|---|---|",
    ]
    for res, batch in ((64, 32), (128, 8), (256, 2)):
        st = Setting(res, res, batch, pattern=Pattern("ylg"))
        un = estimate(block, st, "pytorch-unfused").memory_bytes
        gl = estimate(block, st, "attn2d-global").memory_bytes
        yl = estimate(block, st, "attn2d-local").memory_bytes
        lines.append(f"| {res}x{res} | {batch} | {_gib(un)} | {_gib(gl)} | {_gib(yl)} |")
    return "\n".join(lines)


def _hardware_table(block: Block) -> str:
    lines = [
        f"Largest square map at which each device trains the SAGAN block (C={block.channels}) "
        "at batch 8, fp32:",
        "",
        "| device | SAGAN unfused | attn2d global | recommendation at 256x256 |",
        "|---|---|---|---|",
    ]
    for key, (name, gib) in DEVICES.items():
        usable = usable_bytes(gib * GiB)

        def largest(impl: str) -> str:
            best = None
            for res in (32, 64, 96, 128, 192, 256, 384, 512, 768, 1024):
                if estimate(block, Setting(res, res, 8), impl).memory_bytes <= usable:
                    best = res
            return f"{best}x{best}" if best else "none"

        rec = plan(block, Setting(256, 256, 8), device=key).recommendation.split(":")[0]
        lines.append(f"| {name} | {largest('pytorch-unfused')} | {largest('attn2d-global')} | {rec} |")
    return "\n".join(lines)


# Bounds of `validate`, as tests/python/test_planner.py holds the model on the CPU: rows that
# store N x M matrices within 15% of the measurement, fused rows within 25%.
QUADRATIC_BOUND, FUSED_BOUND = 0.15, 0.25
# On CUDA, torch.cuda.max_memory_allocated counts exactly what tensors take, with no allocator or
# page slack: every row is held to the GPU target (`attn2d bench --device cuda` uses it too).
CUDA_BOUND = 0.10
VALIDATION_DEVICES = ("cpu", "cuda")
# A measured row beats the recommended one only by more than this, to rise above timing noise.
SPEED_MARGIN = 1.10


@dataclass
class Check:
    """One row of a validation: the model's peak memory against the measured one. measured_bytes
    and seconds (one step) are None where the row did not run; `ran` says what ran, or why not."""

    implementation: str
    predicted_bytes: float
    measured_bytes: Optional[float]
    seconds: Optional[float]
    bound: float
    ran: str

    @property
    def error(self) -> Optional[float]:
        if not self.measured_bytes:
            return None
        return abs(self.predicted_bytes - self.measured_bytes) / self.measured_bytes

    @property
    def within_bound(self) -> bool:
        return self.error is None or self.error <= self.bound


@dataclass
class Validation:
    """The checks of one block and setting on a device; `problems` lists each check out of its
    bound, each kernel the plan says runs but torch refuses, and a recommended row that
    measured slower than another; `plan` is the plan for this GPU (None on the CPU)."""

    block: Block
    setting: Setting
    device: str
    checks: list[Check]
    problems: list[str]
    plan: Optional[Plan] = None


def validate(block: Block, setting: Setting, device: str = "cpu") -> Validation:
    """The model against measured memory of one step of the block. device "cpu": the ProGAN
    blocks (attn2d.unfused_blocks, and attn2d.nn's counterparts on the C++ kernels), in fp32
    training, each in a fresh process (peak resident memory, attn2d.memory.measure). device
    "cuda": every exact global row the plan for this GPU says runs, its
    torch.cuda.max_memory_allocated growth over a warm step, its time, and torch's own verdict
    on each SDPA kernel. Raises ValueError where the device or setting cannot be measured."""
    if device not in VALIDATION_DEVICES:
        raise ValueError(f"attn2d.planner: device must be one of {VALIDATION_DEVICES}; "
                         f"got {device!r}")
    unmeasured = [name for name, on in (("a pattern", setting.pattern.kind != "global"),
                                        ("downsample", setting.downsample != 1),
                                        ("checkpoint", setting.checkpoint)) if on]
    if unmeasured:
        raise ValueError(f"attn2d.planner: validate measures global attention on the full map; "
                         f"drop {', '.join(unmeasured)}")
    return _validate_cpu(block, setting) if device == "cpu" else _validate_cuda(block, setting)


def _progan_module_name(block: Block) -> Optional[str]:
    """attn2d.unfused_blocks' name of the block if it is one of the ProGAN blocks, else None."""
    tokens, conv = progan_blocks(block.channels)
    return {tokens: "SelfAttention", conv: "SelfAttention2"}.get(block)


def _validate_cpu(block: Block, setting: Setting) -> Validation:
    from .memory import measure

    module = _progan_module_name(block)
    if module is None:
        raise ValueError(f"attn2d.planner: validate on the CPU measures the ProGAN blocks "
                         f"(progan_blocks) only; got {block.name!r}")
    if setting.dtype != "fp32" or not setting.training:
        raise ValueError(f"attn2d.planner: validate on the CPU measures fp32 training; got "
                         f"{setting.dtype} {'training' if setting.training else 'inference'}")
    if setting.height != setting.width:
        raise ValueError(f"attn2d.planner: the ProGAN blocks take square maps; got "
                         f"{setting.height}x{setting.width}")
    checks = []
    for implementation, probe_impl, bound in (("pytorch-unfused", "original", QUADRATIC_BOUND),
                                              ("attn2d-global", "attn2d", FUSED_BOUND)):
        measured = measure(dict(block=module, impl=probe_impl, res=setting.height,
                                channels=block.channels, batch=setting.batch))
        checks.append(Check(
            implementation, estimate(block, setting, implementation).memory_bytes,
            measured["peak_above_baseline_bytes"],
            measured["forward_s"] + measured["backward_s"], bound,
            f"attn2d.unfused_blocks.{module}" if probe_impl == "original"
            else "attn2d.nn on the C++ kernels"))
    problems = [f"{c.implementation}: {100 * c.error:.1f}% off (bound {100 * c.bound:.0f}%)"
                for c in checks if not c.within_bound]
    return Validation(block, setting, "cpu", checks, problems)


def _attn2d_module(block: Block):
    """attn2d.nn's module for the block, or None where its arguments cannot express it."""
    from . import nn as attn2d_nn

    if block.kind == "tokens":
        return attn2d_nn.MultiheadSelfAttention2d(block.channels, block.heads)
    ratio = block.channels // block.qk_channels
    if ratio < 1 or block.channels // ratio != block.qk_channels:
        return None
    return attn2d_nn.SelfAttention2d(
        block.channels, qk_ratio=ratio, v_channels=block.v_channels, heads=block.heads,
        pool_kv=block.pool_kv, out_conv=block.out_conv, gamma=block.gamma,
        residual=block.residual, scale=None)


def _validate_cuda(block: Block, setting: Setting) -> Validation:
    import torch

    from .memory import cuda_step_peak

    from ._checks import check_run_device

    check_run_device("attn2d.planner", "cuda")
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    gpu_plan = plan(block, setting, memory_gib=props.total_memory / GiB,
                    capability=torch.cuda.get_device_capability())
    gpu_plan.device = props.name
    return _measure_rows(block, setting, gpu_plan, "cuda", cuda_step_peak)


def _measure_rows(block: Block, setting: Setting, gpu_plan: Plan, device: str,
                  measure_step) -> Validation:
    """Runs each exact row that gpu_plan says runs, on `device`, through
    measure_step(step) -> (peak bytes, seconds), and checks torch's verdict on the SDPA rows."""
    import torch
    from torch.nn.attention import SDPBackend

    from . import backends
    from .memory import block_peer
    from .peers import forced_sdpa, unfused

    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[setting.dtype]
    x = torch.randn(setting.batch, block.channels, setting.height, setting.width,
                    device=device, dtype=dtype)
    grad = torch.randn_like(x)

    sdpa = {"sdpa-math": (SDPBackend.MATH, None),
            "sdpa-mem-efficient": (SDPBackend.EFFICIENT_ATTENTION,
                                   torch.backends.cuda.can_use_efficient_attention),
            "sdpa-flash": (SDPBackend.FLASH_ATTENTION,
                           torch.backends.cuda.can_use_flash_attention),
            "sdpa-cudnn": (SDPBackend.CUDNN_ATTENTION,
                           torch.backends.cuda.can_use_cudnn_attention)}
    n = setting.height * setting.width
    m = max(setting.height // block.pool_kv, 1) * max(setting.width // block.pool_kv, 1)
    e, ev = block.qk_channels // block.heads, block.v_channels // block.heads

    def torch_accepts(can_use) -> bool:
        def make(length, width):
            return torch.empty(setting.batch, block.heads, length, width, device=device,
                               dtype=dtype, requires_grad=setting.training)
        params = torch.backends.cuda.SDPAParams(make(n, e), make(m, e), make(m, ev), None, 0.0,
                                                False, False)
        return bool(can_use(params, False))

    def module_for(implementation: str):
        """(module, what ran, the backend setting to run it under)."""
        if implementation == "pytorch-unfused":
            name = _progan_module_name(block)
            if name is not None:
                from .unfused_blocks import make_pair

                return make_pair(name, block.channels)[0], f"attn2d.unfused_blocks.{name}", None
            return block_peer(block, unfused), "the block around matmul-softmax-matmul", None
        if implementation == "attn2d-global":
            module = _attn2d_module(block)
            if module is not None:
                return module, f"attn2d.nn.{type(module).__name__}, Triton", "triton"
            return (block_peer(block, _attn2d_attention), "the block around attn2d.attention, "
                    "Triton", "triton")
        backend = sdpa[implementation][0]
        return (block_peer(block, forced_sdpa(backend)), f"the block around SDPA {backend.name}",
                None)

    checks, problems, seconds = [], [], {}
    for implementation in speed_order(gpu_plan.capability):
        est = next(r for r in gpu_plan.estimates if r.implementation == implementation)
        bound = (CUDA_BOUND if device == "cuda"
                 else FUSED_BOUND if implementation in FUSED else QUADRATIC_BOUND)
        can_use = sdpa.get(implementation, (None, None))[1]
        accepted = est.available if can_use is None else torch_accepts(can_use)
        if accepted and not est.available:
            est.note += " (torch accepts it here: the planner's rule is conservative)"
        if not (accepted and est.available):
            if est.available:
                problems.append(f"{implementation}: the plan says it runs; torch refuses it")
            why = est.note if not est.available else "torch refuses it"
            checks.append(Check(implementation, est.memory_bytes, None, None, bound,
                                f"not run: {why}"))
            continue
        module, ran, backend = module_for(implementation)
        module = module.to(device, dtype)

        def step():
            with backends.use_backend(backend or "auto"):
                if setting.training:
                    module(x).backward(grad)
                else:
                    with torch.no_grad():
                        module(x)

        try:
            peak, step_s = measure_step(step)
        except torch.cuda.OutOfMemoryError:
            checks.append(Check(implementation, est.memory_bytes, None, None, bound,
                                f"{ran}: out of memory"))
            if est.fits:
                problems.append(f"{implementation}: the plan says it fits; it ran out of memory")
            continue
        except (RuntimeError, ValueError) as err:
            checks.append(Check(implementation, est.memory_bytes, None, None, bound,
                                f"{ran}: failed: {str(err).splitlines()[0]}"))
            problems.append(f"{implementation}: the plan says it runs; it failed")
            continue
        finally:
            del module
            torch.cuda.empty_cache()
        seconds[implementation] = step_s
        check = Check(implementation, est.memory_bytes, peak, step_s, bound, ran)
        checks.append(check)
        if not check.within_bound:
            problems.append(f"{implementation}: {100 * check.error:.1f}% off "
                            f"(bound {100 * bound:.0f}%)")
    recommended = gpu_plan.recommendation.split(":")[0]
    if seconds and recommended in seconds:
        fastest = min(seconds, key=seconds.get)
        if seconds[recommended] > SPEED_MARGIN * seconds[fastest]:
            problems.append(f"speed order: {fastest} ({1e3 * seconds[fastest]:.2f} ms) beat the "
                            f"recommended {recommended} ({1e3 * seconds[recommended]:.2f} ms)")
    return Validation(block, setting, gpu_plan.device, checks, problems, gpu_plan)


def _attn2d_attention(q, k, v, scale):
    from .functional import attention

    return attention(q, k, v, scale=scale)


def _mib(n: float) -> str:
    return f"{n / (1 << 20):,.1f} MiB"


def format_validation(v: Validation) -> str:
    s = v.setting
    lines = [
        f"{v.block.name}: {s.height}x{s.width}, batch {s.batch}, {s.dtype}, "
        f"{'training' if s.training else 'inference'}, measured on {v.device}",
        "",
        "| implementation | predicted | measured | off | bound | step ms | ran |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in v.checks:
        measured = "-" if c.measured_bytes is None else _mib(c.measured_bytes)
        off = "-" if c.error is None else f"{100 * c.error:.1f}%"
        ms = "-" if c.seconds is None else f"{1e3 * c.seconds:.2f}"
        lines.append(f"| {c.implementation} | {_mib(c.predicted_bytes)} | {measured} | {off} | "
                     f"{100 * c.bound:.0f}% | {ms} | {c.ran} |")
    if v.plan is not None:
        lines += ["", f"Plan's recommendation: {v.plan.recommendation}"]
    lines += [""] + ([f"Problem: {p}" for p in v.problems] or ["Every check within its bound."])
    return "\n".join(lines)


def validation_to_dict(v: Validation) -> dict:
    return {
        "block": asdict(v.block),
        "setting": {**asdict(v.setting), "pattern": v.setting.pattern.label()},
        "device": v.device,
        "checks": [{**asdict(c), "error": c.error} for c in v.checks],
        "problems": v.problems,
        "recommendation": v.plan.recommendation if v.plan is not None else None,
    }
