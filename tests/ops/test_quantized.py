"""The quantized ops (a norm followed by QuantizeLinear or DynamicQuantizeLinear): the numpy
reference against ONNX Runtime's own quantizers, the function bodies run by plain ONNX Runtime
against the reference, the onnx schemas' type inference.

Quantized values are compared exactly. A float kernel (here ORT running the function body) may
round the norm's output to X's type one unit in the last place away from the reference (float32
statistics against float64); that can move a quantized value by one step. So each comparison
first checks that the op quantized its own float output Y_float exactly, then that Y equals the
reference's wherever the two float outputs are equal, and differs by at most one step where they
are not.

float8 e4m3fn Y (a float8 Y_zero_point, its value unused) is compared by its bits (ORT's Python
API returns them as uint8): the same bits, any NaN code where the reference gives NaN; one step
is one float8 value up or down."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from onnxnorm import ops, runtime
from onnxnorm.ops import catalogue, reference
from onnxnorm.testing.graphs import single_node_model
from tests.support.bench import BENCH_SHAPE, bench_arrays
from tests.support.helpers import (
    F8_ZERO_POINT,
    assert_close,
    assert_float8_equal,
    float8_nan,
    reference_outputs,
    run,
)
from tests.support.matrix import DTYPES, F8, TYPE_IDS, TYPE_PAIRS

STATIC = [name for name, spec in catalogue.QUANTIZED_OPS.items() if spec.quantize == "static"]
DYNAMIC = [name for name, spec in catalogue.QUANTIZED_OPS.items() if spec.quantize == "dynamic"]


# ---------------------------------------------------------------------------------------------
# float8 e4m3fn: models, runs and comparisons (helpers' builders know the 8-bit integer types
# only, and ORT's Python API takes and gives float8 as uint8 bits)


def _float8_steps(bits: np.ndarray) -> np.ndarray:
    """float8 e4m3fn bits as whole numbers in the values' order, neighbours 1 apart (+-0: 0)."""
    b = bits.astype(np.int32)
    return np.where(b & 0x80, -(b & 0x7F), b & 0x7F)


def quant_arrays(
    op, dtype, rng, shape=(2, 3, 64), present=("Scale", "Bias"), zero_point=None, y_scale=0.02
):
    """Inputs of ``op``: X of spread about 2 (so that a scale of 0.02 saturates some values,
    float8's beyond 448 too), the weights in ``present``, and for the static ops Y_scale and
    Y_zero_point (a numpy scalar of uint8, int8 or float8 e4m3fn, or None: absent)."""
    spec = catalogue.get(op)
    dtype = np.dtype(dtype)
    arrays = {"X": (2 * rng.standard_normal(shape) + 0.3).astype(dtype)}
    if spec.has_residual:
        arrays["Residual"] = rng.standard_normal(shape).astype(dtype)
    weights = {p.name for p in spec.inputs if p.type_var == "S"}
    for name in present:
        if name in weights:
            arrays[name] = (1 + 0.5 * rng.standard_normal(shape[-1:])).astype(dtype)
    if spec.quantize == "static":
        arrays["Y_scale"] = np.array(y_scale, dtype)
        if zero_point is not None:
            arrays["Y_zero_point"] = np.asarray(zero_point)
    return arrays


def outputs_by_name(spec, values, x_dtype):
    """The outputs by name; float outputs back in X's type (bfloat16 comes back as float32)."""
    named = {}
    for p, value in zip(spec.outputs, values):
        named[p.name] = value.astype(x_dtype) if p.type_var == "T" else value
    return named


def _cases():
    for op in catalogue.QUANTIZED_OPS:
        spec = catalogue.get(op)
        zero_points = (
            [None, np.uint8(131), np.int8(-5), F8_ZERO_POINT]
            if spec.quantize == "static"
            else [None]
        )
        for dtype, zero_point, opset, order in itertools.product(
            DTYPES, zero_points, (17, 21), (0, 1)
        ):
            if dtype == "float32" and order:
                continue
            if zero_point is not None and zero_point.dtype == F8 and opset < 19:
                continue  # (float8 QuantizeLinear: opset 19 and newer)
            zp = "none" if zero_point is None else f"{zero_point.dtype}"
            yield pytest.param(
                op,
                dtype,
                zero_point,
                opset,
                order,
                id=f"{op}-{dtype}-zp_{zp}-opset{opset}-order{order}",
            )


@pytest.mark.parametrize("op, dtype, zero_point, opset, order", _cases())
def test_function_body_matches_reference(op, dtype, zero_point, opset, order, rng):
    """Every quantized op, dtype, zero point type (float8 e4m3fn: opset 21) and rounding order:
    the function body run by plain ONNX Runtime (its own norm ops, QuantizeLinear /
    DynamicQuantizeLinear) against the reference, quantized values exactly."""
    spec = catalogue.get(op)
    present = spec.optional_inputs if order else ("Scale",)
    arrays = quant_arrays(op, DTYPES[dtype], rng, present=present, zero_point=zero_point)
    attrs = {"cast_before_scale": order}
    model = single_node_model(op, arrays, attrs, opset=opset)
    onnx.checker.check_model(model, full_check=True)
    got = run(model, arrays)
    assert_quantized(op, arrays, got, attrs)


