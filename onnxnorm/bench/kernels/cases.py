"""What ``onnxnorm bench kernels`` measures and what each row must meet: the shapes, dtypes and
quantized types it offers, the targets (docs/benchmarks.md), and :class:`Result`, one row.
Imports nothing heavy: the command's options come from here."""

from __future__ import annotations

import dataclasses
from typing import Any

#: --shapes: name -> X's shape (the Q/K-norm one normalized over its last dimension, run as
#: (1, 16384, 128) by every contender) for the ops without shapes of their own (OP_SHAPES)
SHAPES: dict[str, tuple[int, ...]] = {
    "1x1x4096": (1, 1, 4096),
    "1x128x4096": (1, 128, 4096),
    "4x512x4096": (4, 512, 4096),
    "1x2048x8192": (1, 2048, 8192),
    "qk-1x512x32x128": (1, 512, 32, 128),
}


@dataclasses.dataclass(frozen=True)
class OpShape:
    """A shape of an op with shapes of its own: X's shape (every contender's; a rotary op's Q),
    the node's attributes (the model's norm), Scale's shape (None: no Scale; a rotary op's
    QScale and KScale), and a rotary op's K's shape."""

    x: tuple[int, ...]
    attrs: dict[str, Any]
    scale: tuple[int, ...] | None
    k: tuple[int, ...] | None = None


#: the rotary ops' caches: one angle per rotated pair for this many positions, RoPE's base
ROTARY_MAX_POSITION = 4096
ROTARY_THETA = 1e6
#: the rotary ops' attributes (Qwen3's Q/K norm as its exported graph has it, which the fusion
#: keeps: epsilon 1e-6, rounding order A, the rotation rounded in X's type as eager PyTorch
#: computes it, half-split, the whole head rotated; layout 0 or 2)
_ROTARY_ATTRS = {"epsilon": 1e-6, "rotary_in_t": 1}


def _rotary_shapes(op: str) -> dict[str, OpShape]:
    """A rotary op's shapes: Qwen3 / Llama-style grouped-query attention, 32 query heads and 8
    key heads of 128, batch 1, a decode step of 1 and of 8 tokens and a 512-token prefill in
    layout 0 (Q [1, tokens, 32, 128] in and out), and the prefill in layout 2 (the outputs
    [1, heads, tokens, 128]: the transpose to attention's layout taken in)."""
    attrs = dict(_ROTARY_ATTRS)
    if op != "L2NormRotary":
        attrs["cast_before_scale"] = 1
    shapes = {}
    for tokens, layout in ((1, 0), (8, 0), (512, 0), (512, 2)):
        name = f"q32k8-1x{tokens}x128" + ("-bhsd" if layout == 2 else "")
        shapes[name] = OpShape(
            (1, tokens, 32, 128),
            {**attrs, "layout": layout},
            None if op == "L2NormRotary" else (128,),
            (1, tokens, 8, 128),
        )
    return shapes


#: the ops whose shapes are those of the models they come from: op -> --shapes name -> shape.
#: GatedRMSNorm: Qwen3-Next's gated delta-net output norm (16 value heads of 128 packed per token,
#: Scale [128] shared by the heads, the gate after the norm) and Mamba2's (d_inner 4096 in 8
#: groups, Scale [4096], the gate first), both rounding in order A as their torch code does; a
#: decode step (one token) and a 512-token prefill each. L2Norm: the gated delta-net's q/k norm,
#: [batch, tokens, heads, head_dim 128]. The rotary ops: _rotary_shapes (Q with K, their
#: weights [128], the caches ROTARY_MAX_POSITION x 64 gathered by each token's position).
OP_SHAPES: dict[str, dict[str, OpShape]] = {
    "GatedRMSNorm": {
        f"{model}-1x{tokens}x{width}": OpShape((1, tokens, width), attrs, scale)
        for model, width, attrs, scale in (
            (
                "qwen3next",
                2048,
                {"group_size": 128, "epsilon": 1e-6, "cast_before_scale": 1},
                (128,),
            ),
            (
                "mamba2",
                4096,
                {"group_size": 512, "norm_before_gate": 0, "cast_before_scale": 1},
                (4096,),
            ),
        )
        for tokens in (1, 512)
    },
    "L2Norm": {
        f"qk-l2-1x{tokens}x16x128": OpShape((1, tokens, 16, 128), {"epsilon": 1e-6}, None)
        for tokens in (1, 512)
    },
    **{op: _rotary_shapes(op) for op in ("RMSNormRotary", "LayerNormRotary", "L2NormRotary")},
}
#: every --shapes name
ALL_SHAPES = tuple(
    dict.fromkeys((*SHAPES, *(name for shapes in OP_SHAPES.values() for name in shapes)))
)


