"""The norms of hybrid and linear-attention LLMs (onnxnorm/fusion/gated.py): every transformers
gated norm class and L2 norm exported alone, by both exporters, in float32 and float16, fuses
into one GatedRMSNorm / L2Norm node with the class's attributes, and Gemma 3n's and Llama 4's
norms into one RMSNorm; the fused model matches the original in plain ONNX Runtime (the nodes'
function bodies) and PyTorch, as do its ``ort`` and ``onnx`` lowerings. Hand-built graphs hold
every near miss to its reason, and ONNX Runtime's own GatedRMSNorm to the op. Whole 2-layer
models of each hybrid family (slow) hold exactly as many fused norms as their norm calls."""

from __future__ import annotations

import collections
import contextlib
import functools
import importlib
import inspect
import io
import re
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T, helper, numpy_helper
from onnxruntime.capi import onnxruntime_pybind11_state as state

from onnxnorm.errors import first_line
from onnxnorm.fusion import fuse
from onnxnorm.fusion.lowering import lower_with_notes, ms_gated_rms_norm_problem
from onnxnorm.ops import catalogue, reference
from tests.support.matrix import LOWERED_TARGETS

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from onnxnorm.testing import hf  # noqa: E402

#: X's types but bfloat16, which torch's .numpy() and ORT's run take no arrays of
DTYPES = {"float32": torch.float32, "float16": torch.float16}
EXPORTERS = ("dynamo", "torchscript")
H = 16
EPS = 1e-6  # the classes' default
GATED, L2 = "GatedRMSNorm", "L2Norm"