def assert_quantized(op, arrays, got, attrs=None):
    """check_quantized against the reference for outputs of a node with every output."""
    spec = catalogue.get(op)
    want = reference_outputs(op, arrays, attrs)
    assert len(got) == len(want) == len(spec.outputs)
    x_dtype = arrays["X"].dtype
    g = outputs_by_name(spec, got, x_dtype)
    w = outputs_by_name(spec, want, x_dtype)
    assert_close(g["Y_float"], w["Y_float"])
    if "Sum" in g:
        assert_close(g["Sum"], w["Sum"])
    assert g["Y"].dtype == w["Y"].dtype and g["Y"].shape == w["Y"].shape == arrays["X"].shape
    if spec.quantize == "static":
        zero_point = np.asarray(arrays.get("Y_zero_point", np.uint8(0)))
        own = reference.quantize_linear(g["Y_float"], arrays["Y_scale"], zero_point)
        if own.dtype == F8:
            assert_float8_equal(g["Y"], own)  # the op quantized its own Y_float exactly
        else:
            np.testing.assert_array_equal(g["Y"], own)  # the op quantized its own Y_float exactly
    else:
        own = reference.dynamic_quantize_linear(g["Y_float"])
        assert g["Y_scale"].dtype == np.float32 and g["Y_scale"].shape == ()
        assert g["Y_zero_point"].dtype == np.uint8 and g["Y_zero_point"].shape == ()
        for got_value, own_value in zip((g["Y"], g["Y_scale"], g["Y_zero_point"]), own):
            np.testing.assert_array_equal(got_value, own_value)
        ranges = [
            (np.nanmin(v.astype(np.float32)), np.nanmax(v.astype(np.float32)))
            for v in (g["Y_float"], w["Y_float"])
        ]
        if ranges[0] != ranges[1]:
            return  # the float outputs' extremes differ in the last place: so do the scales
        np.testing.assert_array_equal(g["Y_scale"], w["Y_scale"])
        np.testing.assert_array_equal(g["Y_zero_point"], w["Y_zero_point"])
    # equal to the reference's Y wherever the float outputs are equal, one step at most elsewhere
    gf, wf = g["Y_float"].astype(np.float32), w["Y_float"].astype(np.float32)
    same_float = (gf == wf) | (np.isnan(gf) & np.isnan(wf))
    if g["Y"].dtype == F8:
        assert_float8_equal(g["Y"][same_float], w["Y"][same_float])
        diff = _float8_steps(g["Y"].view(np.uint8)) - _float8_steps(w["Y"].view(np.uint8))
        assert np.abs(diff[~same_float]).max(initial=0) <= 1
        return
    diff = g["Y"].astype(np.int32) - w["Y"].astype(np.int32)
    np.testing.assert_array_equal(diff[same_float], 0)
    assert np.abs(diff).max(initial=0) <= 1


@pytest.mark.parametrize("op", list(catalogue.QUANTIZED_OPS))
def test_function_body_with_fewer_outputs(op, rng):
    """A node without Y_float (and Sum) gets a body without them; one with Y_float but without
    Sum names Sum "" in the middle of its outputs. The quantized outputs do not change."""
    spec = catalogue.get(op)
    arrays = quant_arrays(op, np.float16, rng, zero_point=np.int8(3))
    full = run(single_node_model(op, arrays), arrays)
    quantized = 3 if spec.quantize == "dynamic" else 1
    variants = [False, {"Y_float"}] + ([{"Sum"}] if spec.has_residual else [])
    for outputs in variants:
        model = single_node_model(op, arrays, optional_outputs=outputs)
        got = run(model, arrays)
        for g, f in zip(got[:quantized], full[:quantized]):
            np.testing.assert_array_equal(g, f)
        if outputs and "Y_float" in outputs:
            np.testing.assert_array_equal(got[-1], full[-1])
            assert model.functions[0].overload.endswith("_float")


# ---------------------------------------------------------------------------------------------
# The reference against ONNX Runtime's own QuantizeLinear and DynamicQuantizeLinear