def op_shapes(op: str, wanted: list[str] | None = None) -> dict[str, OpShape]:
    """The shapes ``op`` runs on, of ``wanted`` (None: all of its own, or SHAPES): the op's own
    (OP_SHAPES), or SHAPES as X with a Scale (and Bias) of its last dimension (the Q/K-norm shape
    run as [batch, seq * heads, head_dim])."""
    if op in OP_SHAPES:
        own = OP_SHAPES[op]
        return {name: own[name] for name in (wanted or own) if name in own}
    shapes = {}
    for name in wanted or SHAPES:
        if name not in SHAPES:
            continue
        x = SHAPES[name]
        if len(x) == 4:  # Q/K-norm: [batch, seq, heads, head_dim] -> [batch, seq * heads, head_dim]
            x = (x[0], x[1] * x[2], x[3])
        shapes[name] = OpShape(x, {}, (x[-1],))
    return shapes


# The targets (docs/benchmarks.md), each held by the median times and by the best-of times:
# - every row: onnxnorm no slower than ORT's fastest built-in op for the same math;
# - the large shapes: onnxnorm at BANDWIDTH_FRACTION of the copy bandwidth or more;
# - single-token rows, where a call is almost all per-call overhead: onnxnorm within FLOOR_FACTOR
#   of ORT's floor (one node that only copies the same bytes).
BANDWIDTH_SHAPES = ("4x512x4096", "1x2048x8192")
BANDWIDTH_FRACTION = 0.90
SINGLE_TOKEN_SHAPES = ("1x1x4096",)
FLOOR_FACTOR = 1.2
# The norm ops of OP_SHAPES, which no single ORT op computes in every form, are held to the graph
# their models export instead: at least DECOMPOSED_SPEEDUP times as fast as ONNX Runtime running
# the decomposed norm (and, where ORT has a built-in op for the form, no slower than it).
DECOMPOSED_SPEEDUP = 2.0
# The quantized ops' target instead: on the large shapes at least QUANT_SPEEDUP times as fast as
# ORT's fastest norm followed by its quantizer (elsewhere no slower).
QUANT_SPEEDUP = 1.5
# The rotary ops' targets instead: at least ROTARY_SPEEDUP times as fast as ORT's fastest norm
# followed by its RotaryEmbedding (for Q and K), and on the prefill rows (ROTARY_COPY_SHAPES)
# within ROTARY_COPY_FACTOR of the time of a copy of Q and K.
ROTARY_SPEEDUP = 1.5
ROTARY_COPY_SHAPES = ("q32k8-1x512x128", "q32k8-1x512x128-bhsd")
ROTARY_COPY_FACTOR = 1.2
DTYPES = ("float32", "float16", "bfloat16")
EPSILON = 1e-5
Y_SCALE = 0.02
Y_ZERO_POINT = -3
#: the static quantized ops' Y type (``--quant-type``) -> their zero point; int8 by default. A
#: float8 zero point's value is not used (it gives Y's type only). tests/kernels/test_kernels.py
#: holds its types to the catalogue's quantized types.
QUANT_ZERO_POINTS = {"uint8": 125, "int8": Y_ZERO_POINT, "float8e4m3fn": 0.0}
QUANT_TYPE = "int8"