def _export(module, args, exporter: str, names: list[str]) -> onnx.ModelProto:
    """``module`` on ``args`` exported by torch.onnx (dynamo: opset 18 with its optimizer;
    TorchScript: opset 17), quietly."""
    with (
        torch.no_grad(),
        warnings.catch_warnings(),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
        hf.short_chunks(),
    ):
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            program = torch.onnx.export(
                module, args, input_names=names, dynamo=True, opset_version=18, optimize=True
            )
            return program.model_proto
        buffer = io.BytesIO()
        torch.onnx.export(module, args, buffer, input_names=names, dynamo=False, opset_version=17)
        return onnx.load_from_string(buffer.getvalue())


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    """Plain ONNX Runtime (CPU, no onnxnorm library: the fused nodes run their function bodies),
    the graph run as written."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def _run(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    return _session(model).run(None, feeds)[0]


def _close(got: np.ndarray, want: np.ndarray) -> None:
    rtol, atol = reference.tolerance(want.dtype)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol, atol)


def _attrs(node: onnx.NodeProto) -> dict:
    return {
        **catalogue.get(node.op_type).defaults,
        **{a.name: helper.get_attribute_value(a) for a in node.attribute},
    }


def _onnxnorm(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.domain == catalogue.DOMAIN]


# ---------------------------------------------------------------------------------------------
# each norm class alone

#: the norm classes of hybrid and linear-attention models in the installed transformers (read
#: from its model modules, no name typed: hf.norms): gated, l2norm functions, weightless
HYBRID_CLASSES = [n for n in hf.norms.norm_classes() if n.hybrid]


@functools.cache
def _probed() -> tuple[list, dict, dict]:
    """(the variants convert's probe reproduces, variant key -> its Config, class -> why it
    has none): the variants of hf.norms.hybrid_variants, each probed once."""
    from onnxnorm.nn.probe import ProbeFailure as _ProbeFailure, probe

    kept, configs, left = [], {}, collections.defaultdict(list)
    for variant in hf.norms.hybrid_variants():
        try:
            module = hf.norms.build(variant, H)
            configs[variant.key] = probe(module)
        except (hf.norms.NotBuildable, _ProbeFailure) as why:
            left[str(variant.norm)].append(f"{variant}: {why}")
            continue
        kept.append(variant)
    return kept, configs, dict(left)


def _inexact_in_half(variant) -> bool:
    """A norm class that rounds in half precision where no onnxnorm op does (DeepSeek-V4's
    unweighted RMSNorm multiplies x by its inverse root rounded to x's type): convert's probe
    says so. Its float16 export stays decomposed (test_inexact_in_half_stays_decomposed). An
    l2norm function is not one: its statistics in float16 are what the pass computes in float32
    on purpose (the report's note)."""
    note = _probed()[1][variant.key].note
    return "not bit-exact" in note and not variant.norm.function


def _variants(dtype: str) -> list:
    """The variants exported side by side in ``dtype``."""
    return [v for v in _probed()[0] if dtype == "float32" or not _inexact_in_half(v)]


def _expected(variant, half: bool) -> tuple[str, dict, tuple[str, ...]]:
    """(op, attributes, inputs) the fused node of ``variant`` has: what convert's probe found
    the class computes (an independent reading: the probe runs the module, the fusion reads
    its graph). The rounding order shows in float16 only (float32 rounds nowhere)."""
    from onnxnorm.nn.converter import OPS

    config = _probed()[1][variant.key]
    attrs = config.attributes(torch.zeros(H))
    attrs.pop("epsilon")
    if not half:
        attrs.pop("cast_before_scale", None)
    inputs = ("X",) + ("Scale",) * config.weight + ("Gate",) * (config.kind == "gated")
    return OPS[config.kind], attrs, inputs


class _SideBySide(torch.nn.Module):
    """Every norm of ``_probed()`` on inputs of its own (x_i, and gate_i for a gated one), each
    output its own: each class is exported alone, in one export per exporter and dtype (an
    export's fixed cost is most of its time)."""

    def __init__(self, dtype):
        super().__init__()
        self.variants = _variants(str(dtype).removeprefix("torch."))
        self.names = [v.key for v in self.variants]
        self.norms = torch.nn.ModuleList(
            hf.norms.build(v, H, seed=i + 1).to(dtype) for i, v in enumerate(self.variants)
        )

    def forward(self, *inputs):
        outputs, k = [], 0
        for variant, norm in zip(self.variants, self.norms):
            if variant.gated:
                outputs.append(norm(inputs[k], inputs[k + 1]))
                k += 2
            else:
                outputs.append(norm(inputs[k]))
                k += 1
        return tuple(outputs)

    def inputs(self, dtype) -> tuple[list[str], tuple]:
        generator = torch.Generator().manual_seed(3)
        names, values = [], []
        for i, variant in enumerate(self.variants):
            for what in ("x", "gate")[: 1 + variant.gated]:
                names.append(f"{what}{i}")
                scale, shift = (2.0, 0.5) if what == "x" else (1.0, 0.0)
                values.append((torch.randn(2, 3, H, generator=generator) * scale + shift).to(dtype))
        return names, tuple(values)


@functools.cache
def _side_by_side(exporter: str, dtype: str):
    """(module, input names, inputs, the export, its fusion and report, expected outputs)."""
    module = _SideBySide(DTYPES[dtype]).eval()
    names, args = module.inputs(DTYPES[dtype])
    original = _export(module, args, exporter, names)
    fused, report = fuse(original)
    feeds = {n: a.numpy() for n, a in zip(names, args)}
    with torch.no_grad():
        torch_outputs = [t.numpy() for t in module(*args)]
    return module, feeds, original, fused, report, torch_outputs


def _producer(model: onnx.ModelProto, output: str) -> onnx.NodeProto:
    """The node that computes graph output ``output``, through no-op Casts and Identities."""
    producers = {o: n for n in model.graph.node for o in n.output}
    node = producers[output]
    while node.op_type in ("Cast", "Identity") and node.domain == "":
        node = producers[node.input[0]]
    return node


def _only_the_norms(fused: onnx.ModelProto) -> None:
    """Nothing computes on the inputs but the onnxnorm nodes: what else is left reshapes a
    constant weight (Falcon-H1's [groups, group_size] Scale) or casts a value to the type it
    has."""
    types = {v.name: v.type.tensor_type.elem_type for v in fused.graph.input}
    constants = {t.name for t in fused.graph.initializer}
    for node in fused.graph.node:
        if node.domain == catalogue.DOMAIN:
            types.update({o: types.get(node.input[0]) for o in node.output})
        elif node.op_type == "Constant":
            constants.update(node.output)
        elif node.op_type == "Reshape":
            assert node.input[0] in constants, node
            constants.update(node.output)
        else:
            assert node.op_type == "Cast", node
            assert types.get(node.input[0]) == helper.get_attribute_value(node.attribute[0]), node


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("exporter", EXPORTERS)
def test_norm_classes_fuse_and_nothing_else_is_left(exporter, dtype):
    module, feeds, original, fused, report, _ = _side_by_side(exporter, dtype)
    assert len(_onnxnorm(fused)) == report.norms == len(module.names), str(report)
    _only_the_norms(fused)
    assert not [s for r in report.rules for s in r.skips], str(report)
    for got, want in zip(_session(fused).run(None, feeds), _session(original).run(None, feeds)):
        _close(got, want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("norm", HYBRID_CLASSES, ids=str)
def test_norm_class_fuses_into_one_node(norm, exporter, dtype):
    """Each way to build the class (its variants convert's probe reproduces; the others are
    left by convert with the reason, test_convert's concern) fuses into one node with the
    attributes the probe found, on the class's own input (and gate), matching the original."""
    module, feeds, original, fused, report, torch_outputs = _side_by_side(exporter, dtype)
    mine = [i for i, v in enumerate(module.variants) if v.norm == norm]
    if not mine:
        inexact = [v for v in _probed()[0] if v.norm == norm]
        if inexact:  # float16 only
            pytest.skip(f"{norm}: rounds where no onnxnorm op does in half precision")
        pytest.skip("; ".join(_probed()[2].get(str(norm), [f"{norm}: does not import"])))
    for i in mine:
        variant = module.variants[i]
        output = fused.graph.output[i].name
        node = _producer(fused, output)
        op, want, inputs = _expected(variant, dtype == "float16")
        assert (node.domain, node.op_type) == (catalogue.DOMAIN, op), (variant, str(report))
        attrs = _attrs(node)
        assert {k: attrs[k] for k in want} == want, variant
        # the epsilon as the graph adds it (TorchScript's float16 l2norm adds it in float16)
        eps = _probed()[1][variant.key].eps
        assert attrs["epsilon"] in (float(np.float32(eps)), float(np.float16(eps))), variant
        present = [p.name for p, v in zip(catalogue.get(op).inputs, node.input) if v]
        assert present == list(inputs), variant
        assert node.input[0] == f"x{i}"
        if variant.gated:
            assert node.input[2] == f"gate{i}"
        got = _session(fused).run([output], feeds)[0]
        _close(got, _session(original).run([original.graph.output[i].name], feeds)[0])
        _close(got, torch_outputs[i])


@functools.cache
def _lowered(target: str, dtype: str):
    _, feeds, original, _, _, _ = _side_by_side("dynamo", dtype)
    lowered, report = fuse(original, target)
    return lowered, report, _session(lowered).run(None, feeds), _session(original).run(None, feeds)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("target", LOWERED_TARGETS)
def test_norm_classes_lowered(target, dtype):
    """The ``ort`` and ``onnx`` targets run in plain ONNX Runtime and match the original; ``ort``
    writes ONNX Runtime's GatedRMSNorm exactly where it computes the node (the gate after the
    norm, in float32 or rounded once, one group's Scale: Qwen3-Next's and Qwen3.5's in float32,
    Kimi Linear's in both types, as convert's probe finds them); the body elsewhere, with the
    reason."""
    module = _side_by_side("dynamo", dtype)[0]
    lowered, report, got, want = _lowered(target, dtype)
    assert not _onnxnorm(lowered) and not lowered.functions
    for g, w in zip(got, want):
        _close(g, w)
    ms = [n for n in lowered.graph.node if (n.domain, n.op_type) == ("com.microsoft", GATED)]
    configs = _probed()[1]

    def takes_ms(name: str) -> bool:  # the gate after the norm, rounded once, one group
        c = configs[name]
        return (
            c.kind == "gated"
            and c.norm_before_gate
            and (dtype == "float32" or not c.cast_before_scale)
            and c.group_size in (0, H)
        )

    candidates = {
        name
        for name in module.names
        if target == "ort"
        and takes_ms(name)
        and ms_gated_rms_norm_problem(T.FLOAT if dtype == "float32" else T.FLOAT16) is None
    }
    outputs = {o.name: i for i, o in enumerate(lowered.graph.output)}
    written = {module.names[outputs[n.output[0]]] for n in ms}
    # written only where the probe says the node is ONNX Runtime's op; where such a node is
    # not (a Scale the graph reshapes: Falcon-H1's), the report says why
    assert written <= candidates and len(written) == len(ms), str(report)
    assert written or not candidates, str(report)
    why_not = [line for line in report.lowering if "not ONNX Runtime's GatedRMSNorm: its" in line]
    assert len(why_not) >= len(candidates - written), str(report)
    gated = sum(1 for v in module.variants if v.gated)
    assert sum("inlined function body" in line for line in report.lowering) >= gated - len(ms)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_inexact_in_half_stays_decomposed(exporter):
    """The classes that round where no onnxnorm op does in half precision (convert's probe
    says "not bit-exact"): their float16 export is left as it is, and still matches."""
    inexact = [v for v in _probed()[0] if _inexact_in_half(v)]
    if not inexact:
        pytest.skip("no such class in this transformers")
    for variant in inexact:
        norm = hf.norms.build(variant, H).half()
        x = (torch.randn(2, 3, H, generator=torch.Generator().manual_seed(5)) * 2).half()
        original = _export(norm, (x,), exporter, ["x"])
        fused, _ = fuse(original)
        assert not _onnxnorm(fused), variant
        feeds = {"x": x.numpy()}
        np.testing.assert_array_equal(_run(fused, feeds), _run(original, feeds))


# ---------------------------------------------------------------------------------------------
# hand-built graphs: spellings and near misses

SHAPE = [2, 3, H]
F, F16 = T.FLOAT, T.FLOAT16


def _model(nodes, inputs, outputs, inits=None, opset=18, ms=False) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()],
    )
    imports = [helper.make_opsetid("", opset)]
    imports += [helper.make_opsetid("com.microsoft", 1)] if ms else []
    return helper.make_model(graph, opset_imports=imports, ir_version=10)


def _rms(x: str, out: str, p: str = "", reduce: str = "ReduceMean", root=("Sqrt", None)):
    """``x / sqrt(mean(x^2) + eps)`` as the dynamo exporter writes it (``Mul(x,
    Reciprocal(Sqrt(.)))``), node names prefixed ``p``; ``reduce`` the statistic's op,
    ``root`` ("Pow", exponent) for Gemma 3n's spelling."""
    nodes = [
        helper.make_node("Mul", [x, x], [p + "sq"]),
        helper.make_node(reduce, [p + "sq", "axes"], [p + "ms"], keepdims=1),
        helper.make_node("Add", [p + "ms", "eps"], [p + "var"]),
    ]
    if root[0] == "Pow":
        nodes += [
            helper.make_node("Constant", [], [p + "e"], value_float=root[1]),
            helper.make_node("Pow", [p + "var", p + "e"], [p + "inv"]),
        ]
    else:
        nodes += [
            helper.make_node("Sqrt", [p + "var"], [p + "std"]),
            helper.make_node("Reciprocal", [p + "std"], [p + "inv"]),
        ]
    return [*nodes, helper.make_node("Mul", [x, p + "inv"], [out])]


def _silu(g: str, out: str) -> list:
    return [
        helper.make_node("Sigmoid", [g], [out + "_s"]),
        helper.make_node("Mul", [g, out + "_s"], [out]),
    ]


def _consts(dtype=np.float32, **more) -> dict:
    return {"axes": np.array([-1], np.int64), "eps": np.array(EPS, dtype), **more}


def _weight(shape=(H,), dtype=np.float32) -> np.ndarray:
    return (np.random.default_rng(5).random(shape) * 0.8 + 0.6).astype(dtype)


def _feeds(*names, dtype=np.float32, shape=SHAPE) -> dict:
    rng = np.random.default_rng(7)
    return {n: (rng.standard_normal(shape) * 2 + 0.5).astype(dtype) for n in names}


def _parity(original, fused, feeds) -> None:
    _close(_run(fused, feeds), _run(original, feeds))


def _left_alone(report, rule: str, reason: str) -> None:
    row = report[rule]
    assert row.found and row.skips, str(report)
    assert any(reason in s.reason for s in row.skips), str(report)
    assert reason in str(report)


def _gated_after(gate_nodes, gate_value="a", dtype=F, weight=True, opset=18):
    """``rms(x) * w * act(g)`` in float32 (Qwen3-Next's spelling at float32)."""
    nodes = _rms("x", "n")
    nodes += [helper.make_node("Mul", ["w", "n"], ["nw"])] if weight else []
    nodes += [*gate_nodes, helper.make_node("Mul", ["nw" if weight else "n", gate_value], ["y"])]
    inits = _consts(w=_weight()) if weight else _consts()
    return _model(
        nodes, [("x", dtype, SHAPE), ("g", dtype, SHAPE)], [("y", dtype, SHAPE)], inits, opset
    )


def test_swish_of_opset_24_is_silu_and_sigmoid_is_its_activation():
    for gate_nodes, kind, opset in (
        ([helper.make_node("Swish", ["g"], ["a"])], 0, 24),
        ([helper.make_node("Sigmoid", ["g"], ["a"])], 1, 18),
        (_silu("g", "a"), 0, 18),
    ):
        original = _gated_after(gate_nodes, opset=opset)
        fused, report = fuse(original)
        [node] = _onnxnorm(fused)
        assert node.op_type == GATED and _attrs(node)["activation"] == kind, str(report)
        assert list(node.input) == ["x", "w", "g"]
        _parity(original, fused, _feeds("x", "g"))


def test_wrong_activations_are_left_alone():
    cases = {
        "Tanh": [helper.make_node("Tanh", ["g"], ["a"])],
        "Swish with alpha 2.0": [helper.make_node("Swish", ["g"], ["a"], alpha=2.0)],
        "g * HardSigmoid(g)": [
            helper.make_node("HardSigmoid", ["g"], ["h"]),
            helper.make_node("Mul", ["g", "h"], ["a"]),
        ],
    }
    for what, gate_nodes in cases.items():
        original = _gated_after(gate_nodes, opset=24)
        fused, report = fuse(original)
        assert [n.op_type for n in _onnxnorm(fused)] == ["RMSNorm"], what
        _left_alone(report, "GatedRMSNorm (norm, then gate)", f"the gate's activation is {what}")
        _parity(original, fused, _feeds("x", "g"))


def test_activation_in_half_precision_is_left_alone():
    """A float16 norm gated by a float16 sigmoid: the op computes the activation in float32."""
    nodes = [helper.make_node("Cast", ["x"], ["xf"], to=F), *_rms("xf", "nf")]
    nodes += [
        helper.make_node("Cast", ["nf"], ["n"], to=F16),
        helper.make_node("Sigmoid", ["g"], ["a"]),
        helper.make_node("Mul", ["n", "a"], ["y"]),
    ]
    original = _model(nodes, [("x", F16, SHAPE), ("g", F16, SHAPE)], [("y", F16, SHAPE)], _consts())
    fused, report = fuse(original)
    assert [n.op_type for n in _onnxnorm(fused)] == ["RMSNorm"]
    _left_alone(report, "GatedRMSNorm (norm, then gate)", "sigmoid is computed in FLOAT16")
    _parity(original, fused, _feeds("x", "g", dtype=np.float16))


def test_half_precision_roundings_that_are_not_the_op_s():
    """A float16 norm that scales in float32 and rounds (order B) before a float32 gate rounds
    twice: no order of the op. A float32 gate beside a float16 X: the float32 gated norm stays
    inside its casts (the op takes the gate in X's type)."""
    nodes = [helper.make_node("Cast", ["x"], ["xf"], to=F), *_rms("xf", "nf")]
    nodes += [
        helper.make_node("Mul", ["w", "nf"], ["sf"]),
        helper.make_node("Cast", ["sf"], ["n"], to=F16),
        helper.make_node("Cast", ["n"], ["n32"], to=F),
        helper.make_node("Cast", ["g"], ["gf"], to=F),
        *_silu("gf", "a"),
        helper.make_node("Mul", ["n32", "a"], ["yf"]),
        helper.make_node("Cast", ["yf"], ["y"], to=F16),
    ]
    inputs = [("x", F16, SHAPE), ("g", F16, SHAPE)]
    original = _model(nodes, inputs, [("y", F16, SHAPE)], _consts(w=_weight()))
    fused, report = fuse(original)
    assert [n.op_type for n in _onnxnorm(fused)] == ["RMSNorm"]
    _left_alone(
        report, "GatedRMSNorm (norm, then gate)", "rounds (order B), then the gate multiplies"
    )
    _parity(original, fused, _feeds("x", "g", dtype=np.float16))

    nodes = [helper.make_node("Cast", ["x"], ["xf"], to=F), *_rms("xf", "nf"), *_silu("g", "a")]
    nodes += [
        helper.make_node("Mul", ["nf", "a"], ["yf"]),
        helper.make_node("Cast", ["yf"], ["y"], to=F16),
    ]
    inputs = [("x", F16, SHAPE), ("g", F, SHAPE)]
    original = _model(nodes, inputs, [("y", F16, SHAPE)], _consts())
    fused, report = fuse(original)
    assert [n.op_type for n in fused.graph.node] == ["Cast", GATED, "Cast"]
    _left_alone(report, "GatedRMSNorm input/output casts absorbed", "is computed in FLOAT")
    feeds = {"x": _feeds("x", dtype=np.float16)["x"], "g": _feeds("g")["g"]}
    _parity(original, fused, feeds)


def test_weight_after_the_gate_is_on_the_wrong_side():
    """``rms(x) * act(g) * w``: the op scales, then gates; in float32 the two orders round
    differently, so the weight stays a Mul after the gated norm."""
    nodes = [*_rms("x", "n"), *_silu("g", "a"), helper.make_node("Mul", ["n", "a"], ["na"])]
    nodes += [helper.make_node("Mul", ["na", "w"], ["y"])]
    original = _model(
        nodes, [("x", F, SHAPE), ("g", F, SHAPE)], [("y", F, SHAPE)], _consts(w=_weight())
    )
    fused, report = fuse(original)
    assert [n.op_type for n in fused.graph.node] == [GATED, "Mul"]
    assert _onnxnorm(fused)[0].input[1] == ""  # no Scale
    _left_alone(report, "GatedRMSNorm scale absorbed", "the weight multiplies after the gate")
    _parity(original, fused, _feeds("x", "g"))


def test_gate_that_broadcasts_is_left_alone():
    original = _gated_after(_silu("g", "a"))
    original.graph.input[1].CopyFrom(helper.make_tensor_value_info("g", F, [2, 3, 1]))
    fused, report = fuse(original)
    assert [n.op_type for n in _onnxnorm(fused)] == ["RMSNorm"]
    _left_alone(report, "GatedRMSNorm (norm, then gate)", "the gate and X differ in shape")


def _grouped(view: list[int], back: list[int], x_shape=SHAPE, gate_first=True, weight=None):
    """Mamba2's spelling: ``reshape(x * silu(g), view)``, its RMS statistics, reshaped to
    ``back``."""
    nodes = [*_silu("g", "a"), helper.make_node("Mul", ["x", "a"], ["z"])] if gate_first else []
    z = "z" if gate_first else "x"
    nodes += [helper.make_node("Reshape", [z, "view"], ["zv"]), *_rms("zv", "nv")]
    last = "nv"
    if weight is not None:
        nodes += [helper.make_node("Mul", ["wv", "nv"], ["nw"])]
        last = "nw"
    nodes += [helper.make_node("Reshape", [last, "back"], ["y"])]
    inits = _consts(view=np.array(view, np.int64), back=np.array(back, np.int64))
    if weight is not None:
        inits["wv"] = weight
    inputs = [("x", F, x_shape)] + ([("g", F, x_shape)] if gate_first else [])
    return _model(nodes, inputs, [("y", F, back)], inits)


def test_groups_and_the_gate_before_the_norm():
    for weight in (None, _weight((2, 8)), _weight((8,))):
        original = _grouped([2, 3, 2, 8], SHAPE, weight=weight)
        fused, _report = fuse(original)
        [node] = _onnxnorm(fused)
        attrs = _attrs(node)
        assert (attrs["group_size"], attrs["norm_before_gate"], attrs["activation"]) == (8, 0, 0)
        assert node.input[0] == "x" and node.input[2] == "g"
        assert bool(node.input[1]) == (weight is not None)
        _parity(original, fused, _feeds("x", "g"))
    # a view of other leading dims groups the same values
    original = _grouped([12, 4], SHAPE)
    [node] = _onnxnorm(fuse(original)[0])
    assert _attrs(node)["group_size"] == 4
    # one group over the whole row is the plain extent
    [node] = _onnxnorm(fuse(_grouped([2, 3, 1, 16], SHAPE))[0])
    assert _attrs(node)["group_size"] == 0


def test_wrong_group_sizes_are_left_alone():
    """Mamba2's spelling with a reshape that does not group rows: the gate stays a Mul before
    a norm of the view, which stays as it is, with the reason. Without a gate next to it, a
    norm between two reshapes is a per-head norm (a Q/K norm) and is no GatedRMSNorm at all."""
    rule = "GatedRMSNorm (groups: Reshape around the norm)"
    # groups of 9 in rows of 12: a group would span two rows
    original = _grouped([2, 4, 9], [2, 3, 12], x_shape=[2, 3, 12])
    fused, report = fuse(original)
    assert [n.op_type for n in _onnxnorm(fused)] == ["RMSNorm"]
    _left_alone(report, rule, "groups of 9 (the reshape's last dim) do not divide X's last dim 12")
    _parity(original, fused, _feeds("x", "g", shape=[2, 3, 12]))
    # the reshape after the norm gives another shape than X's
    original = _grouped([2, 3, 2, 8], [6, H])
    fused, report = fuse(original)
    _left_alone(report, rule, "the reshape after the norm does not restore X's shape")
    # a weight over the groups that is no row of X
    original = _grouped([2, 3, 2, 8], SHAPE, weight=_weight((3, 2, 8)))
    fused, report = fuse(original)
    _left_alone(report, rule, "does not map onto X's rows of 16")
    _parity(original, fused, _feeds("x", "g"))
    # no gate: a per-head norm
    fused, report = fuse(_grouped([2, 3, 2, 8], SHAPE, gate_first=False))
    assert [n.op_type for n in _onnxnorm(fused)] == ["RMSNorm"]
    assert not report[rule].found


def test_read_elsewhere_keeps_the_graph_exact():
    """The gate's activation read by another node stays computed for it; a norm output read
    elsewhere declines the gate (the norm is not computed twice)."""
    original = _gated_after(_silu("g", "a"))
    original.graph.output.append(helper.make_tensor_value_info("a", F, SHAPE))
    fused, report = fuse(original)
    assert [n.op_type for n in _onnxnorm(fused)] == [GATED]
    assert {"Sigmoid", "Mul"} <= {n.op_type for n in fused.graph.node}
    for got, want in zip(
        _session(fused).run(None, _feeds("x", "g")), _session(original).run(None, _feeds("x", "g"))
    ):
        _close(got, want)

    original = _gated_after(_silu("g", "a"))
    original.graph.output.append(helper.make_tensor_value_info("nw", F, SHAPE))
    fused, report = fuse(original)
    assert [n.op_type for n in _onnxnorm(fused)] == ["RMSNorm"]
    _left_alone(report, "GatedRMSNorm (norm, then gate)", "is a graph output")


def test_l2_norm_sum_and_mean():
    """x / sqrt(sum(x^2) + eps) is L2Norm; with the mean it is an RMSNorm; the sum of squares
    divided by the count of the values summed (or times its reciprocal) is their mean, an
    RMSNorm, spelled with ReduceSum or ReduceSumSquare alike; scaled by another factor it is
    neither, and reported."""
    for reduce, op in (("ReduceSum", L2), ("ReduceMean", "RMSNorm")):
        original = _model(
            _rms("x", "y", reduce=reduce), [("x", F, SHAPE)], [("y", F, SHAPE)], _consts()
        )
        fused, report = fuse(original)
        assert [n.op_type for n in fused.graph.node] == [op], str(report)
        _parity(original, fused, _feeds("x"))
        assert report["L2Norm (decomposed)"].fused == (op == L2)

    def scaled(how: str, factor: float, reduce: str = "ReduceSum", weight: bool = False):
        nodes = _rms("x", "n" if weight else "y", reduce=reduce)
        if reduce == "ReduceSumSquare":  # the square inside the reduction
            nodes[1].input[0] = "x"
            del nodes[0]
        at = 0 if reduce == "ReduceSumSquare" else 1
        nodes[at].output[0] = "total"
        nodes.insert(at + 1, helper.make_node(how, ["total", "k"], ["ms"]))
        nodes += [helper.make_node("Mul", ["n", "w"], ["y"])] if weight else []
        inits = _consts(k=np.array(factor, np.float32), **({"w": _weight()} if weight else {}))
        return _model(nodes, [("x", F, SHAPE)], [("y", F, SHAPE)], inits)

    # the L2 norm with the squares summed by ReduceSumSquare (onnxscript-based builders)
    nodes = _rms("x", "y", reduce="ReduceSumSquare")
    nodes[1].input[0] = "x"
    del nodes[0]
    original = _model(nodes, [("x", F, SHAPE)], [("y", F, SHAPE)], _consts())
    fused, report = fuse(original)
    assert [n.op_type for n in fused.graph.node] == [L2], str(report)
    _parity(original, fused, _feeds("x"))

    title = "RMSNorm (the mean as a scaled sum of squares)"
    for original in (
        scaled("Div", H),
        scaled("Mul", float(np.float32(1) / np.float32(H))),
        scaled("Div", H, reduce="ReduceSumSquare"),
        scaled("Mul", float(np.float32(1) / np.float32(H)), reduce="ReduceSumSquare"),
        scaled("Div", H, weight=True),
    ):
        fused, report = fuse(original)
        nodes = [n for n in fused.graph.node if n.op_type != "Constant"]
        assert [n.op_type for n in nodes] == ["RMSNorm"], str(report)
        assert {a.name: a.f for a in nodes[0].attribute}["epsilon"] == pytest.approx(EPS)
        weighted = "w" in {t.name for t in original.graph.initializer}
        assert [i for i in nodes[0].input if i][1:] == (["w"] if weighted else [])
        assert report[title].fused == 1
        _parity(original, fused, _feeds("x"))
    for original, reason in (
        (scaled("Div", H / 2), f"the sum of squares of {H} values is divided by {H // 2:g} "),
        (scaled("Mul", 0.5, "ReduceSumSquare"), f"of {H} values is multiplied by 0.5 before"),
    ):
        fused, report = fuse(original)
        assert not _onnxnorm(fused)
        _left_alone(report, title, reason)


def test_l2_norm_in_half_precision_and_strict_precision():
    original = _model(
        _rms("x", "y", reduce="ReduceSum"),
        [("x", F16, SHAPE)],
        [("y", F16, SHAPE)],
        _consts(np.float16),
    )
    fused, report = fuse(original)
    assert [n.op_type for n in fused.graph.node] == [L2]
    assert "statistics computed in FLOAT16" in report["L2Norm (decomposed)"].notes[0].reason
    _parity(original, fused, _feeds("x", dtype=np.float16))
    fused, report = fuse(original, strict_precision=True)
    assert not _onnxnorm(fused)
    _left_alone(report, "L2Norm (decomposed)", "strict precision")


def test_gemma3n_pow_root_and_its_near_miss():
    original = _model(
        _rms("x", "y", root=("Pow", -0.5)), [("x", F, SHAPE)], [("y", F, SHAPE)], _consts()
    )
    fused, report = fuse(original)
    assert [n.op_type for n in fused.graph.node] == ["RMSNorm"]
    _parity(original, fused, _feeds("x"))
    original = _model(
        _rms("x", "y", root=("Pow", -0.25)), [("x", F, SHAPE)], [("y", F, SHAPE)], _consts()
    )
    fused, report = fuse(original)
    assert not _onnxnorm(fused)
    _left_alone(report, "RMSNorm (decomposed)", "the root is Pow(., -0.25), not Pow(., -0.5)")


def test_lp_normalization_is_reported_and_left_alone():
    original = _model(
        [helper.make_node("LpNormalization", ["x"], ["y"], axis=-1, p=2)],
        [("x", F, SHAPE)],
        [("y", F, SHAPE)],
    )
    fused, report = fuse(original)
    assert [n.op_type for n in fused.graph.node] == ["LpNormalization"]
    _left_alone(report, "L2Norm (ONNX LpNormalization)", "gives 0 for an all-zero row")


@pytest.mark.parametrize(
    "activation,size,dtype",
    [("silu", 8, F), ("swish", H, F16), ("sigmoid", 8, F16), ("sigmoid", H, F)],
)
def test_onnxruntime_gated_rms_norm_op(activation, size, dtype):
    """com.microsoft GatedRMSNorm becomes the op (groups of len(scale), the gate after the norm,
    order B) and matches ONNX Runtime's own kernel; lowered to ``ort`` it is that op again."""
    np_type = helper.tensor_dtype_to_np_dtype(dtype)
    original = _model(
        [
            helper.make_node(
                "GatedRMSNorm",
                ["x", "w", "g"],
                ["y"],
                domain="com.microsoft",
                activation=activation,
                epsilon=1e-5,
            )
        ],
        [("x", dtype, SHAPE), ("g", dtype, SHAPE)],
        [("y", dtype, SHAPE)],
        {"w": _weight((size,), np_type)},
        ms=True,
    )
    fused, _report = fuse(original)
    [node] = _onnxnorm(fused)
    attrs = _attrs(node)
    assert node.op_type == GATED and list(node.input) == ["x", "w", "g"]
    assert attrs["group_size"] == (0 if size == H else size)
    assert (attrs["activation"], attrs["norm_before_gate"], attrs["cast_before_scale"]) == (
        int(activation == "sigmoid"),
        1,
        0,
    )
    assert attrs["epsilon"] == pytest.approx(1e-5)
    feeds = _feeds("x", "g", dtype=np_type)
    _parity(original, fused, feeds)
    want = reference.run(GATED, feeds["x"], _weight((size,), np_type), feeds["g"], **attrs)[0]
    _close(_run(fused, feeds), want)
    lowered, _ = fuse(original, "ort")
    if ms_gated_rms_norm_problem(dtype) is None:
        assert [(n.domain, n.op_type) for n in lowered.graph.node] == [("com.microsoft", GATED)]
    _parity(original, lowered, feeds)


def test_gated_scale_offset_folds_into_onnxruntime_s_scale():
    """A constant Scale with an offset, exact in X's type, is folded into a new Scale of
    ONNX Runtime's GatedRMSNorm; one that is not exact keeps the function body."""
    weight = ((np.arange(H) - 4) / 64).astype(np.float16)  # 1 + w exact in float16
    node = helper.make_node(
        GATED, ["x", "w", "g"], ["y"], domain=catalogue.DOMAIN, scale_offset=1.0, epsilon=1e-5
    )
    base = _model(
        [node], [("x", F16, SHAPE), ("g", F16, SHAPE)], [("y", F16, SHAPE)], {"w": weight}
    )
    base.opset_import.append(helper.make_opsetid(catalogue.DOMAIN, 1))

    lowered, notes = lower_with_notes(base, "ort")
    if ms_gated_rms_norm_problem(F16) is None:
        assert [n.op_type for n in lowered.graph.node] == [GATED], notes
        feeds = _feeds("x", "g", dtype=np.float16)
        attrs = {"scale_offset": 1.0, "epsilon": 1e-5}
        _close(
            _run(lowered, feeds), reference.run(GATED, feeds["x"], weight, feeds["g"], **attrs)[0]
        )
    base.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.full(H, 1e-3, np.float16), "w"))
    lowered, notes = lower_with_notes(base, "ort")
    assert notes[0].emitted == "inlined function body"
    assert "Scale + offset is not exactly of X's type" in notes[0].reason