def _ort_quantizer(op, x, *inputs, outputs=(TensorProto.UINT8,), opset=21):
    names = ["x"] + [f"i{k}" for k in range(len(inputs))]
    graph = helper.make_graph(
        [helper.make_node(op, names, [f"o{k}" for k in range(len(outputs))])],
        "q",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info(f"o{k}", t, None) for k, t in enumerate(outputs)],
        [onnx.numpy_helper.from_array(np.asarray(v), f"i{k}") for k, v in enumerate(inputs)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


EDGES = np.array(
    [
        np.nan,
        np.inf,
        -np.inf,
        0.0,
        -0.0,
        0.5,
        1.5,
        2.5,
        -0.5,
        -1.5,
        127.5,
        128.5,
        -128.5,
        254.5,
        255.5,
        300.0,
        -300.0,
        1e-30,
        3.4e38,
    ],
    np.float32,
)


@pytest.mark.parametrize("zero_point", [np.uint8(0), np.uint8(200), np.int8(0), np.int8(-7)])
@pytest.mark.parametrize("scale", [1.0, 0.37, 0.0, 3e-39])
def test_reference_quantize_linear_is_ort_s(zero_point, scale):
    """Ties to even, saturation, NaN (the type's minimum), Inf, a zero or subnormal scale."""
    scale = np.float32(scale)
    out = TensorProto.INT8 if zero_point.dtype == np.int8 else TensorProto.UINT8
    want = _ort_quantizer("QuantizeLinear", EDGES, scale, zero_point, outputs=(out,))[0]
    np.testing.assert_array_equal(
        reference.quantize_linear(EDGES, scale, np.asarray(zero_point)), want
    )


@pytest.mark.parametrize("zero_point", [np.int8(-3), np.uint8(100)])
@pytest.mark.parametrize("scale", [0.25, 0.0137])
def test_reference_quantize_linear_is_ort_s_for_float16(zero_point, scale, rng):
    """QuantizeLinear of float16 values with a float16 scale (opset 19 and newer), which the
    fusion takes as it is: ORT divides in float32 too, ties included."""
    x = (3 * rng.standard_normal(20000)).astype(np.float16)
    x[:64] = ((np.arange(64) - 32 + 0.5) * 0.25).astype(np.float16)  # ties at scale 0.25
    scale = np.array(scale, np.float16)
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])],
        "q",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, x.shape)],
        [
            helper.make_tensor_value_info(
                "y", helper.np_dtype_to_tensor_dtype(zero_point.dtype), None
            )
        ],
        [
            onnx.numpy_helper.from_array(scale, "s"),
            onnx.numpy_helper.from_array(np.asarray(zero_point), "z"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    np.testing.assert_array_equal(reference.quantize_linear(x, scale, np.asarray(zero_point)), want)


@pytest.mark.parametrize(
    "values",
    [
        np.zeros(37, np.float32),  # range [0, 0]: scale 1
        np.array([1, 2, 3], np.float32),  # no negative value: zero point 0
        np.array([-1, -2, -3], np.float32),  # no positive value: zero point 255
        np.array([-1, np.nan, 3], np.float32),  # NaN left out of the range
        np.array([-1, np.inf, 3], np.float32),  # an infinite scale
        np.array([1e-45, 0], np.float32),  # a scale that underflows to 0
        np.linspace(-3, 5, 1000, dtype=np.float32),
        np.linspace(-0.7, 0.1, 333, dtype=np.float32) ** 3,
    ],
)
def test_reference_dynamic_quantize_linear_is_ort_s(values):
    want = _ort_quantizer(
        "DynamicQuantizeLinear",
        values,
        outputs=(TensorProto.UINT8, TensorProto.FLOAT, TensorProto.UINT8),
    )
    got = reference.dynamic_quantize_linear(values)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


def test_all_zero_output_gives_scale_one(rng):
    """LayerNorm of constant rows without Bias is 0 everywhere: DynamicQuantizeLinear's range
    is [0, 0], and ONNX Runtime (and so the op) gives scale 1, zero point 0."""
    arrays = {"X": np.full((3, 16), 2.5, np.float32)}
    y, scale, zero_point, y_float = reference_outputs("LayerNormDynamicQuantizeLinear", arrays)
    assert scale == np.float32(1) and zero_point == 0 and not y.any() and not y_float.any()
    got = run(single_node_model("LayerNormDynamicQuantizeLinear", arrays), arrays)
    for g, w in zip(got, (y, scale, zero_point, y_float)):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("op", ["RMSNormQuantizeLinear", "SkipLayerNormDynamicQuantizeLinear"])
def test_nan_rows(op, rng):
    """A NaN in X makes its row NaN: the static op gives the type's minimum there, the dynamic
    op leaves the row out of the range."""
    arrays = quant_arrays(op, np.float32, rng, shape=(4, 32), zero_point=np.int8(4))
    arrays["X"][1, 3] = np.nan
    want = reference_outputs(op, arrays)
    spec = catalogue.get(op)
    if spec.quantize == "static":
        assert (want[0][1] == -128).all() and (want[0][0] > -128).any()
    else:
        assert np.isfinite(want[1]) and (want[0][1] == 0).all()
    assert_quantized(op, arrays, run(single_node_model(op, arrays), arrays))


def test_saturation(rng):
    """A scale far too small: nearly every value saturates, as QuantizeLinear saturates it."""
    arrays = quant_arrays(
        "LayerNormQuantizeLinear", np.float16, rng, y_scale=1e-4, zero_point=np.int8(0)
    )
    y = reference_outputs("LayerNormQuantizeLinear", arrays)[0]
    assert ((y == 127) | (y == -128)).mean() > 0.95 and (y == 127).any() and (y == -128).any()
    assert_quantized(
        "LayerNormQuantizeLinear",
        arrays,
        run(single_node_model("LayerNormQuantizeLinear", arrays), arrays),
    )


def test_reference_refuses_per_axis_and_bad_types(rng):
    arrays = quant_arrays("RMSNormQuantizeLinear", np.float32, rng, shape=(2, 8))
    with pytest.raises(ValueError, match="per-tensor"):
        reference.run("RMSNormQuantizeLinear", arrays["X"], None, None, np.ones(2, np.float32))
    with pytest.raises(TypeError, match="Y_scale must be of X's type"):
        reference.run("RMSNormQuantizeLinear", arrays["X"], None, None, np.float16(1))
    with pytest.raises(TypeError, match="Y_zero_point must be uint8, int8 or float8e4m3fn"):
        reference.run("RMSNormQuantizeLinear", arrays["X"], None, None, np.float32(1), np.int16(0))
    # a one-element 1-D scale is per tensor, as in QuantizeLinear
    one = reference.run("RMSNormQuantizeLinear", arrays["X"], None, None, np.ones(1, np.float32))
    np.testing.assert_array_equal(
        one[0], reference.run("RMSNormQuantizeLinear", arrays["X"], None, None, np.float32(1))[0]
    )


# ---------------------------------------------------------------------------------------------
# Schemas


def _infer(op, inputs, outputs):
    node = helper.make_node(op, [n for n, _, _ in inputs], outputs, domain=ops.DOMAIN)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs if n], []
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(ops.DOMAIN, ops.VERSION)],
    )
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    return {
        v.name: (v.type.tensor_type.elem_type, [d.dim_value for d in v.type.tensor_type.shape.dim])
        for v in inferred.graph.value_info
    }


