"""onnxnorm.fusion: exported RMSNorms become one onnxnorm::RMSNorm, near misses are reported."""

from __future__ import annotations

import io
import json

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from onnx_ir.passes.common import RemoveUnusedNodesPass
from onnxscript.rewriter import pattern

from onnxnorm.fusion import fuse, rules
from onnxnorm.nn.exporter import quiet_export
from onnxnorm.ops import catalogue, reference
from tests.support.matrix import TARGETS_WITHOUT_LIBRARY

# ONNX float attributes are 32-bit: only a float32-exact epsilon survives within 1e-9.
EPS = 2.0**-20
EPS2 = 2.0**-14
SHAPE = (2, 5, 16)
DECOMPOSED = {"Pow", "ReduceMean", "Sqrt", "Reciprocal", "RMSNormalization"}
LLAMA = "RMSNorm (decomposed)"
SCALE = "RMSNorm scale absorbed"
STANDARD = "RMSNorm (ONNX RMSNormalization)"


class RMSNorm(torch.nn.Module):
    """Llama-style RMSNorm as people write it; ``llama`` is Hugging Face's LlamaRMSNorm."""

    def __init__(self, form: str, eps: float = EPS, hidden: int = SHAPE[-1]):
        super().__init__()
        self.form, self.eps = form, eps
        self.weight = torch.nn.Parameter(torch.rand(hidden) * 1.5 + 0.25)

    def forward(self, x):
        w, eps = self.weight, self.eps
        if self.form == "w_first":
            return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
        if self.form == "w_last":
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
        if self.form == "div":
            return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
        if self.form == "x_times_x":
            return w * (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps))
        assert self.form == "llama"
        input_dtype = x.dtype
        h = x.to(torch.float32)
        variance = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(variance + eps)
        return w * h.to(input_dtype)


class TwoNorms(torch.nn.Module):
    def __init__(self, form: str):
        super().__init__()
        self.norm1 = RMSNorm(form, EPS)
        self.linear = torch.nn.Linear(SHAPE[-1], SHAPE[-1])
        self.norm2 = RMSNorm(form, EPS2)

    def forward(self, x):
        return self.norm2(self.linear(self.norm1(x)))


EXPORTERS = [("dynamo", 18), ("dynamo", 23), ("torchscript", 17), ("torchscript", 18)]
SINGLE = [(form, "float32") for form in ("w_first", "w_last", "div", "x_times_x", "llama")]
SINGLE += [("llama", "float16")]
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16}


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """export(module_kind, form, dtype, exporter, opset) -> (ModelProto, x, module); each once."""
    cache: dict[tuple, tuple[onnx.ModelProto, np.ndarray, torch.nn.Module]] = {}
    folder = tmp_path_factory.mktemp("exports")

    def get(kind: str, form: str, dtype: str, exporter: str, opset: int):
        key = (kind, form, dtype, exporter, opset)
        if key not in cache:
            torch.manual_seed(len(cache))
            module = (RMSNorm(form) if kind == "norm" else TwoNorms(form)).to(TORCH_DTYPES[dtype])
            x = torch.randn(*SHAPE, dtype=TORCH_DTYPES[dtype])
            path = folder / ("_".join(map(str, key)) + ".onnx")
            with quiet_export(), torch.no_grad():
                torch.onnx.export(
                    module,
                    (x,),
                    str(path),
                    dynamo=exporter == "dynamo",
                    opset_version=opset,
                    input_names=["x"],
                )
            cache[key] = (onnx.load(str(path)), x.numpy(), module)
        return cache[key]

    return get


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    options = ort.SessionOptions()
    options.log_severity_level = 3  # the fp16 function bodies draw constant-folding warnings
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def _close(actual: np.ndarray, expected: np.ndarray, dtype: str) -> None:
    rtol, atol = reference.tolerance(dtype)
    assert actual.dtype == expected.dtype
    np.testing.assert_allclose(
        actual.astype(np.float64), expected.astype(np.float64), rtol=rtol, atol=atol
    )


def _attrs(node: onnx.NodeProto) -> dict:
    return {
        **catalogue.get(node.op_type).defaults,
        **{a.name: helper.get_attribute_value(a) for a in node.attribute},
    }


def _norm_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.domain == catalogue.DOMAIN and n.op_type == "RMSNorm"]