# ---------------------------------------------------------------------------------------------
# whole models

#: the hybrid and linear-attention families of the installed transformers (hf.norms: the
#: model modules with a gated norm class or an l2norm function), and the families with a norm
#: built with or without its scale that hf.FAMILIES builds (Gemma 3n's Pow(-0.5) RMSNorm)
FAMILIES = sorted(
    {n.model_type for n in hf.norms.norm_classes() if n.gated or n.function}
    | {
        n.model_type
        for n in hf.norms.norm_classes()
        if n.optional_scale and n.model_type in hf.FAMILIES
    }
)
WHOLE = [(f, e) for f in FAMILIES for e in EXPORTERS]


class _Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False
        ).logits


def _norm_calls(model, ids, mask) -> collections.Counter:
    """The norm modules' calls by kind ("gated" or "plain"), and the calls of the model
    module's l2norm functions ("l2"; the linear attention's queries and keys)."""
    calls: collections.Counter = collections.Counter()
    hooks = [
        m.register_forward_hook(
            lambda m, *_: calls.update(["gated" if _takes_gate(m) else "plain"])
        )
        for m in model.modules()
        if hf.is_norm(m)
    ]
    patched = []
    for norm in hf.norms.norm_classes():
        if norm.function and type(model).__module__ == norm.module:
            source, original = importlib.import_module(norm.module), norm.load()

            def counted(*args, _original=original, **kwargs):
                calls.update(["l2"])
                return _original(*args, **kwargs)

            setattr(source, norm.name, counted)
            patched.append((source, norm.name, original))
    try:
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask, use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
        for source, name, original in patched:
            setattr(source, name, original)
    return calls


