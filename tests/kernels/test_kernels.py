"""The CPU kernels of every op, through ONNX Runtime with the onnxnorm library, against the numpy
reference: every op x X type x weight type x optional inputs (GatedRMSNorm's Gate too) x
attribute classes (its groups, activation and gate placement too) x Sum output,
threaded runs, short (Q/K-norm) rows, odd widths, large-mean LayerNorm, every instruction set,
and bad inputs (a clear error, never a crash). And the kernels' own C++ tests (ctest), which call
them without ONNX Runtime."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest

from onnxnorm import ops
from onnxnorm._native import active_isa
from tests.support.bench import BENCH_SHAPE, bench_arrays
from tests.support.build import package_build_with_tests, tool
from tests.support.helpers import reference_outputs
from tests.support.kernel_cases import (
    CASES,
    INPUTS,
    check_kernel,
    check_on_lesser_isa,
    make_arrays,
    op_attrs,
    run_kernel,
)
from tests.support.matrix import BF16, DTYPES, F16, F32, TYPE_IDS, TYPE_PAIRS, WEIGHTS, type_id


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("types", TYPE_PAIRS, ids=TYPE_IDS)
@pytest.mark.parametrize("op", list(ops.catalogue.FLOAT_OPS))
def test_matrix(op, types, case, rng):
    present, attrs, with_sum, x_shape, w_shape = CASES[case]
    attrs = op_attrs(op, attrs)
    arrays = make_arrays(op, *types, present, x_shape, w_shape, rng)
    check_kernel(op, arrays, attrs, with_sum=with_sum and ops.OPS[op].has_residual)


@pytest.mark.parametrize("types", TYPE_PAIRS, ids=TYPE_IDS)
@pytest.mark.parametrize("op", list(ops.catalogue.FLOAT_OPS))
def test_threaded_many_rows(op, types, rng):
    arrays = make_arrays(op, *types, INPUTS, (4, 300, 256), (256,), rng)
    check_kernel(op, arrays, op_attrs(op, {"alpha": 0.7, "group_size": 64}), threads=2)


@pytest.mark.parametrize(
    "op, dtype, attrs",
    [
        ("RMSNorm", F32, {}),
        ("SkipLayerNorm", BF16, {}),
        ("SandwichRMSNorm", F16, {}),
        ("GatedRMSNorm", F16, {"group_size": 512, "norm_before_gate": 0}),
        ("L2Norm", BF16, {}),
    ],
)
def test_large_tensors_with_streamed_outputs(op, dtype, attrs, rng):
    """Calls moving 48 MiB or more write their outputs with non-temporal stores (the C++ tests
    stream small tensors too, with the threshold lowered)."""
    rows = 1536 if dtype == F32 or ops.OPS[op].has_residual or op == "GatedRMSNorm" else 3072
    arrays = make_arrays(
        op, dtype, F32, ("Scale", "Bias", "XBias", "InnerScale", "Gate"), (rows, 4096), (4096,), rng
    )
    check_kernel(op, arrays, attrs, threads=2)


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=type_id)
@pytest.mark.parametrize("op", ["RMSNorm", "LayerNorm", "SkipRMSNorm", "L2Norm", "GatedRMSNorm"])
def test_qk_norm_short_rows_per_head_scale(op, dtype, rng):
    """Q/K-norm: [batch, seq, heads, head_dim] normalized over head_dim, Scale per head (L2Norm:
    no Scale; GatedRMSNorm: with a gate)."""
    arrays = make_arrays(op, dtype, dtype, ("Scale", "Gate"), (2, 64, 8, 128), (8, 128), rng)
    check_kernel(op, arrays, threads=2)


@pytest.mark.parametrize("cols", [1, 2, 3, 7, 8, 15, 16, 17, 31, 33, 63, 100, 255, 257, 1000])
@pytest.mark.parametrize(
    "op", ["LayerNorm", "RMSNorm", "SkipLayerNorm", "SandwichRMSNorm", "GatedRMSNorm", "L2Norm"]
)
def test_odd_widths(op, cols, rng):
    for dtype in DTYPES.values():
        arrays = make_arrays(op, dtype, dtype, ("Scale", "Bias", "Gate"), (3, cols), (cols,), rng)
        attrs = {"epsilon": 1e-3} if cols % 2 else op_attrs(op, {"norm_before_gate": 0})
        check_kernel(op, arrays, attrs)


@pytest.mark.parametrize("op", ["LayerNorm", "SkipLayerNorm", "SandwichLayerNorm"])
@pytest.mark.parametrize("cols", [128, 4096])
def test_layer_norm_large_mean_small_spread(op, cols, rng):
    """mean 1e4, std 1e-2: a one-pass E[x^2] - E[x]^2 in float32 would lose every digit."""
    x = (1e4 + 1e-2 * rng.standard_normal((8, cols))).astype(np.float32)
    arrays = {"X": x}
    if ops.OPS[op].has_residual:
        arrays["Residual"] = (1e-2 * rng.standard_normal((8, cols))).astype(np.float32)
    if op == "SandwichLayerNorm":  # make the outer norm see the large mean too
        arrays["InnerBias"] = np.full(cols, 1e4, np.float32)
    got = run_kernel(op, arrays)[0]
    want = reference_outputs(op, arrays)[0]
    np.testing.assert_allclose(got, want, *ops.reference.tolerance(np.float32))


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=type_id)
def test_layer_norm_rows_whose_first_values_are_outliers(dtype, rng):
    """The one-pass statistics shift by the first vector's mean; when that is far from the row's
    mean the kernel takes a second pass around the mean."""
    x = rng.standard_normal((6, 300)).astype(np.float32)
    x[:, :20] = 1000.0
    x[1, :] += 5e3
    arrays = {"X": x.astype(dtype), "Scale": np.ones(300, dtype)}
    check_kernel("LayerNorm", arrays)
    arrays["Residual"] = np.zeros((6, 300), dtype)
    check_kernel("SkipLayerNorm", arrays)


def test_nan_and_inf_propagate_as_in_reference(rng):
    for op in ops.catalogue.FLOAT_OPS:
        for dtype in DTYPES.values():
            arrays = make_arrays(op, dtype, dtype, ("Scale", "Bias", "Gate"), (4, 40), (40,), rng)
            x = arrays["X"].astype(np.float32)
            x[0, 3], x[1, 5], x[2, 0] = np.nan, np.inf, -np.inf
            arrays["X"] = x.astype(dtype)
            got = run_kernel(op, arrays)
            want = reference_outputs(op, arrays)
            for g, w in zip(got, want):
                g, w = np.asarray(g, np.float32), w.astype(np.float32)
                np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=f"{op} {dtype}")
                np.testing.assert_array_equal(np.isinf(g), np.isinf(w), err_msg=f"{op} {dtype}")
                finite = np.isfinite(w)
                rtol, atol = ops.reference.tolerance(dtype)
                np.testing.assert_allclose(g[finite], w[finite], rtol, atol)


@pytest.mark.parametrize("op", list(ops.catalogue.FLOAT_OPS))
def test_empty_batch_gives_empty_outputs(op, rng):
    arrays = make_arrays(op, F16, F32, INPUTS, (0, 3, 16), (16,), rng)
    got = run_kernel(op, arrays)
    assert [g.shape for g in got] == [(0, 3, 16)] * len(got)


def _bad(op, arrays, attrs=None, message="", with_sum=True):
    arrays = {k: np.ones(s, np.float32) if isinstance(s, tuple) else s for k, s in arrays.items()}
    with pytest.raises(Exception, match=message):
        run_kernel(op, arrays, attrs, with_sum=with_sum)


@pytest.mark.parametrize("op", list(ops.catalogue.FLOAT_OPS))
def test_bad_shapes_and_axis_are_clear_errors(op):
    spec = ops.OPS[op]
    base = {"X": (2, 16)}
    if spec.has_residual:
        base["Residual"] = (2, 16)
    name = f"onnxnorm::{op}"
    _bad(
        op,
        {"X": (), **({"Residual": ()} if spec.has_residual else {})},
        message=rf"{name}: X must have rank >= 1",
    )
    _bad(op, base, {"axis": 2}, message=rf"{name}: axis 2 is out of range")
    _bad(op, base, {"axis": -3}, message=rf"{name}: axis -3 is out of range")
    _bad(
        op,
        {**base, "X": (2, 0), **({"Residual": (2, 0)} if spec.has_residual else {})},
        message=rf"{name}: the normalized dimensions .* hold no elements",
    )
    for weight in (p.name for p in spec.inputs if p.name in WEIGHTS):
        _bad(op, {**base, weight: (8,)}, message=rf"{name}: {weight} of shape \[8\] does not fit X")
        _bad(
            op,
            {**base, weight: (3, 16)},
            message=rf"{name}: {weight} of shape \[3,16\] does not fit X",
        )
    if spec.has_residual:
        _bad(
            op,
            {**base, "Residual": (1, 16)},
            message=rf"{name}: Residual of shape \[1,16\] must have",
        )
        _bad(
            op,
            {**base, "Residual": (2, 16, 1)},
            message=rf"{name}: Residual of shape \[2,16,1\] must have",
        )


@pytest.mark.parametrize("op", list(ops.catalogue.FLOAT_OPS))
def test_mixed_types_are_refused(op):
    spec = ops.OPS[op]
    names = {p.name for p in spec.inputs}

    def f16(shape):
        return np.ones(shape, np.float16)

    base = {"X": f16((2, 16))}
    if spec.has_residual:
        base["Residual"] = f16((2, 16))
    # weights of two types, or (GatedRMSNorm) a Gate of another type than X's
    if "Bias" in names:
        arrays = {**base, "Scale": np.ones(16, np.float32), "Bias": f16(16)}
    elif "Gate" in names:
        arrays = {**base, "Scale": np.ones(16, np.float32), "Gate": np.ones((2, 16), np.float32)}
    else:  # (no weights: an X of no type the op takes)
        arrays = {"X": np.ones((2, 16), np.float64)}
    message = (
        f"no kernel def matches node inputs for Op: {op}"
        if "Scale" in names
        else rf"'tensor\(double\)' of input parameter \(x\) of operator \({op}\)"
    )
    with pytest.raises(Exception, match=message):
        run_kernel(op, arrays)
    if "Scale" in names:
        arrays = {**base, "Scale": np.ones(16, np.float64)}
        with pytest.raises(
            Exception,
            match=rf"'tensor\(double\)' of input parameter \(scale\) of operator \({op}\)",
        ):
            run_kernel(op, arrays)
    if spec.has_residual:
        arrays = {"X": f16((2, 16)), "Residual": np.ones((2, 16), np.float32)}
        with pytest.raises(Exception, match=f"no kernel def matches node inputs for Op: {op}"):
            run_kernel(op, arrays)


@pytest.mark.parametrize("op", ["SkipRMSNorm", "SandwichLayerNorm", "GatedRMSNorm", "L2Norm"])
def test_attributes_of_the_wrong_value_are_errors(op):
    arrays = {"X": (2, 16), "Residual": (2, 16)} if ops.OPS[op].has_residual else {"X": (2, 16)}
    _bad(op, arrays, {"epsilon": -1.0}, message="epsilon")
    if op == "L2Norm":
        return
    _bad(op, arrays, {"cast_before_scale": 2}, message="cast_before_scale")
    if op == "SkipRMSNorm":
        _bad(op, arrays, {"alpha": float("inf")}, message="alpha")
    if op == "GatedRMSNorm":
        _bad(op, arrays, {"group_size": -16}, message="group_size must be an integer >= 0")
        _bad(op, arrays, {"activation": 2}, message="activation must be 0 or 1")
        _bad(op, arrays, {"norm_before_gate": -1}, message="norm_before_gate must be 0 or 1")
        _bad(op, arrays, {"group_size": 1.5}, message="group_size must be an int")


@pytest.mark.parametrize("isa", ["portable", "avx2", "avx512"])
def test_every_instruction_set(isa):
    """The best instruction set runs in this process; the lesser ones in a subprocess each
    (ONNXNORM_CPU_ISA lowers the choice)."""
    check_on_lesser_isa(isa, "check_float_ops", seed=7, timeout=300)


def test_active_isa_is_the_best_this_cpu_has():
    if os.environ.get("ONNXNORM_CPU_ISA"):
        pytest.skip("ONNXNORM_CPU_ISA lowers the choice in this process")
    flags = set()
    if os.path.isfile("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            flags = next(
                (set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")),
                set(),
            )
    if not flags:
        pytest.skip("no /proc/cpuinfo flags to compare with")
    avx512 = {"avx512f", "avx512bw", "avx512vl"} <= flags
    avx512_bf16 = avx512 and {"avx512dq", "avx512_bf16"} <= flags
    avx2 = {"avx2", "fma", "f16c"} <= flags
    want = "avx512_bf16" if avx512_bf16 else "avx512" if avx512 else "avx2" if avx2 else "portable"
    assert active_isa() == want


def test_bfloat16_helpers_agree_with_ml_dtypes():
    assert np.dtype(ml_dtypes.bfloat16) == BF16


def _bench_kernels(tmp_path, capsys, *options: str) -> tuple[str, dict]:
    """Runs ``onnxnorm bench kernels`` briefly (2 repeats of 0.5 ms samples) with ``options``;
    returns its printed table and the JSON it wrote."""
    import argparse
    import json

    from onnxnorm.bench import cli

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command", required=True))
    brief = ["--repeats", "2", "--min-sample", "0.0005", "--json", str(tmp_path / "run.json")]
    args = parser.parse_args(["bench", "kernels", *options, *brief])
    assert args.run(args) == 0
    return capsys.readouterr().out, json.loads((tmp_path / "run.json").read_text())


def test_bench_kernels_quick_run_writes_table_json_and_plot(tmp_path, capsys):
    from onnxnorm import runtime
    from onnxnorm.bench import kernels

    out, data = _bench_kernels(
        tmp_path, capsys, "--ops", "SkipRMSNorm", "--shapes", "1x1x4096", "--dtypes", "float16",
        "--compare-library", f"same={runtime.library_path()}", "--plot", str(tmp_path / "run.png"),
    )  # fmt: skip
    assert "| SkipRMSNorm | 1x1x4096 | float16 |" in out
    (row,) = data["results"]
    assert (
        row["median_seconds"]["onnxnorm"] > 0
        and row["best_ort"] == "ort:SkipSimplifiedLayerNormalization"
    )
    assert row["median_seconds"]["floor"] > 0 and row["ratio_to_ort_floor"] > 0
    assert row["median_seconds"]["onnxnorm@same"] > 0 and "| same µs | same / ORT |" in out
    assert (
        data["environment"]["warmup_seconds"] == 0.01
        and len(data["environment"]["load_average"]) == 3
    )
    times = row["median_seconds"]
    assert times["copy"] == min(times["copy:numpy"], times["copy:threads"])
    assert (tmp_path / "run.png").stat().st_size > 10000
    assert kernels.load_results(str(tmp_path / "run.json"))[0].op == "SkipRMSNorm"


def test_bench_kernels_gated_and_l2_norms_on_their_shapes(tmp_path, capsys):
    """GatedRMSNorm and L2Norm run on their models' shapes against ORT's built-in forms (n/a
    where ORT has none: Mamba2's gate first), the decomposed graph, torch and the copy; with
    --shapes, each op runs the shapes it has."""
    out, data = _bench_kernels(
        tmp_path, capsys, "--ops", "GatedRMSNorm,L2Norm,RMSNorm", "--dtypes", "float16",
        "--shapes", "qwen3next-1x1x2048,mamba2-1x1x4096,qk-l2-1x1x16x128,1x1x4096",
    )  # fmt: skip
    rows = {(r["op"], r["shape"]): r for r in data["results"]}
    assert set(rows) == {
        ("GatedRMSNorm", "qwen3next-1x1x2048"),
        ("GatedRMSNorm", "mamba2-1x1x4096"),
        ("L2Norm", "qk-l2-1x1x16x128"),
        ("RMSNorm", "1x1x4096"),
    }
    for key in rows:
        times = rows[key]["median_seconds"]
        assert times["onnxnorm"] > 0 and times["decomposed"] > 0 and times["torch"] > 0, key
        assert times["copy"] > 0 and times["floor"] > 0, key
    assert rows[("GatedRMSNorm", "qwen3next-1x1x2048")]["best_ort"] == "ort:GatedRMSNorm"
    mamba2 = rows[("GatedRMSNorm", "mamba2-1x1x4096")]
    assert mamba2["median_seconds"]["ort:GatedRMSNorm"] is None
    assert "gate after the norm only" in mamba2["notes"]["ort:GatedRMSNorm"]
    assert rows[("L2Norm", "qk-l2-1x1x16x128")]["best_ort"] == "ort:LpNormalization"
    assert "| GatedRMSNorm | qwen3next-1x1x2048 | float16 |" in out


@pytest.mark.parametrize("dtype", ["float32", "float16"])  # (session.run takes no bfloat16)
def test_bench_gated_and_l2_contenders_agree(dtype):
    """The benchmark's models of GatedRMSNorm and L2Norm compute what the onnxnorm node computes:
    ORT's built-in forms (LpNormalization: without an epsilon) and the decomposed graphs of the
    models' torch code."""
    from onnxnorm import runtime
    from onnxnorm.bench import kernels
    from onnxnorm.bench.kernels.contenders import decomposed_model

    rng = np.random.default_rng(5)
    tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == "float32" else {"rtol": 4e-3, "atol": 4e-3}

    def y(model, arrays, with_library):
        options = ort.SessionOptions()
        options.log_severity_level = 3
        session = runtime.session(model, options, with_library=with_library)
        names = {i.name for i in session.get_inputs()}
        feeds = {n: a for n, a in arrays.items() if n in names}
        return session.run(None, feeds)[0].astype(np.float32)

    for op in ("GatedRMSNorm", "L2Norm"):
        for name, case in kernels.OP_SHAPES[op].items():
            if "x512" in name:
                continue  # (the decode shapes: the same graphs)
            x = case.x[:-2] + (3,) + case.x[-1:] if op == "GatedRMSNorm" else case.x
            np_type = kernels.np_dtype(dtype)
            arrays = {"x": rng.standard_normal(x).astype(np_type)}
            if case.scale is not None:
                arrays["s"] = (1 + 0.1 * rng.standard_normal(case.scale)).astype(np_type)
            if op == "GatedRMSNorm":
                arrays["g"] = rng.standard_normal(x).astype(np_type)
            d = x[-1]
            ours = y(
                kernels.onnxnorm_model(op, dtype, x, d, attrs=case.attrs, scale_shape=case.scale),
                arrays,
                True,
            )
            theirs = y(decomposed_model(op, dtype, arrays, case.attrs), arrays, False)
            np.testing.assert_allclose(ours, theirs, err_msg=f"{op} {name} decomposed", **tolerance)
            for label in kernels.ORT_BUILTINS[op]:
                try:
                    model = kernels.ort_builtin_model(
                        label, dtype, x, d, attrs=case.attrs, scale_shape=case.scale
                    )
                except ValueError:
                    continue  # (Mamba2's form: no ORT op)
                np.testing.assert_allclose(
                    ours, y(model, arrays, False), err_msg=f"{op} {name} {label}", **tolerance
                )


def test_bench_kernels_rotary_rows(tmp_path, capsys):
    """The rotary ops run on grouped-query attention's shapes (decode 1 and 8 tokens, a 512-token
    prefill in layouts 0 and 2) against ORT's norm and RotaryEmbedding for Q and K (n/a in
    bfloat16, which ORT's RotaryEmbedding lacks), the decomposed graph, torch, the floor and a
    copy of Q and K; --ops RMSNormRotary picks them."""
    from onnxnorm.bench import kernels

    for op in ops.catalogue.ROTARY_OPS:
        assert list(kernels.op_shapes(op)) == [
            "q32k8-1x1x128",
            "q32k8-1x8x128",
            "q32k8-1x512x128",
            "q32k8-1x512x128-bhsd",
        ]
        assert kernels.ORT_BUILTINS[op], op
    out, data = _bench_kernels(
        tmp_path, capsys, "--ops", "RMSNormRotary", "--dtypes", "float32,bfloat16",
        "--shapes", "q32k8-1x1x128,q32k8-1x512x128-bhsd,1x1x4096",
    )  # fmt: skip
    rows = {(r["shape"], r["dtype"]): r for r in data["results"]}
    assert set(rows) == {
        (shape, dtype)
        for shape in ("q32k8-1x1x128", "q32k8-1x512x128-bhsd")
        for dtype in ("float32", "bfloat16")
    }
    for key, row in rows.items():
        times = row["median_seconds"]
        assert row["op"] == "RMSNormRotary", key
        assert times["onnxnorm"] > 0 and times["decomposed"] is not None, (key, row["notes"])
        assert times["torch"] > 0 and times["floor"] > 0 and times["copy"] > 0, key
        assert isinstance(row["target_misses"], list), key
    assert rows[("q32k8-1x1x128", "float32")]["best_ort"] in {
        "ort:" + label for label in kernels.ORT_BUILTINS["RMSNormRotary"]
    }
    bf16 = rows[("q32k8-1x1x128", "bfloat16")]
    assert bf16["best_ort"] is None
    assert "RotaryEmbedding" in bf16["notes"]["ort:SimplifiedLayerNormalization+RotaryEmbedding"]
    assert "| RMSNormRotary | q32k8-1x512x128-bhsd | float32 |" in out


def test_bench_rotary_targets():
    """A rotary row meets its targets at 1.5x ORT's norm and RotaryEmbedding, and on a prefill
    row within 1.2x of the copy's time; by the median and the best-of times."""
    from onnxnorm.bench import kernels

    def row(shape, mine, ort_time, copy):
        times = {"onnxnorm": mine, "ort:SimplifiedLayerNormalization+RotaryEmbedding": ort_time}
        times |= {"copy": copy, "floor": 1.0, "decomposed": 100 * mine}
        return kernels.Result("RMSNormRotary", shape, "float16", times, {}, dict(times))

    assert row("q32k8-1x1x128", 1.0, 1.5, 0.1).verdict() == "met"
    assert row("q32k8-1x1x128", 1.0, 1.4, 0.1).targets() == [
        "1.40x as fast as SimplifiedLayerNormalization+RotaryEmbedding < 1.5x"
    ]
    assert row("q32k8-1x512x128", 1.2, 2.0, 1.0).verdict() == "met"
    assert row("q32k8-1x512x128-bhsd", 1.3, 2.0, 1.0).verdict() == (
        "MISSED: 1.30x the copy's time > 1.2x"
    )
    assert row("q32k8-1x512x128", 1.0, None, 0.5).targets() == ["2.00x the copy's time > 1.2x"]


@pytest.mark.parametrize("dtype", ["float32", "float16"])  # (session.run takes no bfloat16)
def test_bench_rotary_contenders_agree(dtype):
    """The benchmark's models of the rotary ops compute what the onnxnorm node computes, on a
    small shape with each row's attributes (layouts 0 and 2): ORT's norm and RotaryEmbedding
    (LpNormalization: without an epsilon), the decomposed graph and torch eager."""
    from onnxnorm import runtime
    from onnxnorm.bench import kernels
    from onnxnorm.bench.kernels import rotary

    rng = np.random.default_rng(7)
    rtol, atol = (1e-5, 1e-5) if dtype == "float32" else (4e-3, 8e-3)

    def y(model, arrays, with_library):
        options = ort.SessionOptions()
        options.log_severity_level = 3
        session = runtime.session(model, options, with_library=with_library)
        names = {i.name for i in session.get_inputs()}
        feeds = {n: a for n, a in arrays.items() if n in names}
        return [a.astype(np.float32) for a in session.run(None, feeds)]

    for op in ops.catalogue.ROTARY_OPS:
        for name in ("q32k8-1x8x128", "q32k8-1x512x128-bhsd"):
            case = kernels.op_shapes(op)[name]
            small = kernels.OpShape((1, 3, 4, 128), case.attrs, case.scale, (1, 3, 2, 128))
            arrays = rotary.make_arrays(op, small, dtype, rng)
            ours = y(rotary.onnxnorm_model(op, dtype, small), arrays, True)
            assert [a.shape for a in ours] == list(rotary.output_shapes(small).values())
            theirs = {"decomposed": y(rotary.decomposed_model(op, dtype, small), arrays, False)}
            for label in kernels.ORT_BUILTINS[op]:
                theirs[label] = y(rotary.ort_builtin_model(label, dtype, small), arrays, False)
            theirs["torch"] = [t.float().numpy() for t in rotary.torch_call(op, small, arrays)()]
            for contender, outputs in theirs.items():
                for mine, other in zip(ours, outputs, strict=True):
                    np.testing.assert_allclose(
                        mine, other, rtol, atol, err_msg=f"{op} {name} {contender}"
                    )


def test_bench_quant_types_are_the_catalogues():
    """--quant-type offers the types the benchmark has a zero point for, which must be the
    catalogue's quantized types (its options are declared without importing the catalogue)."""
    from onnxnorm import _native
    from onnxnorm.bench import kernels

    assert list(kernels.QUANT_ZERO_POINTS) == [
        _native.elem_type_name(t) for t in ops.catalogue.QUANT_TYPES
    ]


def test_bench_help_imports_neither_torch_nor_onnx():
    """Registering the bench subcommands imports nothing heavy: each one's --help takes a tenth of
    a second, where importing onnx for the catalogue's op names took 1.3 s."""
    script = """
import sys
from onnxnorm.bench.cli import SUBCOMMANDS
from onnxnorm.cli import main
for name in SUBCOMMANDS:
    try:
        main(["bench", name, "--help"])
    except SystemExit as stop:
        assert stop.code == 0, name
heavy = ("torch", "transformers", "onnx", "onnxruntime", "onnxnorm.ops", "onnxnorm._native")
print("LOADED", sorted(m for m in heavy if m in sys.modules))
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    for name in ("kernels", "e2e", "cuda"):
        assert f"usage: onnxnorm bench {name}" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "LOADED []"


@pytest.mark.parametrize("threads,nbytes", [(2, 1 << 20), (2, 1000003), (3, 4097), (4, 64)])
def test_bench_threaded_copy_copies_every_byte(threads, nbytes):
    """The copy bound's threaded contender copies the whole buffer, whatever its size and the
    thread count (slices of 64-byte multiples, the last one shorter)."""
    from concurrent.futures import ThreadPoolExecutor

    from onnxnorm.bench import kernels

    source = np.random.default_rng(nbytes).integers(0, 255, nbytes, dtype=np.uint8)
    target = np.zeros_like(source)
    with ThreadPoolExecutor(threads - 1) as pool:
        kernels.threaded_copy(pool, threads, source, target)()
    np.testing.assert_array_equal(target, source)


def test_bench_kernels_quick_run_float8(tmp_path, capsys):
    """--quant-type float8e4m3fn: the static quantized ops quantize to float8, against ORT's norm
    and its QuantizeLinear to float8 (for bfloat16 only after Casts to float32: ORT's CPU
    QuantizeLinear has no bfloat16 kernel)."""
    out, data = _bench_kernels(
        tmp_path, capsys, "--ops", "RMSNormQuantizeLinear,RMSNorm", "--shapes", "1x1x4096",
        "--dtypes", "float16,bfloat16", "--quant-type", "float8e4m3fn",
    )  # fmt: skip
    for dtype in ("float16", "bfloat16"):
        assert f"| RMSNormQuantizeLinear | 1x1x4096 | {dtype} -> float8e4m3fn |" in out
        assert f"| RMSNorm | 1x1x4096 | {dtype} |" in out  # (the float ops have no Y type)
    assert data["environment"]["quant_type"] == "float8e4m3fn"
    rows = {(r["op"], r["dtype"]): r for r in data["results"]}
    for dtype in ("float16", "bfloat16"):
        row = rows[("RMSNormQuantizeLinear", dtype)]
        assert (
            row["quant_type"] == "float8e4m3fn" and rows[("RMSNorm", dtype)]["quant_type"] is None
        )
        times = row["median_seconds"]
        assert times["onnxnorm"] > 0, row["notes"]
        assert times["ort:SimplifiedLayerNormalization+Cast+QuantizeLinear"] > 0, row["notes"]
    f16, bf16 = (
        rows[("RMSNormQuantizeLinear", "float16")],
        rows[("RMSNormQuantizeLinear", "bfloat16")],
    )
    assert f16["median_seconds"]["ort:SimplifiedLayerNormalization+QuantizeLinear"] > 0
    assert bf16["median_seconds"]["ort:SimplifiedLayerNormalization+QuantizeLinear"] is None
    assert "QuantizeLinear" in bf16["notes"]["ort:SimplifiedLayerNormalization+QuantizeLinear"]


#: (static quantized op, X's type): bfloat16 for the ops without a residual only, as ORT's Skip
#: kernels round Sum after normalizing it, a unit in the last place of bfloat16 away from the op
_BENCH_CASES = [
    (name, dtype)
    for name, spec in ops.catalogue.QUANTIZED_OPS.items()
    if spec.quantize == "static"
    for dtype in DTYPES
    if dtype != "bfloat16" or not spec.has_residual
]


@pytest.mark.parametrize("quant_type", ["uint8", "float8e4m3fn"])
@pytest.mark.parametrize("op, dtype", _BENCH_CASES)
def test_bench_quant_type_contenders_agree(op, dtype, quant_type, rng):
    """With --quant-type, the benchmark's fused op and ORT's norms followed by ORT's QuantizeLinear
    give Y of that type with the same values (float8: the same bits but where the two float norms
    round a value next to a tie between two float8 values apart), so the rows compare like with
    like."""
    from onnxnorm import runtime
    from onnxnorm.bench import kernels

    shape, d = BENCH_SHAPE, BENCH_SHAPE[-1]
    # a Scale about 4: some values saturate
    arrays = bench_arrays(op, dtype, kernels.zero_point(quant_type), rng, scale=4.0)

    def outputs(model, with_library):
        """Y (float8: its codes), and the names of the outputs."""
        options = ort.SessionOptions()
        options.log_severity_level = 3
        session = runtime.session(model, options, with_library=with_library)
        names = [i.name for i in session.get_inputs()]
        got = session.run_with_ort_values(["y"], {n: kernels.ortvalue(arrays[n]) for n in names})
        return {"y": got[0].numpy(), "names": {o.name for o in session.get_outputs()}}

    ours = outputs(kernels.onnxnorm_model(op, dtype, shape, d, quant_type), True)
    compared = 0
    for label in kernels.ORT_BUILTINS[op]:
        cast = "+Cast+" in label
        if (cast and dtype == "float32") or (not cast and dtype == "bfloat16"):
            continue  # (no Cast for float32; no QuantizeLinear of bfloat16 in ORT's CPU provider)
        try:
            theirs = outputs(kernels.ort_builtin_model(label, dtype, shape, d, quant_type), False)
        except ort.capi.onnxruntime_pybind11_state.NotImplemented:
            continue  # ORT's norm lacks this type (the bench notes it n/a)
        compared += 1
        assert theirs["names"] == ours["names"], label
        assert ours["y"].dtype == theirs["y"].dtype == np.dtype(np.uint8), label
        same = ours["y"] == theirs["y"]
        assert same.mean() > 0.98, label
        if quant_type == "float8e4m3fn":
            # where the float norms differ in their last places: one float8 step apart (1/8
            # relative), or, next to zero, as far as float16 rounding of the row takes a value
            assert {0x7E, 0xFE} <= set(theirs["y"].ravel().tolist())  # +-448
            a, b = (
                v.view(ml_dtypes.float8_e4m3fn).astype(np.float32) for v in (ours["y"], theirs["y"])
            )
            np.testing.assert_allclose(a, b, rtol=1 / 8, atol=1 / 16, err_msg=label)
        else:
            diff = ours["y"].astype(np.int32) - theirs["y"].astype(np.int32)
            assert np.abs(diff).max() <= 1, label
    assert compared


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--ops", "Foo"], "argument --ops: unknown Foo"),
        (["--quant-type", "float8e5m2"], "argument --quant-type: invalid choice: 'float8e5m2'"),
        (["--shapes", "3x3"], "argument --shapes: unknown 3x3"),
        (["--dtypes", "int8"], "argument --dtypes: unknown int8"),
        (["--threads", "0"], "--threads and --repeats must be at least 1"),
        (["--repeats", "-1"], "--threads and --repeats must be at least 1"),
        (["--warmup", "-1"], "--warmup must be 0 or more"),
        (
            ["--compare-library", "old=/nonexistent.so"],
            "--compare-library old=/nonexistent.so: give NAME=PATH",
        ),
        (["--json", "/nonexistent-folder/run.json"], "folder /nonexistent-folder does not exist"),
        (["--plot", "/tmp"], "cannot write /tmp: it is a directory"),
    ],
)
def test_bench_bad_arguments_are_one_line_errors(argv, message, capsys):
    from onnxnorm import cli

    try:
        status = cli.main(["bench", "kernels", *argv])
    except SystemExit as exit_:  # argparse's own errors
        status = exit_.code
    assert status != 0
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.skipif(tool("cmake") is None or tool("ctest") is None, reason="needs cmake and ctest")
def test_kernels_cxx_ctest():
    """The C++ tests of the row kernels (custom_ops/tests/kernel_tests.cc), built by CMake from the
    same kernel objects as the library (in the editable install's build folder, else in
    build/kernel-tests) and run by ctest: every op, type pair,
    optional input, attribute and rounding order against a scalar float64 reference, misaligned and
    streamed tensors, rows split as threads split them, the float16/bfloat16 conversions, and every
    instruction set this CPU has against the others, byte for byte; and the two microbenchmarks
    docs/benchmarks.md uses, run once briefly."""
    root = Path(__file__).resolve().parents[2]
    jobs = str(max(1, min(4, os.cpu_count() or 1)))
    build = package_build_with_tests(root)
    steps = []
    if build is None:  # a build of its own
        build = root / "build" / "kernel-tests"
        configure = [
            tool("cmake"),
            "-S",
            str(root),
            "-B",
            str(build),
            "-DONNXNORM_CUDA=OFF",
            "-DONNXNORM_BUILD_TESTS=ON",
            "-DCMAKE_BUILD_TYPE=Release",
        ]
        if not (build / "CMakeCache.txt").exists() and tool("ninja"):
            configure += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={tool('ninja')}"]
        steps.append(configure)
    steps += [
        [
            tool("cmake"),
            "--build",
            str(build),
            "--target",
            "onnxnorm_kernel_tests",
            "onnxnorm_kernel_bench",
            "onnxnorm_rotary_bench",
            "--parallel",
            jobs,
        ],
        [tool("ctest"), "--test-dir", str(build), "--output-on-failure", "--parallel", jobs],
    ]
    for step in steps:
        result = subprocess.run(step, capture_output=True, text=True, timeout=1800)
        assert result.returncode == 0, (
            f"{' '.join(step)}\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
        )
    assert "100% tests passed" in result.stdout, result.stdout[-3000:]