def _fuse_checked(original: onnx.ModelProto, target: str = "function", **options):
    before = original.SerializeToString()
    fused, report = fuse(original, target, **options)
    assert original.SerializeToString() == before, "fuse modified its input model"
    json.dumps(report.to_dict())
    return fused, report


@pytest.mark.parametrize("exporter,opset", EXPORTERS, ids=lambda v: str(v))
@pytest.mark.parametrize("form,dtype", SINGLE, ids=lambda v: str(v))
def test_single_norm(export, form, dtype, exporter, opset):
    original, x, module = export("norm", form, dtype, exporter, opset)
    fused, report = _fuse_checked(original)

    assert report.norms == 1 and report.residual_adds == 0
    assert not any(r.skips for r in report.rules), str(report)
    assert [n.op_type for n in fused.graph.node] == ["RMSNorm"]
    assert [i.name for i in fused.graph.initializer] == [
        p.name for p in original.graph.initializer if p.name in fused.graph.node[0].input
    ]
    node = fused.graph.node[0]
    attrs = _attrs(node)
    order = int(dtype != "float32")  # Llama rounds in order A; float32: both orders agree
    assert attrs["axis"] == -1 and attrs["cast_before_scale"] == order
    assert attrs["epsilon"] == pytest.approx(EPS, rel=1e-9)
    assert [f.overload for f in fused.functions if f.domain == catalogue.DOMAIN] == [node.overload]
    onnx.checker.check_model(fused, full_check=True)

    y = _run(fused, x)
    _close(y, _run(original, x), dtype)
    weight = module.weight.detach().numpy()
    (expected,) = reference.run("RMSNorm", x, weight, axis=-1, epsilon=EPS, cast_before_scale=order)
    _close(y, expected, dtype)


@pytest.mark.parametrize("exporter,opset", EXPORTERS, ids=lambda v: str(v))
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_two_norms_around_linear(export, dtype, exporter, opset):
    original, x, _ = export("two", "llama", dtype, exporter, opset)
    fused, report = _fuse_checked(original)

    nodes = _norm_nodes(fused)
    assert len(nodes) == 2 and report.norms == 2
    assert [_attrs(n)["epsilon"] for n in nodes] == pytest.approx([EPS, EPS2], rel=1e-9)
    assert {_attrs(n)["cast_before_scale"] for n in nodes} == {int(dtype != "float32")}
    assert not DECOMPOSED & {n.op_type for n in fused.graph.node}
    onnx.checker.check_model(fused, full_check=True)
    _close(_run(fused, x), _run(original, x), dtype)


@pytest.mark.parametrize("exporter,opset", EXPORTERS, ids=lambda v: str(v))
def test_fused_target_has_no_bodies(export, exporter, opset):
    original, _, _ = export("two", "llama", "float16", exporter, opset)
    fused, report = _fuse_checked(original, "fused")
    assert len(_norm_nodes(fused)) == 2 and report.norms == 2
    assert not [f for f in fused.functions if f.domain == catalogue.DOMAIN]
    assert all(not n.overload for n in _norm_nodes(fused))
    onnx.checker.check_model(fused, full_check=True)


def test_model_without_norm_is_left_alone():
    torch.manual_seed(0)
    x = torch.randn(*SHAPE)
    buffer = io.BytesIO()
    with quiet_export():
        torch.onnx.export(
            torch.nn.Linear(SHAPE[-1], 8), (x,), buffer, dynamo=False, opset_version=17
        )
    original = onnx.load_from_string(buffer.getvalue())
    fused, report = _fuse_checked(original)
    assert report.fused_total == 0
    assert all(r.found == 0 and r.fused == 0 and r.skipped == 0 for r in report.rules)
    assert "nothing to fuse" in str(report)
    assert [n.op_type for n in fused.graph.node] == [n.op_type for n in original.graph.node]
    assert not fused.functions
    _close(_run(fused, x.numpy()), _run(original, x.numpy()), "float32")


