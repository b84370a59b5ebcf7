"""What ``onnxnorm bench cuda`` measures: the dtypes, the shapes of the float ops and of the
hybrid models' norms, and the targets a row is held to. Imports nothing: the command's options
come from here."""

from __future__ import annotations

#: every dtype the command takes
DTYPES = ("float32", "float16", "bfloat16")
#: what a run measures unless --dtypes or --dtype says otherwise
DEFAULT_DTYPES = ("bfloat16", "float16")
#: (label, rows, cols, kind): kind "rows" (the copy targets of TARGETS), "qk" (Q/K-norm rows:
#: QK_TARGET for the ops without a residual) or "decode" (microseconds per call, back to back,
#: target DECODE_US)
BENCH_SHAPES = [
    ("4096x4096", 4096, 4096, "rows"),
    ("4096x8192", 4096, 8192, "rows"),
    ("Q/K 16384x32 heads x128", 16384 * 32, 128, "qk"),
    ("Q/K 4096x8 heads x256", 4096 * 8, 256, "qk"),
    ("Q/K 4096x32 heads x64", 4096 * 32, 64, "qk"),
    ("decode 1x4096", 1, 4096, "decode"),
    ("decode 8x4096", 8, 4096, "decode"),
    ("decode 64x4096", 64, 4096, "decode"),
]
#: percent of the copy bandwidth (4096 x 4096 and 4096 x 8192; Q/K-norm shapes: QK_TARGET)
TARGETS = {"RMSNorm": 90, "SkipRMSNorm": 90, "LayerNorm": 85, "SkipLayerNorm": 85}
QK_TARGET = 75
#: the most microseconds one call of a decode shape may take (every op)
DECODE_US = 5.0
#: launches between the two CUDA events of one decode sample
DECODE_CALLS = 200
#: the norms of hybrid models, for 1 token (decode) and 512 (prefill): (label, op, X's shape,
#: group_size, Scale's shape, (activation, norm_before_gate) of a Gate). Qwen3-Next's gated norm
#: of its linear attention's output (16 heads of 128 normalized each, one head's Scale, SiLU after
#: the norm); Mamba2's (8 groups of its 4096 channels, a Scale of all of them, SiLU before the
#: norm); the L2 norm of q and k of gated delta-rule attention (16 heads of 128).
HYBRID_SHAPES = [
    (f"{name} [{t}, {dims}]{tail}", op, (t, *shape), group, scale, gate)
    for t in (1, 512)
    for name, op, shape, dims, tail, group, scale, gate in (
        ("Qwen3-Next gated", "GatedRMSNorm", (2048,), "16x128", " g128", 128, (128,), (0, 1)),
        ("Mamba2 gate first", "GatedRMSNorm", (4096,), "4096", " 8 groups", 512, (4096,), (0, 0)),
        ("L2 q/k", "L2Norm", (16, 128), "16, 128", "", 0, None, None),
    )
]
