"""onnxnorm.deploy.openvino: with onnxnorm's extension OpenVINO reads every onnxnorm op, and the
model it compiles on its CPU device computes what the numpy reference does; a whole exported
decoder gets OpenVINO's own RMS layers, one per norm. Without the extension OpenVINO refuses
the same files: the reason the extension exists."""

from __future__ import annotations

import collections
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import helper

from onnxnorm.errors import MissingDependency
from onnxnorm.ops import catalogue, reference
from onnxnorm.testing.graphs import single_node_model
from tests.support import rotary_cases
from tests.support.helpers import assert_close, assert_float8_equal, reference_outputs
from tests.support.matrix import BF16, DTYPES, F8, F32

ov = pytest.importorskip("openvino")

from onnxnorm.deploy import openvino as onnxnorm_openvino  # noqa: E402

# The CPU plugin's default inference precision is bfloat16 on a CPU with bfloat16 instructions
# (AMX, AVX512-BF16): every float32 op would then run in bfloat16. The tests hold the model's
# own arithmetic, so they ask for float32.
CONFIG = {"INFERENCE_PRECISION_HINT": "f32"}

# Half precision: OpenVINO's CPU plugin computes a float16 or bfloat16 graph in float32 and may
# drop the roundings to X's type between the steps of the catalogue's arithmetic, so its
# results are within the reference's tolerance for a kernel computing in float32
# (reference.tolerance), not bit for bit as ONNX Runtime's; a quantized Y (of a Y_float it
# rounded otherwise) within one step of the quantizer's own result.

SHAPE = (2, 3, 16)
HEADS_SHAPE = (2, 3, 4, 16)  # per-head weights: Scale of shape [3, 4, 16], axis 2
WEIGHTS = ("Scale", "Bias", "XBias", "InnerScale", "InnerBias")
ZERO_POINTS = {
    "uint8": np.array(128, np.uint8),
    "int8": np.array(-3, np.int8),
    "float8e4m3fn": np.array(0, F8),
}


def _arrays(op, dtype, present, rng, *, heads=False, weights=None, zero_point="uint8"):
    """Inputs of ``op``: X, its required inputs, and the optional ones named in ``present``
    (weights of type ``weights``, default X's)."""
    spec = catalogue.get(op)
    shape = HEADS_SHAPE if heads else SHAPE
    arrays = {"X": (rng.standard_normal(shape) * 2 + 0.5).astype(dtype)}
    for p in spec.inputs[1:]:
        if p.optional and p.name not in present:
            continue
        if p.name in ("Residual", "Gate"):
            arrays[p.name] = rng.standard_normal(shape).astype(dtype)
        elif p.name == "Y_scale":
            arrays[p.name] = np.array(0.02, dtype)
        elif p.name == "Y_zero_point":
            arrays[p.name] = ZERO_POINTS[zero_point]
        else:
            dims = shape[1:] if heads else shape[-1:]
            base = 1.0 if "Scale" in p.name else 0.0
            values = rng.standard_normal(dims) * 0.7 + base
            arrays[p.name] = values.astype(weights or dtype)
    return arrays


_OV_TYPES = {
    F32: "f32",
    np.dtype(np.float16): "f16",
    BF16: "bf16",
    F8: "f8e4m3",
    np.dtype(np.uint8): "u8",
    np.dtype(np.int8): "i8",
    np.dtype(np.int64): "i64",
}
_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _tensor(array):
    """``array`` as an OpenVINO tensor, its bits copied (openvino's Python API takes bfloat16
    and float8 arrays only as their bits, and a 0-d array as of shape [1])."""
    element = getattr(ov.Type, _OV_TYPES[array.dtype])
    tensor = ov.Tensor(element, ov.Shape(list(array.shape)))
    bits = _BITS[array.dtype.itemsize]
    np.copyto(tensor.data.view(bits), np.ascontiguousarray(array).view(bits))
    return tensor