def _takes_gate(module) -> bool:
    return "gate" in inspect.signature(module.forward).parameters


def _tiny_model(family: str):
    """hf.FAMILIES' tiny model of ``family``, else hf.generic's; a skip that says why where
    the generic rules do not give a model that runs."""
    if family in hf.FAMILIES:
        return hf.model(hf.config(family))
    try:
        return hf.model(hf.generic.config(family))
    except Exception as why:  # noqa: BLE001 - the reason goes in the skip
        pytest.skip(
            f"{family}: no tiny model ({type(why).__name__}: {first_line(why, '')}); "
            "give it a family of its own in hf.FAMILIES"
        )


def _whole(family: str, exporter: str):
    model = _tiny_model(family)
    ids = torch.randint(3, 96, (1, 6), generator=torch.Generator().manual_seed(4))
    mask = torch.ones(1, 6, dtype=torch.int64)
    try:
        exported = _export(_Logits(model), (ids, mask), exporter, ["input_ids", "attention_mask"])
    except torch.onnx.errors.UnsupportedOperatorError as why:
        # TorchScript has no translation for the chunked delta rule's linalg_solve_triangular
        # (the linear-attention families): nothing to fuse
        assert exporter == "torchscript", why
        pytest.skip(f"{family}: the {exporter} exporter cannot export it ({first_line(why, '')})")
    return model, ids, mask, exported


