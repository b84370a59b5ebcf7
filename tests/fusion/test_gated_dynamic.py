"""Grouped gated norms whose reshapes the graph computes (onnxnorm/fusion/gated.py,
``GroupAbsorb``): with dynamic batch and sequence dims, the targets of the view into groups and
of the view back are built from ``Shape`` nodes, which the rule evaluates over symbolic dims
(TorchScript's Shape/Gather/Div/Unsqueeze/Concat, the dynamo exporter's ``Shape(start, end)``
and Concat with constants, ``Shape(X)`` itself, Slice, a 0 or -1 dim); and a grouped view that an
exporter's optimizer merged with the view before it (Falcon-H1's per-head scan output viewed as
one group of the whole row) is the norm of that tensor reshaped to the output's shape.

Hand-built graphs hold each spelling, with ONNX Runtime's symbolic shape inference and without it
(where it fails, as on TorchScript's Mamba2 exports, the rule must prove the shapes itself), and
the near misses to their reasons; the tiny Hugging Face models of the Mamba2 families, exported
with dynamic batch and sequence dims (slow), fuse every gated norm into one GatedRMSNorm that
matches the original in ONNX Runtime on a batch and a sequence length other than the export's.
"""

from __future__ import annotations

import contextlib
import io
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper, numpy_helper

from onnxnorm.fusion import fuse, passes
from onnxnorm.fusion.verify import verify
from onnxnorm.ops import catalogue

GATED = "GatedRMSNorm"
RULE = "GatedRMSNorm (groups: Reshape around the norm)"
WIDTH, GROUP = 64, 16
DYNAMIC = ["batch", "seq", WIDTH]


class _Graph:
    """Nodes and constants of a hand-built graph; each call adds a node and returns its output."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def __call__(self, op: str, *inputs: str, **attrs) -> str:
        out = f"{op.lower()}_{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=out, **attrs))
        return out

    def const(self, value, dtype=np.int64) -> str:
        name = f"c{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.array(value, dtype), name))
        return name

    def silu(self, g: str) -> str:
        return self("Mul", g, self("Sigmoid", g))

    def rms(self, x: str, eps: float = 1e-6) -> str:
        """``x / sqrt(mean(x^2) + eps)`` over the last axis, as the dynamo exporter writes it."""
        mean = self("ReduceMean", self("Mul", x, x), self.const([-1]), keepdims=1)
        root = self("Sqrt", self("Add", mean, self.const(eps, np.float32)))
        return self("Mul", x, self("Reciprocal", root))

    def dim(self, x: str, i: int) -> str:
        """TorchScript's ``x.shape[i]`` as a 1-D tensor: Unsqueeze(Gather(Shape(x), i))."""
        return self("Unsqueeze", self("Gather", self("Shape", x), self.const(i)), self.const([0]))

    def model(self, inputs, outputs) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes,
            "g",
            [helper.make_tensor_value_info(n, T.FLOAT, s) for n, s in inputs],
            [helper.make_tensor_value_info(n, T.FLOAT, s) for n, s in outputs],
            self.inits,
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