def _array(tensor):
    bits = {"bf16": (np.uint16, BF16), "f8e4m3": (np.uint8, F8)}.get(
        tensor.element_type.get_type_name()
    )
    data = np.array(tensor.data)
    return data.view(bits[0]).view(bits[1]) if bits else data


def _compile(model, core=None):
    core = core or onnxnorm_openvino.add_to(ov.Core())
    read = onnxnorm_openvino.read_model(model, core)
    return core.compile_model(read, "CPU", CONFIG)


def _run(compiled, arrays):
    """The outputs of ``compiled`` on ``arrays`` (by catalogue input name; an input the model
    left out, as OpenVINO leaves out a float8 zero point it does not read, is not fed)."""
    request = compiled.create_infer_request()
    names = {name for port in compiled.inputs for name in port.get_names()}
    for name, array in arrays.items():
        if name.lower() in names:
            request.set_tensor(name.lower(), _tensor(array))
    request.infer()
    return [_array(request.get_output_tensor(i)) for i in range(len(compiled.outputs))]


def _layers(compiled) -> collections.Counter:
    """The compiled model's layer types, counted."""
    return collections.Counter(
        op.get_rt_info()["layerType"].astype(str) for op in compiled.get_runtime_model().get_ops()
    )


def _check(op, arrays, attrs, got):
    """``got`` (every output of ``op``, in its order) against the reference."""
    spec = catalogue.get(op)
    t = arrays["X"].dtype
    want = dict(zip([p.name for p in spec.outputs], reference_outputs(op, arrays, attrs)))
    got = dict(zip([p.name for p in spec.outputs], got))
    for name in want:
        assert got[name].dtype == want[name].dtype, name
    floats = [n for n in want if n in ("Y", "Sum", "Y_float")]
    if spec.quantize != "none":
        floats.remove("Y")
    for name in floats:
        rtol, atol = reference.tolerance(t)  # (the mixed form: a float32 Y of a half X)
        np.testing.assert_allclose(
            got[name].astype(np.float32), want[name].astype(np.float32), rtol, atol, err_msg=name
        )
    if spec.quantize == "static":
        own = reference.quantize_linear(got["Y_float"], arrays["Y_scale"], _zero_point(arrays))
        _assert_quantized(got["Y"], own, exact=t == F32)
    elif spec.quantize == "dynamic":
        own, scale, zero_point = reference.dynamic_quantize_linear(got["Y_float"])
        # (half: the range OpenVINO took is of a Y_float it may not have rounded to X's type)
        np.testing.assert_allclose(got["Y_scale"], scale, rtol=1e-6 if t == F32 else 2.0**-8)
        _assert_quantized(got["Y_zero_point"], zero_point, exact=t == F32)
        if t != F32:  # its own scale and zero point, which may differ from those of the rounded
            own = reference.quantize_linear(got["Y_float"], got["Y_scale"], got["Y_zero_point"])
        _assert_quantized(got["Y"], own, exact=t == F32)


def _zero_point(arrays):
    return arrays.get("Y_zero_point", np.array(0, np.uint8))


def _assert_quantized(got, want, exact):
    assert got.dtype == want.dtype
    if want.dtype == F8:
        if exact:
            assert_float8_equal(got, want)
        else:  # adjacent float8 values of one sign have adjacent bits
            steps = got.view(np.uint8).astype(int) - want.view(np.uint8).astype(int)
            assert np.abs(steps).max() <= 1
        return
    steps = np.abs(got.astype(int) - want.astype(int))
    assert steps.max() <= (0 if exact else 1), f"{steps.max()} steps off"


# -- every op ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def core():
    return onnxnorm_openvino.add_to(ov.Core())