def test_schema_infers_quantized_types():
    x = ("x", TensorProto.FLOAT16, [2, 8])
    scale = ("s", TensorProto.FLOAT16, [])
    got = _infer(
        "RMSNormQuantizeLinear",
        [x, ("", 0, None), ("", 0, None), scale, ("zp", TensorProto.INT8, [])],
        ["y", "yf"],
    )
    assert got == {"y": (TensorProto.INT8, [2, 8]), "yf": (TensorProto.FLOAT16, [2, 8])}
    got = _infer("RMSNormQuantizeLinear", [x, ("", 0, None), ("", 0, None), scale], ["y"])
    assert got == {"y": (TensorProto.UINT8, [2, 8])}
    got = _infer(
        "SkipLayerNormDynamicQuantizeLinear",
        [x, ("r", TensorProto.FLOAT16, [2, 8])],
        ["y", "ys", "yz", "sum", "yf"],
    )
    assert got == {
        "y": (TensorProto.UINT8, [2, 8]),
        "ys": (TensorProto.FLOAT, []),
        "yz": (TensorProto.UINT8, []),
        "sum": (TensorProto.FLOAT16, [2, 8]),
        "yf": (TensorProto.FLOAT16, [2, 8]),
    }


def test_schema_refuses_scale_of_another_type():
    with pytest.raises(onnx.shape_inference.InferenceError, match="Y_scale must be FLOAT16"):
        _infer(
            "LayerNormQuantizeLinear",
            [
                ("x", TensorProto.FLOAT16, [2, 8]),
                ("", 0, None),
                ("", 0, None),
                ("s", TensorProto.FLOAT, []),
            ],
            ["y"],
        )
    with pytest.raises(onnx.shape_inference.InferenceError, match="Y_zero_point must be"):
        _infer(
            "LayerNormQuantizeLinear",
            [
                ("x", TensorProto.FLOAT, [2, 8]),
                ("", 0, None),
                ("", 0, None),
                ("s", TensorProto.FLOAT, []),
                ("z", TensorProto.INT16, []),
            ],
            ["y"],
        )


# ---------------------------------------------------------------------------------------------
# The CPU kernels through ONNX Runtime (models without function bodies: only the kernel can run)


def _kernel_cases():
    for op, spec in catalogue.QUANTIZED_OPS.items():
        zero_points = (
            [np.uint8(118), np.int8(-4), None, F8_ZERO_POINT]
            if spec.quantize == "static"
            else [None]
        )
        for (t, s), type_id in zip(TYPE_PAIRS, TYPE_IDS):
            for zero_point in zero_points:
                zp = "none" if zero_point is None else f"{zero_point.dtype}"
                yield pytest.param(op, t, s, zero_point, id=f"{op}-{type_id}-zp_{zp}")


def _with_weights_of(arrays, s):
    for name in ("Scale", "Bias", "XBias"):
        if name in arrays:
            arrays[name] = arrays[name].astype(np.float32).astype(s)
    return arrays