def _targets(g: _Graph, spelling: str, z: str, shape_of: str) -> tuple[str, str, int]:
    """(the view's target, the target after the norm, allowzero) of ``z`` ([batch, seq,
    WIDTH]) in groups of GROUP, as ``spelling`` computes them; ``shape_of`` is the tensor whose
    Shape the dynamo spelling reads (another input of the same batch and sequence dims)."""
    if spelling == "torchscript":  # view(*prefix, last // g, g), view(*prefix, (last // g) * g)
        quotient = g("Div", g("Gather", g("Shape", z), g.const(2)), g.const(GROUP))
        groups = g("Unsqueeze", g("Cast", quotient, to=T.INT64), g.const([0]))
        lead = [g.dim(z, 0), g.dim(z, 1)]
        view = g("Concat", *lead, groups, g.const([GROUP]), axis=0)
        whole = g("Unsqueeze", g("Mul", quotient, g.const(GROUP)), g.const([0]))
        return view, g("Concat", *lead, whole, axis=0), 0
    if spelling == "dynamo":  # Shape(start, end) of another tensor, Concat with constants
        lead = [g("Shape", shape_of, start=0, end=1), g("Shape", shape_of, start=1, end=2)]
        view = g("Concat", *lead, g.const([WIDTH // GROUP, GROUP]), axis=0)
        return view, g("Concat", *lead, g.const([WIDTH]), axis=0), 1
    if spelling == "slice":  # shape[:-1] + [groups, g], then Shape(z) itself
        lead = g("Slice", g("Shape", z), g.const([0]), g.const([-1]))
        return g("Concat", lead, g.const([WIDTH // GROUP, GROUP]), axis=0), g("Shape", z), 0
    if spelling == "gather":  # shape[[0, 1]] + [-1, g], back to shape[[0, 1]] + [-1]
        lead = g("Gather", g("Shape", z), g.const([0, 1]))
        view = g("Concat", lead, g.const([-1, GROUP]), axis=0)
        return view, g("Concat", lead, g.const([-1]), axis=0), 0
    assert spelling == "zeros"  # constants: copy the leading dims, infer the rest
    return g.const([0, 0, -1, GROUP]), g.const([0, 0, -1]), 0


def _gate_first(spelling: str, dims=DYNAMIC, weight: bool = True) -> onnx.ModelProto:
    """Mamba2's gated norm (Nemotron-H, Bamba, GraniteMoeHybrid): ``x * silu(g)`` viewed in
    groups, their RMS, the view back, then the weight."""
    g = _Graph()
    z = g("Mul", "x", g.silu("g"))
    view, back, allowzero = _targets(g, spelling, z, "g")
    y = g("Reshape", g.rms(g("Reshape", z, view, allowzero=allowzero)), back, allowzero=allowzero)
    if weight:
        w = np.random.default_rng(3).random(WIDTH).astype(np.float32) + 0.5
        y = g("Mul", g.const(w, np.float32), y)
    g.nodes[-1].output[0] = "y"
    return g.model([("x", dims), ("g", dims)], [("y", dims)])


def _falcon_merged(dims: list, groups: int = 1, back=None) -> onnx.ModelProto:
    """Falcon-H1's mixer with ``norm_before_gate``, as the dynamo exporter's optimizer leaves
    it: the scan output per head ([batch, seq, 8, 32]) viewed straight into [batch, seq,
    groups, 256 / groups] (its ``view(batch, seq, -1)`` merged into the norm's view), the RMS of
    each group times the weight viewed as [groups, 256 / groups], the view back to [batch,
    seq, 256], times silu(gate)."""
    g = _Graph()
    seq = dims[1]
    view = g.const([-1, seq, groups, 256 // groups])
    normed = g.rms(g("Reshape", "h", view, allowzero=1))
    w = np.random.default_rng(4).random((groups, 256 // groups)).astype(np.float32) + 0.5
    scaled = g("Mul", g.const(w, np.float32), normed)
    y = g("Reshape", scaled, g.const(back or [-1, seq, 256]), allowzero=1)
    g("Mul", y, g.silu("gate"))
    g.nodes[-1].output[0] = "y"
    out = [dims[0], seq, 256] if back is None else back
    return g.model([("h", [*dims, 8, 32]), ("gate", out)], [("y", out)])


@pytest.fixture(params=["ort_symbolic", "no_symbolic"])
def symbolic(request, monkeypatch):
    """With ONNX Runtime's symbolic shape inference, and without it, as where it fails: on
    TorchScript's Mamba2 exports onnxruntime 1.32's inference stops at their SplitToSequence
    (it calls ``onnx.helper.make_sequence_value_info``, which onnx 1.23 no longer has)."""
    if request.param == "no_symbolic":
        monkeypatch.setattr(passes, "symbolic_shapes", lambda model: False)
    return request.param


def _gated(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if (n.domain, n.op_type) == (catalogue.DOMAIN, GATED)]


def _attrs(node: onnx.NodeProto) -> dict:
    defaults = catalogue.get(node.op_type).defaults
    return {**defaults, **{a.name: helper.get_attribute_value(a) for a in node.attribute}}


def _feeds(model: onnx.ModelProto, sizes: dict, seed: int = 7) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        shape = [d.dim_value or sizes[d.dim_param] for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = (rng.standard_normal(shape) * 2 + 0.5).astype(np.float32)
    return feeds


def _parity(original, fused, sizes=None) -> None:
    feeds = _feeds(original, sizes or {"batch": 3, "seq": 5, "width": WIDTH})
    checks = verify(original, fused, feeds=feeds)
    assert checks and all(c.ok for c in checks), checks


def _skips(report, prefix: str = GATED) -> list[str]:
    return [
        f"{r.rule}: {s.reason}" for r in report.rules if r.rule.startswith(prefix) for s in r.skips
    ]


# ---------------------------------------------------------------------------------------------
# hand-built graphs

SPELLINGS = ["torchscript", "dynamo", "slice", "gather", "zeros"]


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_dynamic_group_reshapes_are_proved(spelling, symbolic):
    original = _gate_first(spelling)
    fused, report = fuse(original)
    [node] = _gated(fused)
    attrs = _attrs(node)
    assert (attrs["group_size"], attrs["norm_before_gate"], attrs["activation"]) == (GROUP, 0, 0)
    assert list(node.input) == ["x", node.input[1], "g"] and node.input[1]
    assert not _skips(report), str(report)
    assert report[RULE].fused == 1
    _parity(original, fused)


def test_a_dynamic_last_dim_is_split_by_the_view(symbolic):
    """X's last dim not static: the view [*X's leading dims, -1, g] has as many values as X,
    so g divides that dim whatever it is (the reshape would fail otherwise)."""
    dims = ["batch", "seq", "width"]
    original = _gate_first("gather", dims, weight=False)
    fused, report = fuse(original)
    [node] = _gated(fused)
    assert _attrs(node)["group_size"] == GROUP and node.input[2] == "g", str(report)
    _parity(original, fused)
    _parity(original, fused, {"batch": 2, "seq": 3, "width": 3 * GROUP})


def test_dynamic_near_misses(symbolic):
    """What the shapes do not prove stays as it is, with the reason: a view back that swaps
    the batch and sequence dims (the gate before the norm, which a reshaped X would leave
    outside), a view of an X whose last dim is not static that does not keep its leading
    dims."""
    g = _Graph()
    z = g("Mul", "x", g.silu("g"))
    lead = [g.dim(z, 0), g.dim(z, 1)]
    view = g("Concat", *lead, g.const([WIDTH // GROUP, GROUP]), axis=0)
    back = g("Concat", lead[1], lead[0], g.const([WIDTH]), axis=0)
    g("Reshape", g.rms(g("Reshape", z, view)), back)
    g.nodes[-1].output[0] = "y"
    original = g.model([("x", DYNAMIC), ("g", DYNAMIC)], [("y", ["seq", "batch", WIDTH])])
    fused, report = fuse(original)
    assert not _gated(fused)
    assert any(
        "does not restore X's shape" in s and "the reshape gives [seq, batch, 64]" in s
        for s in _skips(report)
    ), str(report)
    _parity(original, fused)

    g = _Graph()
    z = g("Mul", "x", g.silu("g"))
    g("Reshape", g.rms(g("Reshape", z, g.const([-1, GROUP]))), g("Shape", z))
    g.nodes[-1].output[0] = "y"
    dims = ["batch", "seq", "width"]
    original = g.model([("x", dims), ("g", dims)], [("y", dims)])
    fused, report = fuse(original)
    assert not _gated(fused)
    assert any("does not split it into groups of 16" in s for s in _skips(report)), str(report)
    _parity(original, fused)


@pytest.mark.parametrize("batch", [2, "batch"], ids=["static", "dynamic"])
@pytest.mark.parametrize("groups", [1, 2])
def test_grouped_view_merged_with_the_view_before_it(batch, groups, symbolic):
    """Falcon-H1 (norm before the gate): X is the per-head scan output reshaped to the norm's
    output shape, a group the whole row (or half of it), the gate after the norm absorbed."""
    original = _falcon_merged([batch, 6], groups)
    fused, report = fuse(original)
    [node] = _gated(fused)
    attrs = _attrs(node)
    size = 0 if groups == 1 else 256 // groups
    assert (attrs["group_size"], attrs["norm_before_gate"], attrs["activation"]) == (size, 1, 0)
    assert node.input[2] == "gate" and node.input[1], str(report)
    assert not _skips(report), str(report)
    producers = {o: n for n in fused.graph.node for o in n.output}
    reshape = producers[node.input[0]]
    assert (reshape.op_type, reshape.input[0]) == ("Reshape", "h")
    _parity(original, fused, {"batch": 3})


def test_merged_view_whose_groups_span_two_output_rows():
    """The same view of a whole 256-wide row, viewed back as rows of 128: a group would span
    two rows of the output."""
    original = _falcon_merged([2, 6], back=[2, 12, 128])
    fused, report = fuse(original)
    assert not _gated(fused)
    reason = "groups of 256 (the reshape's last dim) do not divide X's last dim 128"
    assert any(reason in s for s in _skips(report, RULE)), str(report)
    _parity(original, fused)


# ---------------------------------------------------------------------------------------------
# the Mamba2 families' tiny models, exported with dynamic batch and sequence dims

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from onnxnorm.testing import hf  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16}
#: the families whose Mamba2 mixer ends in a grouped gated norm (the gate before the norm), and
#: Falcon-H1 (hf.FAMILIES' config: the gate first, in two groups)
MAMBA = ["nemotron_h", "bamba", "granitemoehybrid", "falcon_h1"]
#: Falcon-H1 with one group over its 256-wide SSM output, the norm before the gate, heads of 32
FALCON_ONE_GROUP = {
    "mamba_n_groups": 1,
    "mamba_norm_before_gate": True,
    "mamba_d_ssm": 256,
    "mamba_d_head": 32,
}


class _Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(
            input_ids=input_ids, attention_mask=attention_mask, use_cache=False
        ).logits


def _export(model, exporter: str, dynamic: bool = True) -> onnx.ModelProto:
    """The model on 2 x 6 tokens, exported with dynamic batch and sequence dims (dynamo:
    ``dynamic_shapes``; TorchScript: ``dynamic_axes``), quietly."""
    ids = torch.randint(3, 96, (2, 6), generator=torch.Generator().manual_seed(4))
    args = (ids, torch.ones(2, 6, dtype=torch.int64))
    names = ["input_ids", "attention_mask"]
    with (
        torch.no_grad(),
        warnings.catch_warnings(),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
    ):
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}
            program = torch.onnx.export(
                _Logits(model),
                args,
                input_names=names,
                dynamo=True,
                opset_version=18,
                dynamic_shapes=(dims, dims) if dynamic else None,
            )
            return program.model_proto
        buffer = io.BytesIO()
        axes = {n: {0: "batch", 1: "seq"} for n in names} if dynamic else None
        torch.onnx.export(
            _Logits(model),
            args,
            buffer,
            input_names=names,
            dynamo=False,
            opset_version=17,
            dynamic_axes=axes,
        )
        return onnx.load_from_string(buffer.getvalue())


def _token_feeds(model: onnx.ModelProto) -> dict:
    """Token ids and a mask of 3 sequences of 5 tokens, where the export left those dims
    dynamic (another batch and length than the export's)."""
    value = model.graph.input[0]
    shape = [d.dim_value or (3, 5)[i] for i, d in enumerate(value.type.tensor_type.shape.dim)]
    ids = np.random.default_rng(2).integers(3, 96, shape).astype(np.int64)
    return {"input_ids": ids, "attention_mask": np.ones(shape, np.int64)}


def _group_sizes(model) -> list[int]:
    """The group size of each gated norm module of ``model`` (0: one group over the row)."""
    sizes = []
    for module in model.modules():
        if hf.is_norm(module) and "gate" in module.forward.__code__.co_varnames:
            width = module.weight.numel()
            groups = getattr(module, "n_groups", None)
            size = getattr(module, "group_size", None) or width // (groups or 1)
            sizes.append(0 if size == width else size)
    return sizes


def _check_whole(model, original: onnx.ModelProto) -> None:
    """Every gated norm of ``model`` is one GatedRMSNorm with its gate and group size, no
    gated rule skipped a match, and the fused model matches the original."""
    fused, report = fuse(original)
    nodes = _gated(fused)
    sizes = _group_sizes(model)
    assert len(nodes) == len(sizes), str(report)
    assert all(len(n.input) > 2 and n.input[2] for n in nodes), str(report)
    assert sorted(_attrs(n)["group_size"] for n in nodes) == sorted(sizes), str(report)
    assert not _skips(report), str(report)
    checks = verify(original, fused, feeds=_token_feeds(original))
    assert checks and all(c.ok for c in checks), checks


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("family", MAMBA)
def test_mamba_families_with_dynamic_shapes(family, dtype):
    model = hf.model(hf.config(family, layers=1)).to(DTYPES[dtype])
    _check_whole(model, _export(model, "dynamo"))


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_falcon_h1_one_group_norm_before_gate(dynamic):
    """The configuration whose grouped view the dynamo exporter's optimizer merges with the
    scan output's view per head (at static shapes, and at a sequence length it specializes)."""
    model = hf.model(hf.config("falcon_h1", layers=1, **FALCON_ONE_GROUP))
    _check_whole(model, _export(model, "dynamo", dynamic))


@pytest.mark.slow
def test_torchscript_dynamic_axes_groups_are_proved():
    """TorchScript with dynamic axes: ONNX Runtime's symbolic inference stops on the Mamba2
    mixer, and onnx's names no dim of the scan output; the group reshapes are proved from the
    graph. The gate stays outside where neither inference proves it of X's shape (the report
    says so for its node); ONNX Runtime loads neither the original nor the fused model (their
    Transpose with perm {0, -2, -1, 1}), so no parity here."""
    model = hf.model(hf.config("nemotron_h", layers=1))
    fused, report = fuse(_export(model, "torchscript"))
    assert report[RULE].fused == len(_group_sizes(model)) and not report[RULE].skips
    [node] = _gated(fused)
    assert _attrs(node)["group_size"] == _group_sizes(model)[0]
    gate_first = report["GatedRMSNorm (gate, then norm)"]
    assert gate_first.fused or all("the gate and X" in s.reason for s in gate_first.skips), str(
        report
    )


# ---------------------------------------------------------------------------------------------
# every gated norm class alone, side by side, with dynamic batch and sequence dims


class _GatedSideBySide(torch.nn.Module):
    """Each way to build each gated norm class of the installed transformers
    (hf.norms.hybrid_variants: read from its model modules, no class named here), 64 wide (two
    groups of 32 where the class groups), on inputs x_i and gate_i of its own."""

    def __init__(self, dtype) -> None:
        super().__init__()
        built = []
        for i, variant in enumerate(v for v in hf.norms.hybrid_variants() if v.gated):
            with contextlib.suppress(hf.norms.NotBuildable):
                built.append(hf.norms.build(variant, WIDTH, seed=i + 1).to(dtype))
        self.norms = torch.nn.ModuleList(built)
        self.names = [f"{w}{i}" for i in range(len(built)) for w in ("x", "gate")]

    def forward(self, *inputs):
        return tuple(norm(inputs[2 * i], inputs[2 * i + 1]) for i, norm in enumerate(self.norms))


def _export_side_by_side(exporter: str, dtype: str):
    module = _GatedSideBySide(DTYPES[dtype]).eval()
    generator = torch.Generator().manual_seed(3)
    args = tuple(
        torch.randn(2, 5, WIDTH, generator=generator).to(DTYPES[dtype]) for _ in module.names
    )
    with (
        torch.no_grad(),
        warnings.catch_warnings(),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(io.StringIO()),
    ):
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}
            program = torch.onnx.export(
                module,
                args,
                input_names=module.names,
                dynamo=True,
                opset_version=18,
                dynamic_shapes=(tuple(dims for _ in module.names),),
            )
            return module, program.model_proto
        buffer = io.BytesIO()
        torch.onnx.export(
            module,
            args,
            buffer,
            input_names=module.names,
            dynamo=False,
            opset_version=17,
            dynamic_axes={n: {0: "batch", 1: "seq"} for n in module.names},
        )
        return module, onnx.load_from_string(buffer.getvalue())


_SIDE_BY_SIDE = [
    pytest.param("dynamo", marks=pytest.mark.slow),
    pytest.param("torchscript"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("exporter", _SIDE_BY_SIDE)
def test_gated_norm_classes_with_dynamic_shapes(exporter, dtype, symbolic):
    module, original = _export_side_by_side(exporter, dtype)
    fused, report = fuse(original)
    nodes = _gated(fused)
    assert len(nodes) == len(module.norms) and all(n.input[2] for n in nodes), str(report)
    assert not _skips(report), str(report)
    rng = np.random.default_rng(5)
    feeds = {n: rng.standard_normal((3, 4, WIDTH)).astype(dtype) for n in module.names}
    checks = verify(original, fused, feeds=feeds)
    assert checks and all(c.ok for c in checks), checks