#: why a gated norm of a whole model is fused without its gate: the rule cannot prove the gate
#: of X's shape (TorchScript writes the mixer's output through a Reshape of a computed shape,
#: whose dims onnx's and ONNX Runtime's inference leave unknown, and the gate may broadcast),
#: or the group Reshape around the norm cannot be proved to restore X's shape
GATE_LEFT_OUT = (
    "the gate and X",
    "cannot prove that the gate and X have the same shape",
    "X's shape is not static",
)


@pytest.mark.slow
@pytest.mark.parametrize("family,exporter", WHOLE, ids=[f"{f}-{e}" for f, e in WHOLE])
def test_whole_model(family, exporter):
    from onnxnorm.fusion.pipeline import count_norms
    from onnxnorm.fusion.verify import load_problem

    model, ids, mask, original = _whole(family, exporter)
    calls = _norm_calls(model, ids, mask)
    fused, report = fuse(original)
    nodes = _onnxnorm(fused)
    gated = sum(1 for n in nodes if n.op_type == GATED and len(n.input) > 2 and n.input[2])
    l2 = sum(1 for n in nodes if n.op_type == L2)
    held = (gated, l2, count_norms(fused)[0] - gated - l2)
    print(f"{family} {exporter}: calls {dict(calls)}, fused {held}")
    # every norm is fused, gated or not, and every L2 norm
    assert sum(held) == sum(calls.values()), str(report)
    assert (l2, gated <= calls["gated"]) == (calls["l2"], True), str(report)
    # a gated norm is fused with its gate unless the report says, for its node, why the gate
    # could not be proved of X's shape (what the exporter leaves static decides which: the
    # counts are read from the export, not from a table of what one release wrote)
    without_gate = {
        s.node
        for r in report.rules
        if r.rule.startswith(GATED)
        for s in r.skips
        if any(words in s.reason for words in GATE_LEFT_OUT)
    }
    assert len(without_gate) >= calls["gated"] - gated, str(report)
    if exporter == "dynamo":  # the dynamo exporter keeps every static dim: nothing is left out
        assert gated == calls["gated"], str(report)
    feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    problem = load_problem(original)
    if problem is not None:
        # the TorchScript exports of the Mamba2 mixers: ONNX Runtime refuses their Transpose
        assert "Transpose" in problem and exporter == "torchscript", problem
        return
    try:
        want = _run(original, feeds)
    except (state.Fail, state.InvalidArgument, state.RuntimeException) as error:
        # the export fails in ONNX Runtime outside its norms (Kimi Linear's TorchScript export
        # with transformers 5.25: a Tile whose repeats are not 1-D): the fused model fails at
        # the same node, having changed nothing there
        assert exporter == "torchscript", error
        node = re.search(r"Name:'([^']+)'", str(error)).group(1)
        with pytest.raises(type(error), match=re.escape(node)):
            _run(fused, feeds)
        return
    _close(_run(fused, feeds), want)
    with torch.no_grad():
        np.testing.assert_allclose(
            _run(fused, feeds),
            model(input_ids=ids, attention_mask=mask, use_cache=False).logits.numpy(),
            rtol=1e-4,
            atol=1e-4,
        )