@pytest.mark.parametrize("op, t, s, zero_point", _kernel_cases())
@pytest.mark.parametrize("order", [0, 1])
def test_kernel_matches_reference(op, t, s, zero_point, order, rng):
    """Every quantized op, type pair, zero point type (float8 e4m3fn included) and rounding
    order: the library's CPU kernel against the reference, quantized values exactly (one step
    only where the float outputs differ in their last place); odd widths, the rows split over
    ORT's thread pool."""
    if t == np.float32 and order:
        pytest.skip("one rounding order for float32")
    spec = catalogue.get(op)
    for shape in ((3, 7, 65), (300, 520)):
        arrays = _with_weights_of(
            quant_arrays(
                op, t, rng, shape=shape, zero_point=zero_point, present=spec.optional_inputs
            ),
            s,
        )
        attrs = {"cast_before_scale": order}
        if "alpha" in spec.defaults:
            attrs["alpha"] = 0.5
        model = single_node_model(op, arrays, attrs, functions=False)
        got = run(model, arrays, with_library=True, threads=2)
        assert_quantized(op, arrays, got, attrs)


@pytest.mark.parametrize("op", list(catalogue.QUANTIZED_OPS))
def test_kernel_equals_function_body_where_floats_agree(op, rng):
    """The kernel and the function body quantize the same way: the same quantized values
    wherever their float outputs are equal."""
    spec = catalogue.get(op)
    arrays = quant_arrays(
        op, np.float32, rng, shape=(16, 256), zero_point=np.int8(2), present=spec.optional_inputs
    )
    kernel = run(single_node_model(op, arrays, functions=False), arrays, with_library=True)
    body = run(single_node_model(op, arrays), arrays)
    same = kernel[-1] == body[-1]
    assert same.mean() > 0.5
    np.testing.assert_array_equal(kernel[0][same], body[0][same])
    if spec.quantize == "dynamic" and np.array_equal(kernel[-1], body[-1]):
        np.testing.assert_array_equal(kernel[1], body[1])
        np.testing.assert_array_equal(kernel[2], body[2])


def _optional_output_cases():
    for op, spec in catalogue.QUANTIZED_OPS.items():
        yield pytest.param(op, np.uint8(9), id=op)
        if spec.quantize == "static":
            yield pytest.param(op, F8_ZERO_POINT, id=f"{op}-float8e4m3fn")


@pytest.mark.parametrize("op, zero_point", _optional_output_cases())
def test_kernel_optional_outputs(op, zero_point, rng):
    """Y_float, Sum, both or neither: the quantized outputs do not change (float8's bits too:
    and they are the reference's quantization of Y_float)."""
    spec = catalogue.get(op)
    arrays = quant_arrays(op, np.float16, rng, shape=(40, 96), zero_point=zero_point)
    full = run(single_node_model(op, arrays, functions=False), arrays, with_library=True)
    if zero_point.dtype == F8:
        assert full[0].dtype == F8
        own = reference.quantize_linear(full[-1], arrays["Y_scale"], zero_point)
        assert_float8_equal(full[0], own)
    quantized = 3 if spec.quantize == "dynamic" else 1
    for outputs in [False, {"Y_float"}] + ([{"Sum"}] if spec.has_residual else []):
        got = run(
            single_node_model(op, arrays, functions=False, optional_outputs=outputs),
            arrays,
            with_library=True,
        )
        for g, f in zip(got[:quantized], full[:quantized]):
            assert g.dtype == f.dtype
            np.testing.assert_array_equal(
                g.view(np.uint8) if g.dtype == F8 else g, f.view(np.uint8) if f.dtype == F8 else f
            )
        if outputs and "Y_float" in outputs:
            np.testing.assert_array_equal(got[-1], full[-1])
        if outputs and "Sum" in outputs:
            np.testing.assert_array_equal(got[quantized], full[quantized])


def test_kernel_edge_cases(rng):
    """All-zero output (scale 1), NaN rows, saturation, a one-element 1-D scale, an empty X."""
    arrays = {"X": np.full((3, 16), 2.5, np.float32)}
    got = run(
        single_node_model("LayerNormDynamicQuantizeLinear", arrays, functions=False),
        arrays,
        with_library=True,
    )
    want = reference_outputs("LayerNormDynamicQuantizeLinear", arrays)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)

    for op in ("RMSNormQuantizeLinear", "SkipLayerNormDynamicQuantizeLinear"):
        arrays = quant_arrays(op, np.float32, rng, shape=(4, 32), zero_point=np.int8(4))
        arrays["X"][1, 3] = np.nan
        got = run(single_node_model(op, arrays, functions=False), arrays, with_library=True)
        assert_quantized(op, arrays, got)

    arrays = quant_arrays(
        "LayerNormQuantizeLinear", np.float16, rng, y_scale=1e-4, zero_point=np.int8(0)
    )
    got = run(
        single_node_model("LayerNormQuantizeLinear", arrays, functions=False),
        arrays,
        with_library=True,
    )
    assert_quantized("LayerNormQuantizeLinear", arrays, got)

    arrays = quant_arrays("RMSNormQuantizeLinear", np.float32, rng, zero_point=np.uint8(3))
    arrays["Y_scale"] = arrays["Y_scale"].reshape(1)
    arrays["Y_zero_point"] = arrays["Y_zero_point"].reshape(1)
    got = run(
        single_node_model("RMSNormQuantizeLinear", arrays, functions=False),
        arrays,
        with_library=True,
    )
    assert_quantized("RMSNormQuantizeLinear", arrays, got)

    arrays = {"X": np.zeros((0, 8), np.float32), "Residual": np.zeros((0, 8), np.float32)}
    got = run(
        single_node_model("SkipRMSNormDynamicQuantizeLinear", arrays, functions=False),
        arrays,
        with_library=True,
    )
    assert got[0].shape == (0, 8) and got[1] == np.float32(1) and got[2] == 0


