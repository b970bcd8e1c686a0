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
- Not modelled: weights, optimizer state, the CUDA context (the `usable` memory of a device
  leaves 10% or at least 1 GiB for them).
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

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
IMPLEMENTATIONS = ("pytorch-unfused", "sdpa-math", "attn2d-global", "attn2d-local",
                   "attn2d-downsampled")
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


@dataclass
class Plan:
    block: Block
    setting: Setting
    device: str
    memory_bytes: float
    usable_bytes: float
    estimates: list[Estimate]
    recommendation: str


def plan(block: Block, setting: Setting, *, device: Optional[str] = None,
         memory_gib: Optional[float] = None) -> Plan:
    """Every implementation's memory, FLOPs, whether it fits and its largest batch, and a
    recommendation: exact global attention if it fits, else the cheapest option that does."""
    if memory_gib is not None:
        if not isinstance(memory_gib, (int, float)) or isinstance(memory_gib, bool) or memory_gib <= 0:
            raise ValueError(f"attn2d.planner: memory must be a positive number of GiB; got {memory_gib!r}")
        name, total = f"{memory_gib:g} GiB", float(memory_gib) * GiB
    else:
        key = device or "rtx3090"
        if key not in DEVICES:
            raise ValueError(
                f"attn2d.planner: unknown device {key!r}; presets: {', '.join(DEVICES)}"
            )
        name, total = DEVICES[key][0], DEVICES[key][1] * GiB
    usable = usable_bytes(total)
    rows = []
    for impl in IMPLEMENTATIONS:
        est = estimate(block, setting, impl)
        est.fits = est.memory_bytes <= usable
        est.max_batch = int(usable // est.per_sample_bytes) if est.per_sample_bytes > 0 else None
        rows.append(est)
    by = {r.implementation: r for r in rows}
    if by["attn2d-global"].fits:
        rec = ("attn2d-global: exact global attention fits "
               f"({_gib(by['attn2d-global'].memory_bytes)} of {_gib(usable)} usable)")
        if not by["pytorch-unfused"].fits:
            rec += (f"; the unfused PyTorch block needs {_gib(by['pytorch-unfused'].memory_bytes)}"
                    " and does not fit")
    else:
        options = [r for r in rows if r.fits and r.available]
        if options:
            best = min(options, key=lambda r: r.flops)
            rec = f"{best.implementation}: the cheapest option that fits ({best.note or 'exact'})"
        else:
            rec = "nothing fits at this batch: lower the batch (see max batch) or the resolution"
    return Plan(block, setting, name, total, usable, rows, rec)


def _gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB" if n >= 0.01 * GiB else f"{n / (1 << 20):.1f} MiB"


def format_plan(p: Plan) -> str:
    s = p.setting
    lines = [
        f"{p.block.name}: {s.height}x{s.width}, batch {s.batch}, {s.dtype}, "
        f"{'training' if s.training else 'inference'}, pattern {s.pattern.label()}"
        f"{', checkpointing' if s.checkpoint else ''} on {p.device} "
        f"({_gib(p.usable_bytes)} usable)",
        "",
        "| implementation | peak memory | fits | max batch | GFLOP | note |",
        "|---|---|---|---|---|---|",
    ]
    for r in p.estimates:
        avail = "" if r.available else " (not available)"
        lines.append(
            f"| {r.implementation}{avail} | {_gib(r.memory_bytes)} | {'yes' if r.fits else 'NO'} | "
            f"{r.max_batch} | {r.flops / 1e9:,.1f} | {r.note} |"
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