@pytest.mark.parametrize("optional", ["required", "all"])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("op", list(catalogue.OPS))
def test_every_op(op, dtype, optional, core, rng):
    """Every catalogue op, with its required inputs alone and with every optional one, read
    through the extension, compiled for the CPU: the reference's outputs. The norm becomes
    OpenVINO's own layer: RMS for an RMS norm (the gated one included), MVN for a LayerNorm."""
    spec = catalogue.get(op)
    present = spec.optional_inputs if optional == "all" else ()
    arrays = _arrays(op, DTYPES[dtype], present, rng)
    model = single_node_model(op, arrays, functions=False, bfloat16_as_float32=False)
    compiled = _compile(model, core)
    _check(op, arrays, {}, _run(compiled, arrays))
    layers = _layers(compiled)
    norms = 2 if spec.residual == "sandwich" else 1
    if spec.norm in ("rms", "layer"):
        found = layers["RMS" if spec.norm == "rms" else "MVN"]
        if spec.quantize == "dynamic":  # (an RMS norm's quantizer, x * (255 - 0) / range,
            assert found >= norms, layers  # becomes a second RMS layer with that weight)
        else:
            assert found == norms, layers


#: rotary cases (tests/support/rotary_cases.py's axes): Qwen3's form, Cohere's, OLMo 2's
ROTARY = [
    ("RMSNormRotary", {"layout": "2-3d", "weights": "shared", "rotary_in_t": 1, "k": True}),
    ("LayerNormRotary", {"interleaved": 1, "weights": "per-head", "k": True}),
    ("RMSNormRotary", {"per_head": 0, "layout": "2-3d", "weights": "per-head", "k": False}),
    ("L2NormRotary", {"rotary_dim": 8, "cache": "values-token", "rotary_first": 1, "k": True}),
]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("op, axes", ROTARY, ids=[f"{op}-{i}" for i, (op, _) in enumerate(ROTARY)])
def test_rotary_ops(op, axes, dtype, core, rng):
    """The rotary ops through the extension (each node lowered --for openvino: its body), Q
    and K or Q alone: the reference's outputs."""
    case = {**rotary_cases.DEFAULTS, **axes, "dtype": dtype}
    arrays, attrs = rotary_cases.arrays_and_attrs(op, rotary_cases.fit(op, case), rng)
    model = single_node_model(op, arrays, attrs, functions=False, optional_outputs="K" in arrays)
    got = _run(_compile(model, core), arrays)
    spec = catalogue.get(op)
    want = reference.run(op, *[arrays.get(p.name) for p in spec.inputs], **attrs)
    assert len(got) == len(want) == (2 if "K" in arrays else 1)
    for g, w in zip(got, want):
        assert_close(g, w, DTYPES[dtype])


# (op, present optional inputs, attributes, per-head weights, weights' type: None = X's)
VARIANTS = [
    ("LayerNorm", ("Scale", "Bias"), {"cast_before_scale": 1}, False, None),
    ("LayerNorm", ("Scale", "Bias"), {"axis": 2}, True, None),  # Cohere's per-head Q/K norm
    ("LayerNorm", ("Scale", "Bias"), {"y_float32": 1}, False, F32),  # the mixed form
    ("RMSNorm", ("Scale",), {"scale_offset": 1.0}, False, None),  # Gemma
    ("RMSNorm", ("Scale",), {"scale_offset": 1.0, "cast_before_scale": 1}, False, None),
    ("RMSNorm", ("Scale",), {"axis": 2, "epsilon": 1e-6}, True, None),  # per-head Q/K norm
    ("RMSNorm", ("Scale",), {"cast_before_scale": 1}, False, F32),
    ("RMSNorm", ("Scale",), {"y_float32": 1}, False, F32),
    ("SkipLayerNorm", ("Scale", "Bias", "XBias"), {"alpha": 1.7}, False, None),  # DeepNorm
    ("SkipRMSNorm", ("Scale",), {"alpha": 0.5, "cast_before_scale": 1}, False, None),
    ("SkipRMSNorm", ("Scale", "XBias"), {"scale_offset": 1.0}, False, F32),
    ("SandwichRMSNorm", ("InnerScale", "Scale"), {"scale_offset": 1.0}, False, None),
    ("SandwichLayerNorm", ("InnerScale", "Scale"), {"cast_before_scale": 1}, False, None),
    ("GatedRMSNorm", ("Scale", "Gate"), {"activation": 1}, False, None),  # Kimi Linear
    ("GatedRMSNorm", ("Scale", "Gate"), {"group_size": 8}, False, None),
    (
        "GatedRMSNorm",
        ("Scale", "Gate"),
        {"group_size": 8, "norm_before_gate": 0, "cast_before_scale": 1},
        False,
        None,
    ),  # Mamba2
    ("GatedRMSNorm", ("Gate",), {"group_size": 4, "activation": 1}, False, None),
    ("L2Norm", (), {"axis": -2, "epsilon": 1e-6}, False, None),
    ("RMSNormQuantizeLinear", ("Scale",), {"cast_before_scale": 1}, False, None),
    ("SkipLayerNormDynamicQuantizeLinear", ("Scale", "Bias"), {"alpha": 0.5}, False, None),
]