def test_kernel_refuses_per_axis_scale(rng):
    arrays = quant_arrays("RMSNormQuantizeLinear", np.float32, rng, shape=(2, 8))
    arrays["Y_scale"] = np.array([0.1, 0.2], np.float32)
    model = single_node_model("RMSNormQuantizeLinear", arrays, functions=False)
    with pytest.raises(
        Exception,
        match="onnxnorm::RMSNormQuantizeLinear: Y_scale of shape "
        r"\[2\] must be a scalar or a one-element 1-D tensor",
    ):
        run(model, arrays, with_library=True)


def test_kernels_ran(rng):
    """With the library, a model with function bodies runs the fused kernel, not the body."""
    for op in catalogue.QUANTIZED_OPS:
        arrays = quant_arrays(op, np.float32, rng, shape=(4, 64))
        model = single_node_model(op, arrays)
        feeds = {k.lower(): v for k, v in arrays.items()}
        ran = runtime.executed_ops(model, feeds)
        assert ran[op] == 1 and not {"QuantizeLinear", "DynamicQuantizeLinear"} & set(ran), ran


# ---------------------------------------------------------------------------------------------
# The benchmark's contenders compute the same thing


@pytest.mark.parametrize("op", list(catalogue.QUANTIZED_OPS))
@pytest.mark.parametrize("dtype", ["float32", "float16"])  # (session.run takes no bfloat16)
def test_bench_contenders_agree(op, dtype, rng):
    """`onnxnorm bench kernels` times the fused op against ORT's norm followed by ORT's
    quantizer: both give the same quantized values (one step apart at most, where the float
    norms round differently), so the rows compare like with like."""
    from onnxnorm.bench import kernels

    shape, d = BENCH_SHAPE, BENCH_SHAPE[-1]
    arrays = bench_arrays(op, dtype, kernels.zero_point("int8"), rng)

    def outputs(model, with_library):
        session = runtime.session(model, ort.SessionOptions(), with_library=with_library)
        names = [i.name for i in session.get_inputs()]
        return dict(
            zip(
                [o.name for o in session.get_outputs()],
                session.run(None, {n: arrays[n] for n in names}),
            )
        )

    ours = outputs(kernels.onnxnorm_model(op, dtype, shape, d), True)
    for label in kernels.ORT_BUILTINS[op]:
        if "+Cast+" in label and dtype == "float32":
            continue  # (no Cast for float32: the bench notes it n/a)
        theirs = outputs(kernels.ort_builtin_model(label, dtype, shape, d), False)
        assert set(theirs) == set(ours), label
        diff = ours["y"].astype(np.int32) - theirs["y"].astype(np.int32)
        assert ours["y"].dtype == theirs["y"].dtype and np.abs(diff).max() <= 1, label
        assert (diff == 0).mean() > 0.98, label


def test_dynamic_nan_left_out_wherever_it_sits(rng):
    """The op leaves NaN out of the dynamic range wherever it sits, the last row included (where
    ORT's own min/max would give a NaN scale): the kernel keeps a finite scale, as the reference."""
    for row in (0, 3):
        arrays = quant_arrays("RMSNormDynamicQuantizeLinear", np.float32, rng, shape=(4, 64))
        arrays["X"][row, -1] = np.nan
        got = run(
            single_node_model("RMSNormDynamicQuantizeLinear", arrays, functions=False),
            arrays,
            with_library=True,
        )
        assert np.isfinite(got[1]) and (got[0][row] == 0).all()
        assert_quantized("RMSNormDynamicQuantizeLinear", arrays, got)


def test_bench_target_of_quantized_rows():
    """A quantized row's verdict: on the large shapes at least 1.5x as fast as ORT's norm and
    quantizer (no copy-bandwidth target), elsewhere no slower."""
    from onnxnorm.bench.kernels import Result

    def verdict(shape, ort_seconds):
        times = {"onnxnorm": 1.0, "ort:Norm+QuantizeLinear": ort_seconds, "copy": 0.2, "floor": 0.1}
        return Result("RMSNormQuantizeLinear", shape, "float32", times, {}).targets()

    assert verdict("4x512x4096", 1.6) == []
    assert verdict("4x512x4096", 1.2) == ["1.20x as fast as Norm+QuantizeLinear < 1.5x"]
    assert verdict("1x128x4096", 1.2) == []
    assert verdict("1x128x4096", 0.8) == ["slower than Norm+QuantizeLinear (1.25x)"]
    # the float ops keep their targets
    times = {"onnxnorm": 1.0, "ort:RMSNormalization-23": 1.2, "copy": 0.5, "floor": 0.1}
    assert Result("RMSNorm", "4x512x4096", "float32", times, {}).targets() == [
        "50% of copy bandwidth < 90%"
    ]


