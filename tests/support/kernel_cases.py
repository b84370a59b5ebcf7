"""The CPU kernels' case matrices, run through ONNX Runtime with the onnxnorm library (nodes
without function bodies) against the numpy reference. tests/kernels/test_kernels.py and
tests/kernels/test_native_ops.py run them in the test process, and again in a child process for each
lesser instruction set (``ONNXNORM_CPU_ISA``), which imports them from here
(:func:`check_float_ops`, :func:`check_gated_and_l2_norms`)."""

from __future__ import annotations

import numpy as np

from onnxnorm import ops
from onnxnorm.testing.graphs import single_node_model
from tests.support.helpers import reference_outputs, run
from tests.support.matrix import DTYPES, TYPE_PAIRS, WEIGHTS

#: the optional inputs: the weights and GatedRMSNorm's Gate (of X's shape and type)
INPUTS = (*WEIGHTS, "Gate")

# Each case: which optional inputs are present, the attributes, whether Sum is an output, the
# shape of X and of the weights. Together they cover every optional input present and absent,
# axis -1 / -2, alpha 1 / not 1, scale_offset 0 / 1, both rounding orders, Sum present / absent,
# per-head weights and widths that are not a multiple of the vector width; and GatedRMSNorm's
# Gate present and absent, after and before the norm, both activations, groups (a Scale of the
# whole normalized extent) and none. An op takes the inputs and attributes it has.
CASES = {
    "all-inputs": (INPUTS, {}, True, (2, 3, 37), (37,)),
    "no-inputs-order-a": ((), {"cast_before_scale": 1}, False, (2, 3, 37), (37,)),
    "all-order-a-offset-alpha-axis2": (
        INPUTS,
        {
            "cast_before_scale": 1,
            "scale_offset": 1.0,
            "alpha": 0.5,
            "axis": -2,
            "epsilon": 1e-3,
            "group_size": 24,
            "norm_before_gate": 0,
        },
        True,
        (2, 5, 24),
        (5, 24),
    ),
    "scales-offset-alpha": (
        ("Scale", "InnerScale", "Gate"),
        {"scale_offset": 1.0, "alpha": 2.0, "activation": 1},
        False,
        (3, 4, 64),
        (4, 64),
    ),
    "biases-order-a": (
        ("Bias", "XBias", "InnerBias"),
        {"cast_before_scale": 1},
        True,
        (4, 1, 130),
        (130,),
    ),
    "scale-bias-order-a-axis2": (
        ("Scale", "Bias", "Gate"),
        {"cast_before_scale": 1, "axis": -2, "norm_before_gate": 0, "activation": 1},
        False,
        (3, 2, 17),
        (2, 17),
    ),
}


def make_arrays(op, x_type, w_type, present, x_shape, w_shape, rng, mean=0.0):
    """X (of mean ``mean``), Residual, and those of ``present`` that ``op`` takes: weights of
    ``w_type`` and ``w_shape`` (scales about 1, biases about 0), Gate of X's shape and type."""
    spec = ops.OPS[op]
    names = {p.name for p in spec.inputs}
    arrays = {"X": (mean + rng.standard_normal(x_shape)).astype(x_type)}
    if "Residual" in names:
        arrays["Residual"] = rng.standard_normal(x_shape).astype(x_type)
    for name in WEIGHTS:
        if name in names and name in present:
            base = 1.0 if "Scale" in name else 0.0
            arrays[name] = (base + 0.3 * rng.standard_normal(w_shape)).astype(w_type)
    if "Gate" in names and "Gate" in present:
        arrays["Gate"] = (2.0 * rng.standard_normal(x_shape)).astype(x_type)
    return arrays


def op_attrs(op, attrs):
    """The attributes of ``attrs`` that ``op`` has."""
    allowed = {a.name for a in ops.OPS[op].attributes}
    return {k: v for k, v in attrs.items() if k in allowed}


def run_kernel(op, arrays, attrs=None, threads=1, with_sum=True):
    """The op's outputs from the library's kernel (Sum too where ``with_sum``)."""
    model = single_node_model(op, arrays, attrs, functions=False, optional_outputs=with_sum)
    return run(model, arrays, with_library=True, threads=threads)


def check_kernel(op, arrays, attrs=None, threads=1, with_sum=True):
    """The kernel's outputs are the reference's, within its tolerance for X's type (NaN where
    the reference has NaN)."""
    got = run_kernel(op, arrays, attrs, threads, with_sum)
    want = reference_outputs(op, arrays, attrs)
    if not with_sum:
        want = want[:1]
    assert len(got) == len(want)
    rtol, atol = ops.reference.tolerance(arrays["X"].dtype)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(np.asarray(g, np.float32), w.astype(np.float32), rtol, atol)


def check_float_ops(rng) -> None:
    """Every float op x type pair x CASES, and a threaded call of every input."""
    for op in ops.catalogue.FLOAT_OPS:
        for types in TYPE_PAIRS:
            for present, attrs, with_sum, xs, ws in CASES.values():
                arrays = make_arrays(op, *types, present, xs, ws, rng)
                with_sum = with_sum and ops.OPS[op].has_residual
                check_kernel(op, arrays, op_attrs(op, attrs), with_sum=with_sum)
            arrays = make_arrays(op, *types, INPUTS, (3, 1000), (1000,), rng)
            attrs = op_attrs(op, {"cast_before_scale": 1, "group_size": 200})
            check_kernel(op, arrays, attrs, threads=2)