@pytest.mark.parametrize(
    ("op", "present", "attrs", "heads", "weights", "dtype"),
    [
        (*variant, dtype)
        for variant in VARIANTS
        for dtype in ("float32", "float16")
        if not (variant[2].get("y_float32") and dtype == "float32")  # (a 16-bit X's form)
    ],
)
def test_variants(op, present, attrs, heads, weights, dtype, core, rng):
    """Attributes (rounding order, scale offset, alpha, axis, groups, gate order, activation),
    per-head weights and float32 weights of a float16 X: the reference's outputs."""
    arrays = _arrays(op, DTYPES[dtype], present, rng, heads=heads, weights=weights)
    model = single_node_model(op, arrays, attrs, functions=False)
    _check(op, arrays, attrs, _run(_compile(model, core), arrays))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(
    ("op", "present"),
    [
        ("LayerNorm", ("Scale", "Bias")),
        ("RMSNorm", ("Scale",)),
        ("GatedRMSNorm", ("Scale", "Gate")),
    ],
)
def test_half_order_b_bit_for_bit(op, present, dtype, core, rng):
    """Rounding order B (once, at the end) in float16 and bfloat16: the bits ONNX Runtime
    computes of the same lowered graph. (Order A rounds between steps, and a residual op
    normalizes its Sum rounded to X's type: roundings the CPU plugin, computing the graph in
    float32, leaves out; within the tolerance above, not bit for bit.)"""
    from onnxnorm.fusion.lowering import lower
    from tests.support.helpers import run

    arrays = _arrays(op, DTYPES[dtype], present, rng)
    model = single_node_model(op, arrays, functions=False, bfloat16_as_float32=False, opset=23)
    got = _run(_compile(model, core), arrays)
    # (ONNX Runtime's Python API gives no bfloat16 array: its outputs cast to float32, exactly)
    model = single_node_model(op, arrays, functions=False, opset=23)
    want = run(lower(model, runtime="openvino"), arrays)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g.astype(np.float32), w.astype(np.float32))


def test_grouped_scale_of_one_group(core, rng):
    """GatedRMSNorm's Scale of one group's weight (ONNX Runtime's layout), shared by each."""
    arrays = _arrays("GatedRMSNorm", F32, ("Gate",), rng)
    arrays["Scale"] = rng.standard_normal(8).astype(np.float32)
    model = single_node_model("GatedRMSNorm", arrays, {"group_size": 8}, functions=False)
    _check("GatedRMSNorm", arrays, {"group_size": 8}, _run(_compile(model, core), arrays))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("zero_point", ["int8", "float8e4m3fn"])
@pytest.mark.parametrize("op", ["LayerNormQuantizeLinear", "SkipRMSNormQuantizeLinear"])
def test_zero_point_types(op, zero_point, dtype, core, rng):
    """The zero point's type is Y's: int8, float8 e4m3fn (its value unused; OpenVINO leaves
    the input out of the model), quantized as the reference quantizes the Y_float computed."""
    arrays = _arrays(op, DTYPES[dtype], ("Scale", "Y_zero_point"), rng, zero_point=zero_point)
    arrays["Y_scale"] = np.array(0.005, DTYPES[dtype])  # some values saturate
    model = single_node_model(op, arrays, functions=False, opset=21)
    _check(op, arrays, {}, _run(_compile(model, core), arrays))