# ---------------------------------------------------------------------------------------------
# float8 e4m3fn Y

EDGES_FLOAT8 = np.array(
    [
        448,
        -448,
        449,
        464,
        465,
        -465,
        1e4,
        240,
        2.0**-10,
        1.5 * 2.0**-9,
        2.5 * 2.0**-9,
        2.0**-6,
        1.0625,
        1.1875,
        -1e-30,
        -np.nan,
    ],
    np.float32,
)


@pytest.mark.parametrize("scale", [1.0, 0.37, 0.0, 3e-39])
def test_reference_quantize_linear_is_ort_s_for_float8(scale):
    """The reference's float8 e4m3fn QuantizeLinear (saturate = 1) against ORT's, bit for bit:
    ties to even, subnormals, saturation at 448 (+-Inf too), NaN, a zero or subnormal scale; the
    zero point's value makes no difference."""
    x = np.concatenate([EDGES, EDGES_FLOAT8])
    scale = np.float32(scale)
    for zero_point in (np.asarray(0, F8), F8_ZERO_POINT):
        want = _ort_quantizer(
            "QuantizeLinear", x, scale, zero_point, outputs=(TensorProto.FLOAT8E4M3FN,)
        )[0]
        got = reference.quantize_linear(x, scale, zero_point)
        assert got.dtype == F8
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


#: Bias values of a LayerNorm with Scale 0 (so Y is exactly Bias) and float8 bits of Y / 0.5,
#: worked out by hand (e4m3fn: sign, exponent of bias 7, 3 mantissa bits; below 2^-6, code k is
#: k * 2^-9; S.1111.111 is NaN)
_FLOAT8_DIRECTED = [
    (224.0, 0x7E),  # 448 = 1.75 * 2^8: 0.1111.110
    (224.5, 0x7E),  # 449: saturated to 448
    (232.0, 0x7E),  # 464, the tie of 448 and 480 (not a value): saturated
    (-5000.0, 0xFE),  # -1e4: saturated to -448
    (np.inf, 0x7E),  # +Inf saturates
    (-np.inf, 0xFE),  # -Inf saturates
    (np.nan, 0x7F),  # NaN stays NaN
    (2.0**-11, 0x00),  # 2^-10: the tie of 0 and 2^-9, to even 0
    (3 * 2.0**-11, 0x02),  # 1.5 * 2^-9: the tie of 1 and 2 units, to 2
    (5 * 2.0**-11, 0x02),  # 2.5 * 2^-9: the tie of 2 and 3 units, to 2
    (2.0**-7, 0x08),  # 2^-6, the smallest normal: 0.0001.000
    (0.53125, 0x38),  # 1.0625, the tie of 1.0 and 1.125: 1.0 = 0.0111.000
    (0.59375, 0x3A),  # 1.1875, the tie of 1.125 and 1.25: 1.25 = 0.0111.010
    (100.0, 0x74),  # 200, the tie of 192 (1.5 * 2^7) and 208: 192 = 0.1110.100
    (-0.75, 0xBC),  # -1.5 = 1.0111.100
    (-1e-30, 0x80),  # a tiny negative rounds to -0
]


def test_kernel_float8_directed_values(rng):
    """Chosen Y values through the CPU kernel (LayerNorm with Scale 0: Y is Bias), float8 bits
    as worked out by hand: saturation at 448 and of +-Inf, NaN, ties to even among the
    subnormals and the normals, -0; a row with NaN in X is NaN throughout."""
    bias = np.array([v for v, _ in _FLOAT8_DIRECTED], np.float32)
    want = np.array([b for _, b in _FLOAT8_DIRECTED], np.uint8)
    cols = len(bias)
    arrays = {
        "X": rng.standard_normal((3, cols)).astype(np.float32),
        "Scale": np.zeros(cols, np.float32),
        "Bias": bias,
        "Y_scale": np.array(0.5, np.float32),
        "Y_zero_point": F8_ZERO_POINT,
    }
    arrays["X"][2, 5] = np.nan
    got = run(
        single_node_model("LayerNormQuantizeLinear", arrays, functions=False),
        arrays,
        with_library=True,
    )
    y, y_float = got[0], got[-1]
    np.testing.assert_array_equal(y_float[:2], np.broadcast_to(bias, (2, cols)))
    assert_float8_equal(y[:2], np.broadcast_to(want, (2, cols)))
    assert float8_nan(y[2].view(np.uint8)).all()
    assert_quantized("LayerNormQuantizeLinear", arrays, got)