@pytest.mark.slow
def test_onnxruntime_genai_qwen3_5(tmp_path):
    """onnxruntime-genai's model builder writes Qwen3.5's gated norm as ONNX Runtime's
    GatedRMSNorm (one value head's weight: groups of head_v_dim) and its q/k L2 norms as
    LpNormalization: the first becomes the op, the second stays, with the reason. (The builder's
    Qwen3.5 does not run on ONNX Runtime's CPU provider, whose RotaryEmbedding takes no 3-D
    position ids; the op's parity with ORT's kernel is test_onnxruntime_gated_rms_norm_op's.)
    Its GraniteMoeHybrid builds attention layers only (a Mamba2 layer has no self_attn)."""
    pytest.importorskip("onnxruntime_genai")
    config = hf.config("qwen3_5", **hf.TOKEN_IDS)
    checkpoint = hf.save_checkpoint(hf.qwen3_5_for_genai(config), tmp_path / "checkpoint")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        folder = hf.genai_build(checkpoint, tmp_path / "genai", "fp32")
    original = onnx.load(folder / "model.onnx", load_external_data=False)
    kinds = collections.Counter((n.domain, n.op_type) for n in original.graph.node)
    assert kinds["com.microsoft", GATED] == 1 and kinds["", "LpNormalization"] == 2
    fused, report = fuse(original, base_dir=str(folder))
    [node] = [n for n in _onnxnorm(fused) if n.op_type == GATED]
    attrs = _attrs(node)
    value_head = config.linear_value_head_dim
    assert (attrs["group_size"], attrs["activation"], attrs["norm_before_gate"]) == (
        value_head,
        0,
        1,
    )
    assert attrs["cast_before_scale"] == 0 and attrs["epsilon"] == pytest.approx(EPS)
    assert report["GatedRMSNorm (ORT com.microsoft GatedRMSNorm)"].fused == 1
    _left_alone(report, "L2Norm (ONNX LpNormalization)", "gives 0 for an all-zero row")
    assert sum(n.op_type == "LpNormalization" for n in fused.graph.node) == 2
    # and the other norms as before: 4 Skip ops, the first norm, the attention's q and k norms
    assert report.norms == 1 + 4 + 3 and not report.load_check