def test_all_zero_dynamic_range_gives_scale_one(core):
    """DynamicQuantizeLinear of an all-zero tensor: the op's scale is 1 (ONNX Runtime's rule),
    which OpenVINO's DynamicQuantizeLinear does not give."""
    arrays = {"X": np.zeros(SHAPE, np.float32)}
    model = single_node_model("RMSNormDynamicQuantizeLinear", arrays, functions=False)
    y, scale, zero_point, _ = _run(_compile(model, core), arrays)
    assert not y.any() and zero_point == 0
    if scale != 1:
        pytest.xfail(f"OpenVINO's DynamicQuantizeLinear gives scale {scale} for [0, 0]")


# -- graphs --------------------------------------------------------------------------------


@pytest.mark.parametrize("rank", ["static", "dynamic"])
def test_symbolic_dims_dynamic_rank_and_old_opset(rank, core, rng):
    """Symbolic dims in a model of opset 11, which has no RMSNormalization (the node is lowered
    in opset 23 whatever the model's): the model read once runs on two shapes. X of an unknown
    rank is read too (the CPU plugin compiles it once given a rank)."""
    w = rng.standard_normal(16).astype(np.float32)
    model = single_node_model(
        "SkipRMSNorm",
        {"X": (F32, ("b", "s", 16)), "Residual": (F32, ("b", "s", 16)), "Scale": w},
        {"epsilon": 1e-6},
        functions=False,
        opset=11,
    )
    if rank == "dynamic":
        model.graph.input[0].type.tensor_type.ClearField("shape")
    read = onnxnorm_openvino.read_model(model, core)
    if rank == "dynamic":
        assert read.input("x").get_partial_shape().rank.is_dynamic
        read.reshape({"x": ov.PartialShape([-1, -1, 16])})
    compiled = core.compile_model(read, "CPU", CONFIG)
    assert _layers(compiled)["RMS"] == 1
    for shape in ((1, 5, 16), (3, 2, 16)):
        arrays = {
            "X": rng.standard_normal(shape).astype(np.float32),
            "Residual": rng.standard_normal(shape).astype(np.float32),
            "Scale": w,
        }
        _check("SkipRMSNorm", arrays, {"epsilon": 1e-6}, _run(compiled, arrays))


def test_nodes_of_one_kind_each_get_their_own_layers(core, rng):
    """Two nodes of one kind (op, attributes, types, ranks): the lowered form is read once and
    copied, each node gets its own layers, and reshaping the model to static dims afterwards
    keeps it right (no dim was written into the copies)."""
    nodes = [
        helper.make_node("RMSNorm", ["x", "w"], ["h"], domain=catalogue.DOMAIN, epsilon=1e-6),
        helper.make_node("RMSNorm", ["h", "w2"], ["y"], domain=catalogue.DOMAIN, epsilon=1e-6),
    ]
    graph = helper.make_graph(
        nodes,
        "two",
        [
            helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["b", 16]),
            helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, [16]),
            helper.make_tensor_value_info("w2", onnx.TensorProto.FLOAT, [16]),
        ],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["b", 16])],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(catalogue.DOMAIN, 1)],
    )
    read = onnxnorm_openvino.read_model(model, core)
    read.reshape({"x": [4, 16]})
    compiled = core.compile_model(read, "CPU", CONFIG)
    assert _layers(compiled)["RMS"] == 2
    x, w, w2 = (rng.standard_normal(s).astype(np.float32) for s in ((4, 16), 16, 16))
    (got,) = _run(compiled, {"x": x, "w": w, "w2": w2})
    (h,) = reference.run("RMSNorm", x, w, epsilon=1e-6)
    (want,) = reference.run("RMSNorm", h, w2, epsilon=1e-6)
    np.testing.assert_allclose(got, want, *reference.tolerance(F32))


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """The llama export (1 RMSNorm and 4 SkipRMSNorm nodes) of both onnxnorm targets: its
    nodes with function bodies, and without."""
    folder = tmp_path_factory.mktemp("llama")
    paths = {}
    for mode in ("function", "fused"):
        paths[mode] = folder / f"{mode}.onnx"
        subprocess.run(
            [sys.executable, "-m", "onnxnorm", "export", "llama", "-o", str(paths[mode])]
            + ["--mode", mode],
            check=True,
            capture_output=True,
            timeout=300,
        )
    return paths