# ---------------------------------------------------------------------------------------------
# GatedRMSNorm and L2Norm: every X type and weight type, both rounding orders, the gate absent,
# after the norm and before it, both activations, groups (a Scale of one group or of the whole
# extent)

#: the gate: absent, or (norm_before_gate, activation)
GATES = {
    "no-gate": None,
    "after-silu": (1, 0),
    "after-sigmoid": (1, 1),
    "before-silu": (0, 0),
    "before-sigmoid": (0, 1),
}
#: GatedRMSNorm's shapes: X's shape, axis, group_size, Scale's shape (None: absent)
GATED_SHAPES = {
    "plain": ((2, 3, 37), -1, 0, (37,)),
    "per-head-scale": ((2, 3, 4, 24), -1, 0, (4, 24)),
    "groups-scale-of-extent": ((2, 5, 96), -1, 32, (96,)),
    "groups-scale-of-group": ((2, 5, 96), -1, 32, (32,)),
    "groups-axis-2": ((2, 3, 4, 16), -2, 16, (4, 16)),
    "groups-of-1": ((3, 8), -1, 1, (1, 8)),
    "odd-groups-no-scale": ((2, 3, 99), -1, 33, None),
    "one-group": ((4, 40), -1, 40, (40,)),
}


def gated_arrays(x_shape, x_type, w_type, scale_shape, gated, rng, spread=2.0):
    """X standard normal, Scale about 1 (when scale_shape), Gate of spread ``spread``."""
    arrays = {"X": rng.standard_normal(x_shape).astype(x_type)}
    if scale_shape is not None:
        arrays["Scale"] = (1.0 + 0.3 * rng.standard_normal(scale_shape)).astype(w_type)
    if gated:
        arrays["Gate"] = (spread * rng.standard_normal(x_shape)).astype(x_type)
    return arrays


def gated_matrix(types, gate, rng):
    """Every GATED_SHAPES entry in both rounding orders, with and without a scale offset."""
    for x_shape, axis, group_size, scale_shape in GATED_SHAPES.values():
        for order, offset in ((0, 0.0), (1, 0.0), (0, 1.0), (1, 1.0)):
            attrs = {
                "axis": axis,
                "group_size": group_size,
                "cast_before_scale": order,
                "scale_offset": offset,
                "epsilon": 1e-3 if order else 1e-6,
            }
            if GATES[gate] is not None:
                attrs["norm_before_gate"], attrs["activation"] = GATES[gate]
            arrays = gated_arrays(x_shape, *types, scale_shape, GATES[gate] is not None, rng)
            check_kernel("GatedRMSNorm", arrays, attrs, threads=1 + order)


def l2_matrix(x_type, rng):
    """Per-head L2 norms over head_dim 64, 128 and 256 of [B, S, H, D], and other axes."""
    for x_shape, axis, epsilon in (
        ((2, 9, 4, 64), -1, 1e-6),
        ((1, 5, 16, 128), -1, 1e-6),
        ((2, 3, 2, 256), -1, 0.0),
        ((3, 7), -1, 1e-5),
        ((2, 3, 4, 8), -2, 1e-3),
        ((5, 1), -1, 1e-5),
    ):
        x = rng.standard_normal(x_shape).astype(x_type)
        check_kernel("L2Norm", {"X": x}, {"axis": axis, "epsilon": epsilon}, threads=2)


def check_gated_and_l2_norms(rng) -> None:
    """Every type pair x gate through gated_matrix, Mamba2's groups threaded, l2_matrix of
    every type."""
    for types in TYPE_PAIRS:
        for gate in GATES:
            gated_matrix(types, gate, rng)
        arrays = gated_arrays((2, 3, 4096), *types, (4096,), True, rng)
        attrs = {"group_size": 512, "norm_before_gate": 0}
        check_kernel("GatedRMSNorm", arrays, attrs, threads=2)
    for x_type in DTYPES.values():
        l2_matrix(x_type, rng)


def check_on_lesser_isa(isa: str, check: str, seed: int, timeout: int) -> None:
    """Runs ``check`` (a function of this module taking a numpy Generator) on the instruction set
    ``isa`` in a subprocess (``ONNXNORM_CPU_ISA`` lowers the library's choice; the best one runs
    in the tests' own process), and asserts it passed and that the library reported the lowered
    choice, never one above the best this CPU has."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from onnxnorm._native import active_isa

    script = (
        "import numpy as np, sys\n"
        "sys.path.insert(0, '.')  # the checkout (the test runs this in it): tests.support\n"
        f"from tests.support.kernel_cases import {check}\n"
        f"{check}(np.random.default_rng({seed}))\n"
        "from onnxnorm._native import active_isa\n"
        "print('isa', active_isa())\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "ONNXNORM_CPU_ISA": isa},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-3000:]
    order = ["portable", "avx2", "avx512", "avx512_bf16"]
    want = order[min(order.index(isa), order.index(active_isa()))]
    assert f"isa {want}\n" in result.stdout, result.stdout