@dataclasses.dataclass
class Result:
    """One row: an op on a shape in a dtype, every contender's times, and the targets it meets."""

    op: str
    shape: str
    dtype: str
    #: contender -> median seconds per call (None: not supported for this dtype)
    times: dict[str, float | None]
    notes: dict[str, str]
    #: contender -> fastest repetition's seconds per call (less sensitive to a busy machine)
    best: dict[str, float | None] = dataclasses.field(default_factory=dict)
    #: the static quantized ops' Y type (a key of QUANT_ZERO_POINTS); None for the other ops
    quant_type: str | None = None

    @property
    def onnxnorm(self) -> float | None:
        """onnxnorm's median seconds per call."""
        return self.times.get("onnxnorm")

    def best_ort(
        self, times: dict[str, float | None] | None = None
    ) -> tuple[str | None, float | None]:
        """ORT's fastest built-in contender ("ort:<label>") and its time, by the median (or the
        given) times; (None, None) where none ran."""
        times = self.times if times is None else times
        found = [(t, k) for k, t in times.items() if k.startswith("ort:") and t is not None]
        if not found:
            return None, None
        t, k = min(found)
        return k, t

    def targets(self, times: dict[str, float | None] | None = None) -> list[str]:
        """Misses of the kernel targets (docs/benchmarks.md) by the median (or the given) times;
        empty: all met."""
        from onnxnorm.ops import catalogue

        times = self.times if times is None else times
        misses = []
        mine = times.get("onnxnorm")
        if mine is None:
            return ["no onnxnorm time"]
        name, best = self.best_ort(times)
        ort = name.removeprefix("ort:") if name is not None else ""
        copy = times.get("copy")
        if catalogue.get(self.op).rotary:
            if best is not None and best / mine < ROTARY_SPEEDUP:
                misses.append(f"{best / mine:.2f}x as fast as {ort} < {ROTARY_SPEEDUP}x")
            if (
                self.shape in ROTARY_COPY_SHAPES
                and copy is not None
                and mine > ROTARY_COPY_FACTOR * copy
            ):
                misses.append(f"{mine / copy:.2f}x the copy's time > {ROTARY_COPY_FACTOR}x")
            return misses
        if catalogue.get(self.op).quantize != "none":
            if best is not None and self.shape in BANDWIDTH_SHAPES and best / mine < QUANT_SPEEDUP:
                misses.append(f"{best / mine:.2f}x as fast as {ort} < {QUANT_SPEEDUP}x")
            elif best is not None and mine > best:
                misses.append(f"slower than {ort} ({mine / best:.2f}x)")
            return misses
        if best is not None and mine > best:
            misses.append(f"slower than {ort} ({mine / best:.2f}x)")
        decomposed = times.get("decomposed")
        if (
            self.op in OP_SHAPES
            and decomposed is not None
            and decomposed / mine < DECOMPOSED_SPEEDUP
        ):
            misses.append(
                f"{decomposed / mine:.2f}x as fast as the decomposed graph < {DECOMPOSED_SPEEDUP}x"
            )
        if self.shape in BANDWIDTH_SHAPES and copy is not None and copy / mine < BANDWIDTH_FRACTION:
            misses.append(
                f"{100 * copy / mine:.0f}% of copy bandwidth < {100 * BANDWIDTH_FRACTION:.0f}%"
            )
        floor = times.get("floor")
        if self.shape in SINGLE_TOKEN_SHAPES and floor is not None and mine > FLOOR_FACTOR * floor:
            misses.append(f"{mine / floor:.2f}x ORT's floor > {FLOOR_FACTOR}x")
        return misses

    def verdict(self) -> str:
        """ "met", or the misses by the median times and by the best-of times."""
        by_median = self.targets()
        by_best = self.targets(self.best) if self.best else by_median
        if not by_median and not by_best:
            return "met"

        def kind(miss: str) -> str:
            if miss.startswith("slower"):
                return "slower"
            if "bandwidth" in miss or "copy's time" in miss:
                return "bandwidth"
            return "speed-up" if " as fast as " in miss else miss

        parts = []
        if by_median:
            parts.append("MISSED: " + "; ".join(by_median))
        only_best = [m for m in by_best if kind(m) not in {kind(n) for n in by_median}]
        if only_best:
            parts.append("MISSED by best-of: " + "; ".join(only_best))
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        name, best = self.best_ort()
        mine = self.onnxnorm
        copy = self.times.get("copy")
        floor = self.times.get("floor")
        return {
            "op": self.op,
            "shape": self.shape,
            "dtype": self.dtype,
            "quant_type": self.quant_type,
            "median_seconds": self.times,
            "best_seconds": self.best,
            "notes": self.notes,
            "best_ort": name,
            "ratio_to_best_ort": (mine / best) if mine and best else None,
            "ratio_to_ort_floor": (mine / floor) if mine and floor else None,
            "fraction_of_copy_bandwidth": (copy / mine) if mine and copy else None,
            "target_misses": self.targets(),
            "target_misses_by_best_times": self.targets(self.best) if self.best else None,
        }