@pytest.mark.parametrize("mode", ["function", "fused"])
def test_exported_decoder(llama, mode, rng, tmp_path):
    """A whole exported decoder: read through the extension (the function bodies, where the
    file has them, are not what OpenVINO runs) into OpenVINO's standard opsets alone, compiled
    with one RMS layer per norm node; its output is ONNX Runtime's with the onnxnorm library.
    Saved as OpenVINO's IR (weights not compressed to float16), it is read without onnxnorm
    and computes the same."""
    from onnxnorm import runtime

    path = llama[mode]
    norms = collections.Counter(
        n.op_type for n in onnx.load(path).graph.node if n.domain == catalogue.DOMAIN
    )
    assert norms == {"RMSNorm": 1, "SkipRMSNorm": 4}
    read = onnxnorm_openvino.read_model(path)
    opsets = {op.get_type_info().version_id for op in read.get_ops()}
    assert all(v.startswith("opset") for v in opsets), opsets  # no framework node left
    compiled = ov.Core().compile_model(read, "CPU", CONFIG)
    assert _layers(compiled)["RMS"] == 5
    ov.save_model(read, tmp_path / "model.xml", compress_to_fp16=False)
    saved = ov.Core().compile_model(tmp_path / "model.xml", "CPU", CONFIG)
    session = runtime.session(path)
    for shape in ((2, 5, 64), (1, 3, 64)):  # the batch and sequence dims stay symbolic
        x = rng.standard_normal(shape).astype(np.float32)
        (want,) = session.run(None, {"x": x})
        (got,) = _run(compiled, {"x": x})
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(_run(saved, {"x": x})[0], got)


def test_without_the_extension_openvino_refuses_onnxnorm_files(llama):
    """What the extension is for: OpenVINO's ONNX frontend runs no model-local function, so
    it refuses an onnxnorm file whether its nodes have their bodies or not."""
    for path in llama.values():
        with pytest.raises(RuntimeError, match="No conversion rule found for operations: onnxnorm"):
            ov.Core().read_model(str(path))


# -- the API -------------------------------------------------------------------------------


def test_api(rng):
    """One extension per catalogue op; ``add_to`` returns its core (adding them twice is
    harmless); ``read_model`` takes a path, bytes or a ModelProto."""
    assert len(onnxnorm_openvino.extensions()) == len(catalogue.ALL_OPS)
    core = ov.Core()
    assert onnxnorm_openvino.add_to(core) is core
    onnxnorm_openvino.add_to(core)
    arrays = {"X": rng.standard_normal(SHAPE).astype(np.float32)}
    model = single_node_model("L2Norm", arrays, functions=False)
    for given in (model, model.SerializeToString()):
        (got,) = _run(core.compile_model(onnxnorm_openvino.read_model(given, core), "CPU"), arrays)
        np.testing.assert_allclose(got, reference.run("L2Norm", arrays["X"])[0], 1e-5, 1e-5)


def test_bad_attribute_is_refused_with_its_reason(core):
    model = single_node_model("RMSNorm", {"X": (F32, SHAPE)}, {"epsilon": -1.0}, functions=False)
    with pytest.raises(RuntimeError, match="attribute epsilon must be"):
        onnxnorm_openvino.read_model(model, core)


def test_without_openvino_missing_dependency(monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)
    with pytest.raises(MissingDependency, match="pip install openvino"):
        onnxnorm_openvino.extensions()