@pytest.mark.parametrize("op", STATIC)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_kernel_float8_edges(op, dtype, rng):
    """Tiny quotients (subnormal float8 values and zeros of either sign), then a Y_scale that
    sends most values beyond 448; Inf and NaN in X (NaN rows): the CPU kernel's float8 Y, with
    and without Y_float and Sum, is the reference's quantization of its Y_float, and the
    reference's Y where the floats agree."""
    spec = catalogue.get(op)
    t = DTYPES[dtype]
    arrays = quant_arrays(
        op, t, rng, shape=(6, 72), zero_point=F8_ZERO_POINT, present=spec.optional_inputs
    )
    arrays["X"][1, 7] = np.nan
    arrays["X"][2, 3] = np.inf
    arrays["X"][3, 9] = -np.inf
    # Y = Norm(X) * +-2^-19 (no Bias), Y_scale 2^-12: quotients of Norm(X) * 2^-7, below 2^-6
    # (float8's smallest normal) wherever |Norm(X)| < 2
    arrays["Scale"] = (np.where(np.arange(72) % 2, 1, -1) * 2.0**-19).astype(t)
    arrays.pop("Bias", None)
    arrays["Y_scale"] = np.array(2.0**-12, t)
    got = run(single_node_model(op, arrays, functions=False), arrays, with_library=True)
    assert_quantized(op, arrays, got)
    bits = got[0].view(np.uint8)
    # NaN rows; a row with +-Inf is NaN at least there (RMSNorm: 0 elsewhere)
    assert float8_nan(bits[1]).all() and float8_nan(bits[2, 3]) and float8_nan(bits[3, 9])
    assert not float8_nan(bits[[0, 4, 5]]).any()
    finite = bits[[0, 4, 5]]
    assert ((finite & 0x78) == 0).mean() > 0.5  # mostly subnormal codes (exponent 0000)
    assert ((finite & 0x7F) == 0).any() and ((finite & 0x07) != 0).any()  # zeros, and not only
    assert ((finite & 0x78) != 0).any()  # and some normal ones
    # most quotients beyond 448
    arrays["Scale"] = (1 + 0.5 * rng.standard_normal(72)).astype(t)
    arrays["Y_scale"] = np.array(0.002, t)
    full = run(single_node_model(op, arrays, functions=False), arrays, with_library=True)
    assert_quantized(op, arrays, full)
    bits = full[0].view(np.uint8)
    finite = bits[[0, 4, 5]]
    assert ((finite & 0x7F) == 0x7E).mean() > 0.3  # +-448
    assert (finite == 0x7E).any() and (finite == 0xFE).any()
    for outputs in [False, {"Y_float"}] + ([{"Sum"}] if spec.has_residual else []):
        got = run(
            single_node_model(op, arrays, functions=False, optional_outputs=outputs),
            arrays,
            with_library=True,
        )
        np.testing.assert_array_equal(got[0].view(np.uint8), bits)


@pytest.mark.parametrize("op", STATIC)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_kernel_float8_is_ort_quantize_linear(op, dtype, rng):
    """The fused float8 Y is ONNX Runtime's own QuantizeLinear (opset 21, float8 zero point as an
    initializer, saturate by default) of the op's Y_float, bit for bit: X's type and Y_scale as
    they are (bfloat16, which ORT's QuantizeLinear does not take, exactly in float32)."""
    t = DTYPES[dtype]
    arrays = quant_arrays(
        op,
        t,
        rng,
        shape=(8, 96),
        zero_point=F8_ZERO_POINT,
        y_scale=0.01,
        present=catalogue.get(op).optional_inputs,
    )
    arrays["X"][0, 1] = np.nan
    arrays["X"][5, 0] = np.inf
    got = run(single_node_model(op, arrays, functions=False), arrays, with_library=True)
    y, y_float = got[0], got[-1]
    scale = arrays["Y_scale"]
    onnx_type = TensorProto.FLOAT16 if t == np.float16 else TensorProto.FLOAT
    if onnx_type == TensorProto.FLOAT:
        y_float, scale = np.asarray(y_float, np.float32), scale.astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"])],
        "q",
        [helper.make_tensor_value_info("x", onnx_type, y_float.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT8E4M3FN, None)],
        [
            onnx.numpy_helper.from_array(scale, "s"),
            onnx.numpy_helper.from_array(F8_ZERO_POINT, "z"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": y_float}
    )[0]
    assert (want.view(np.uint8) == 0x7E).any() and float8_nan(want.view(np.uint8)).any()
    assert_float8_equal(y, want)


def test_schema_infers_float8_y():
    x = ("x", TensorProto.FLOAT, [2, 8])
    got = _infer(
        "SkipRMSNormQuantizeLinear",
        [
            x,
            ("r", TensorProto.FLOAT, [2, 8]),
            ("", 0, None),
            ("", 0, None),
            ("", 0, None),
            ("s", TensorProto.FLOAT, []),
            ("zp", TensorProto.FLOAT8E4M3FN, []),
        ],
        ["y", "sum", "yf"],
    )
    assert got == {
        "y": (TensorProto.FLOAT8E4M3FN, [2, 8]),
        "sum": (TensorProto.FLOAT, [2, 8]),
        "yf": (TensorProto.FLOAT, [2, 8]),
    }