def _decomposed(
    *,
    axes=(-1,),
    keepdims=1,
    shape=SHAPE,
    opset=18,
    exponent=2.0,
    swap_add=False,
    eps_is_input=False,
    dtype=TensorProto.FLOAT,
    scale_shape=None,
    extra_output=False,
):
    """A decomposed RMSNorm built by hand: X * Reciprocal(Sqrt(ReduceMean(Pow(X, 2)) + eps)) * W."""
    np_type = helper.tensor_dtype_to_np_dtype(dtype)
    scale_shape = shape[-1:] if scale_shape is None else scale_shape
    inits = [
        numpy_helper.from_array(np.array(exponent, np_type), "two"),
        numpy_helper.from_array(np.array(EPS, np_type), "eps"),
        numpy_helper.from_array(np.full(scale_shape, 1.5, np_type), "w"),
    ]
    mean_attrs = {"keepdims": keepdims}
    mean_inputs = ["sq"]
    if opset >= 18:
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
        mean_inputs.append("axes")
    else:
        mean_attrs["axes"] = list(axes)
    nodes = [
        helper.make_node("Pow", ["x", "two"], ["sq"], name="pow"),
        helper.make_node("ReduceMean", mean_inputs, ["mean"], name="mean", **mean_attrs),
        helper.make_node(
            "Add", ["eps", "mean"] if swap_add else ["mean", "eps"], ["var"], name="add"
        ),
        helper.make_node("Sqrt", ["var"], ["rms"], name="sqrt"),
        helper.make_node("Reciprocal", ["rms"], ["inv"], name="reciprocal"),
        helper.make_node("Mul", ["x", "inv"], ["normalized"], name="normalize"),
        helper.make_node("Mul", ["normalized", "w"], ["y"], name="scale"),
    ]
    inputs = [helper.make_tensor_value_info("x", dtype, shape)]
    if eps_is_input:
        inputs.append(helper.make_tensor_value_info("eps", dtype, []))
    static = all(isinstance(d, int) for d in shape)
    y_shape = np.broadcast_shapes(shape, scale_shape) if static else shape
    outputs = [helper.make_tensor_value_info("y", dtype, y_shape)]
    if extra_output:
        outputs.append(helper.make_tensor_value_info("inv", dtype, shape[:-1] + (1,)))
    graph = helper.make_graph(nodes, "near_miss", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _standard(*, stash_type=1, scale_shape=(SHAPE[-1],)):
    graph = helper.make_graph(
        [
            helper.make_node(
                "RMSNormalization",
                ["x", "w"],
                ["y"],
                name="rms",
                epsilon=EPS,
                stash_type=stash_type,
            )
        ],
        "standard",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)],
        [numpy_helper.from_array(np.full(scale_shape, 1.5, np.float32), "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)


# case: (model builder, rule that reports the skip, reason, whether the norm without its
# scale still fuses)
NEAR_MISSES = {
    "axis_minus_2": (lambda: _decomposed(axes=(-2,)), LLAMA, "reduces over axes [-2]", False),
    "keepdims_0": (
        lambda: _decomposed(keepdims=0, shape=(4, 4), opset=17),
        LLAMA,
        "keepdims=0",
        False,
    ),
    "eps_graph_input": (lambda: _decomposed(eps_is_input=True), LLAMA, "is a graph input", False),
    "pow_3": (lambda: _decomposed(exponent=3.0), LLAMA, "exponent is 3.0, not 2", False),
    # with strict precision only (STRICT): by default it fuses, with float32 statistics
    "float16_statistics": (
        lambda: _decomposed(dtype=TensorProto.FLOAT16),
        LLAMA,
        "statistics are computed in FLOAT16",
        False,
    ),
    "intermediate_used": (
        lambda: _decomposed(extra_output=True),
        LLAMA,
        "'inv' is a graph output",
        False,
    ),
    "scale_broadcasts": (lambda: _decomposed(scale_shape=(1,)), SCALE, "not a suffix", True),
    "scale_adds_rank": (lambda: _decomposed(scale_shape=(1, 1, 1, 16)), SCALE, "higher rank", True),
    "stash_double": (
        lambda: _standard(stash_type=TensorProto.DOUBLE),
        STANDARD,
        "stash_type",
        False,
    ),
}


STRICT = {"float16_statistics"}


@pytest.mark.parametrize("case", NEAR_MISSES)
def test_near_miss_is_reported_not_fused(case):
    build, rule, reason, core_fuses = NEAR_MISSES[case]
    original = build()
    onnx.checker.check_model(original)
    fused, report = _fuse_checked(original, strict_precision=case in STRICT)
    row = report[rule]
    assert (row.found, row.fused, row.skipped) == (1, 0, 1), str(report)
    assert reason in row.skips[0].reason
    assert row.skips[0].node in ("scale", "rms", "normalize")
    assert reason in str(report) and f"{rule}: found 1, fused 0, skipped 1" in str(report)
    if core_fuses:  # the norm fuses; the Mul by the ill-fitting scale stays after it
        assert [n.op_type for n in fused.graph.node] == ["RMSNorm", "Mul"]
        assert not [i for i in fused.graph.node[0].input[1:] if i]
    else:
        assert report.norms == 0 and not _norm_nodes(fused)
        assert [n.op_type for n in fused.graph.node] == [n.op_type for n in original.graph.node]


@pytest.mark.parametrize(
    "variant",
    [{}, {"swap_add": True}, {"shape": ("batch", "seq", 16)}, {"opset": 17, "axes": (2,)}],
    ids=str,
)
def test_hand_built_model_fuses(variant):
    """The near-miss builder's own model fuses (so the near misses fail for their reason)."""
    original = _decomposed(**variant)
    fused, report = _fuse_checked(original)
    assert report.norms == 1 and [n.op_type for n in fused.graph.node] == ["RMSNorm"]
    assert report[LLAMA].found == 1 and not report[LLAMA].skips
    onnx.checker.check_model(fused, full_check=True)
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    _close(_run(fused, x), _run(original, x), "float32")


def test_norm_inside_model_local_function_is_reported():
    module, x = TwoNorms("llama"), torch.randn(*SHAPE)
    buffer = io.BytesIO()
    with quiet_export():
        torch.onnx.export(
            module,
            (x,),
            buffer,
            dynamo=False,
            opset_version=17,
            export_modules_as_functions={RMSNorm},
        )
    original = onnx.load_from_string(buffer.getvalue())
    fused, report = _fuse_checked(original)
    assert report.norms == 0 and report[LLAMA].found == 1
    assert "inside model-local function" in report[LLAMA].skips[0].reason
    _close(_run(fused, x.numpy()), _run(original, x.numpy()), "float32")


def test_unsupported_target_is_an_error():
    for target in ("tensorrt", "bogus"):
        with pytest.raises(ValueError, match="function, fused, ort, onnx"):
            fuse(_decomposed(), target)


def test_rules_are_an_onnxscript_rule_set():
    rule_set = rules()
    assert isinstance(rule_set, pattern.RewriteRuleSet)
    model = ir.serde.deserialize_model(_decomposed())
    total = 0
    while count := rule_set.apply_to_model(model):
        total += count
        RemoveUnusedNodesPass()(model)
    assert total == 2  # the core, then its scale
    assert [(n.domain, n.op_type) for n in model.graph] == [(catalogue.DOMAIN, "RMSNorm")]


def test_replacement_orders_inputs_and_refuses_unknown_names():
    from onnxnorm.fusion._base import Replacement

    x, residual, scale = ir.Value(name="x"), ir.Value(name="r"), ir.Value(name="s")
    new = Replacement(
        "SkipRMSNorm", {"Scale": scale, "X": x, "Residual": residual, "XBias": None}, {}
    )
    assert new.arguments() == [x, residual, scale]  # catalogue order, absent tail dropped
    with pytest.raises(ValueError, match="RMSNorm has no input Weight"):
        Replacement("RMSNorm", {"X": x, "Weight": scale}, {}).arguments()


def test_float16_statistics_are_fused_in_float32_and_noted():
    """A norm whose statistics the original computes in float16 (a float32 model converted to
    float16) is fused by default, with float32 statistics, and the report says so; on inputs
    where the original does not overflow the two agree within float16 tolerance, and above
    |x| = 256, where x*x passes float16's range, the fused model still computes the norm."""
    original = _decomposed(dtype=TensorProto.FLOAT16)
    fused, report = _fuse_checked(original)
    assert [n.op_type for n in fused.graph.node] == ["RMSNorm"]
    assert _attrs(fused.graph.node[0])["cast_before_scale"] == 1  # the Mul runs in float16
    row = report[LLAMA]
    assert (row.found, row.fused, row.skipped) == (1, 1, 0)
    note = "statistics computed in FLOAT16 in the original; onnxnorm computes them in float32"
    assert note in row.notes[0].reason and f"note {row.notes[0].node}: {note}" in str(report)
    assert next(r["notes"] for r in report.to_dict()["rules"] if r["rule"] == LLAMA)
    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float16) * 8
    _close(_run(fused, x), _run(original, x), "float16")
    big = (x * 40).astype(np.float16)  # |x| up to ~1000: x*x passes 65504
    want = reference.run(
        "RMSNorm", big, np.full(SHAPE[-1], 1.5, np.float16), epsilon=EPS, cast_before_scale=1
    )[0]
    _close(_run(fused, big), want, "float16")


def test_strict_precision_keeps_half_statistics_and_says_why():
    original = _decomposed(dtype=TensorProto.FLOAT16)
    fused, report = _fuse_checked(original, strict_precision=True)
    assert not _norm_nodes(fused) and report.norms == 0
    assert (
        "the statistics are computed in FLOAT16; onnxnorm computes them in FLOAT "
        "(strict precision)" in report[LLAMA].skips[0].reason
    )


@pytest.mark.parametrize("hidden", [64, 1024])
def test_ort_target_writes_skip_ops_whatever_the_size_of_the_weights(hidden, rng):
    """Weights of 1 KiB or more are kept apart from the graph while it is fused; lowering to
    ``ort`` still sees their types, so a float32 Pre-Norm residual norm becomes one
    SkipSimplifiedLayerNormalization with its Scale, as with small weights."""
    f = TensorProto.FLOAT
    weight = (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32)
    nodes = [
        helper.make_node("Add", ["x", "r"], ["sum"]),
        helper.make_node("Pow", ["sum", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["mean"], keepdims=1),
        helper.make_node("Add", ["mean", "eps"], ["var"]),
        helper.make_node("Sqrt", ["var"], ["std"]),
        helper.make_node("Reciprocal", ["std"], ["inv"]),
        helper.make_node("Mul", ["sum", "inv"], ["normed"]),
        helper.make_node("Mul", ["normed", "w"], ["y"]),
    ]
    init = [
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array([-1], np.int64), "axes"),
        numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
        numpy_helper.from_array(weight, "w"),
    ]
    shape = [1, 4, hidden]
    graph = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info(n, f, shape) for n in ("x", "r")],
        [helper.make_tensor_value_info(n, f, shape) for n in ("y", "sum")],
        init,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    lowered, report = fuse(model, "ort")
    assert [n.op_type for n in lowered.graph.node] == ["SkipSimplifiedLayerNormalization"]
    assert not report.lowering
    x, r = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x, "r": r})
    have = ort.InferenceSession(lowered.SerializeToString()).run(None, {"x": x, "r": r})
    for a, b in zip(have, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_sequence_values_keep_their_type():
    """A norm on an element of a sequence (SplitToSequence, then SequenceAt: Kimi Linear's
    TorchScript export splits its heads so). Shape inference types the sequence; the fused model
    must not write it as a tensor (ONNX Runtime then refuses to load it: "Type (tensor(float))
    ... does not match expected type (seq(tensor(float)))"): it loads, and matches."""
    f = TensorProto.FLOAT
    weight = np.linspace(0.5, 1.5, 16, dtype=np.float32)
    nodes = [
        helper.make_node("SplitToSequence", ["x"], ["pieces"], axis=0),
        helper.make_node("SequenceAt", ["pieces", "first"], ["x0"]),
        helper.make_node("Pow", ["x0", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
        helper.make_node("Add", ["ms", "eps"], ["mse"]),
        helper.make_node("Sqrt", ["mse"], ["rms"]),
        helper.make_node("Div", ["x0", "rms"], ["n"]),
        helper.make_node("Mul", ["n", "w"], ["y"]),
    ]
    inits = {
        "first": np.array(0, np.int64),
        "two": np.array(2.0, np.float32),
        "axes": np.array([-1], np.int64),
        "eps": np.array(1e-6, np.float32),
        "w": weight,
    }
    graph = helper.make_graph(
        nodes,
        "sequence",
        [helper.make_tensor_value_info("x", f, [2, 3, 16])],
        [helper.make_tensor_value_info("y", f, [1, 3, 16])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    fused, _ = fuse(model)
    assert [n.op_type for n in fused.graph.node if n.domain == catalogue.DOMAIN] == ["RMSNorm"]
    typed = {v.name: v.type for v in list(fused.graph.value_info) + list(fused.graph.output)}
    assert "pieces" not in typed or typed["pieces"].HasField("sequence_type")
    x = np.random.default_rng(0).standard_normal((2, 3, 16)).astype(np.float32)
    want = reference.run("RMSNorm", x[:1], weight, epsilon=1e-6)[0]
    for target in TARGETS_WITHOUT_LIBRARY:
        model_out = fused if target == "function" else fuse(model, target)[0]
        session = ort.InferenceSession(
            model_out.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        np.testing.assert_allclose(session.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-6)
