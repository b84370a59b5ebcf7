"""ONNX files as they exist outside this year's exporters, built by hand with ``onnx.helper``:
BERT-, GPT-2- and T5-style graphs at the opsets older exporters and tf2onnx wrote (7 to 14),
graphs without value_info, weights fed through Identity, inputs wrapped in Casts, residual sums
that are also graph outputs, one input feeding two norms, and sloppy but loadable metadata.

Used by tests/fusion/test_wild_models.py: every model here loads and runs in ONNX Runtime, and
``onnxnorm fuse`` must fuse its norms for every target, write a model that loads, and match the
original. Weights are random (seeded), so every norm's Scale and Bias matter.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HIDDEN = 16
FLOAT, FLOAT16 = TensorProto.FLOAT, TensorProto.FLOAT16


class Graph:
    """Collects nodes and initializers; each op call adds a node and returns its output."""

    def __init__(self, opset: int, seed: int = 0):
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.rng = np.random.default_rng(seed)
        self.count = 0

    def __call__(self, op: str, *inputs: str, domain: str = "", **attrs) -> str:
        self.count += 1
        out = f"{op.lower()}_{self.count}"
        self.nodes.append(
            helper.make_node(
                op, list(inputs), [out], name=f"{op}_{self.count}", domain=domain, **attrs
            )
        )
        return out

    def weight(
        self, name: str, shape, scale: float = 1.0, offset: float = 0.0, dtype=np.float32
    ) -> str:
        value = (self.rng.standard_normal(shape) * scale + offset).astype(dtype)
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def scalar(self, name: str, value: float, dtype=np.float32) -> str:
        if not any(t.name == name for t in self.inits):
            self.inits.append(numpy_helper.from_array(np.array(value, dtype), name))
        return name

    def reduce_mean(self, x: str) -> str:
        """Mean over the last axis, kept: ``axes`` an attribute before opset 18, an input since."""
        if self.opset >= 18:
            axes = "axes_last"
            if not any(t.name == axes for t in self.inits):
                self.inits.append(numpy_helper.from_array(np.array([-1], np.int64), axes))
            return self("ReduceMean", x, axes, keepdims=1)
        return self("ReduceMean", x, axes=[-1], keepdims=1)

    def matmul(self, x: str, name: str, bias: bool = True) -> str:
        y = self("MatMul", x, self.weight(f"{name}.weight", (HIDDEN, HIDDEN), 0.25))
        return self("Add", y, self.weight(f"{name}.bias", (HIDDEN,), 0.1)) if bias else y

    def layer_norm(
        self,
        x: str,
        name: str,
        eps: float = 1e-12,
        square: str = "pow",
        scale: str | None = None,
        bias: str | None = None,
    ) -> str:
        """The decomposed LayerNorm of PyTorch's older exporters (BERT, GPT-2):
        ReduceMean, Sub, Pow (or Mul), ReduceMean, Add, Sqrt, Div, Mul, Add."""
        mean = self.reduce_mean(x)
        centred = self("Sub", x, mean)
        squared = (
            self("Pow", centred, self.scalar("two", 2.0))
            if square == "pow"
            else self("Mul", centred, centred)
        )
        std = self("Sqrt", self("Add", self.reduce_mean(squared), self.scalar(f"eps{eps}", eps)))
        normalized = self("Div", centred, std)
        scale = scale or self.weight(f"{name}.weight", (HIDDEN,), 0.3, 1.0)
        bias = bias or self.weight(f"{name}.bias", (HIDDEN,), 0.1)
        return self("Add", self("Mul", normalized, scale), bias)

    def rms_norm(self, x: str, name: str, eps: float = 1e-6) -> str:
        """T5's LayerNorm as TorchScript wrote it: Pow, ReduceMean, Add, Sqrt, Reciprocal,
        Mul, then the weight times it."""
        variance = self.reduce_mean(self("Pow", x, self.scalar("two", 2.0)))
        inv = self("Reciprocal", self("Sqrt", self("Add", variance, self.scalar(f"eps{eps}", eps))))
        return self("Mul", self.weight(f"{name}.weight", (HIDDEN,), 0.3, 1.0), self("Mul", x, inv))

    def model(
        self,
        inputs: list[tuple[str, int]],
        outputs: list[tuple[str, int]],
        value_info: bool = True,
        name: str = "wild",
    ) -> onnx.ModelProto:
        dims = ["batch", "sequence", HIDDEN]
        graph = helper.make_graph(
            self.nodes,
            name,
            [helper.make_tensor_value_info(n, t, dims) for n, t in inputs],
            [helper.make_tensor_value_info(n, t, dims if value_info else None) for n, t in outputs],
            self.inits,
        )
        # the IR version the opset came with, as the exporters of its day wrote it
        ir_version = {7: 3, 8: 3, 9: 4, 10: 5, 11: 6, 12: 7, 13: 7, 14: 7}.get(self.opset, 8)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", self.opset)],
            ir_version=ir_version,
            producer_name="hand-built",
        )
        if value_info:
            model = onnx.shape_inference.infer_shapes(model)
        return model


def bert(opset: int, layers: int = 2, value_info: bool = True) -> onnx.ModelProto:
    """Post-norm encoder: embeddings LayerNorm, then per layer the dense output plus its bias
    added to the residual and normalized (BERT's SelfOutput / Output)."""
    g = Graph(opset)
    h = g.layer_norm(g("Add", "x", "position"), "embeddings.LayerNorm", square="mul")
    for i in range(layers):
        attn = g.matmul(h, f"layer{i}.attention.dense")
        h = g.layer_norm(g("Add", attn, h), f"layer{i}.attention.LayerNorm")
        ffn = g.matmul(g("Relu", g.matmul(h, f"layer{i}.intermediate")), f"layer{i}.output")
        h = g.layer_norm(g("Add", ffn, h), f"layer{i}.output.LayerNorm")
    g.nodes.append(helper.make_node("Identity", [h], ["y"]))
    return g.model([("x", FLOAT), ("position", FLOAT)], [("y", FLOAT)], value_info)


def gpt2(opset: int, layers: int = 2, value_info: bool = True) -> onnx.ModelProto:
    """Pre-norm decoder: ln_1, attention, residual add, ln_2, MLP, residual add; ln_f. Each
    residual sum is read by the next norm and by the next residual add (a Skip op's Sum)."""
    g = Graph(opset, seed=1)
    h = "x"
    for i in range(layers):
        attn = g.matmul(g.layer_norm(h, f"h{i}.ln_1", eps=1e-5), f"h{i}.attn.c_proj")
        h = g("Add", h, attn)
        mlp = g.matmul(
            g("Tanh", g.matmul(g.layer_norm(h, f"h{i}.ln_2", eps=1e-5), f"h{i}.mlp.c_fc")),
            f"h{i}.mlp.c_proj",
        )
        h = g("Add", h, mlp)
    g.nodes.append(helper.make_node("Identity", [g.layer_norm(h, "ln_f", eps=1e-5)], ["y"]))
    return g.model([("x", FLOAT)], [("y", FLOAT)], value_info)


def t5(opset: int, layers: int = 2, value_info: bool = True) -> onnx.ModelProto:
    """T5's pre-norm encoder: RMS norms (no mean, no bias) around bias-free projections."""
    g = Graph(opset, seed=2)
    h = "x"
    for i in range(layers):
        h = g(
            "Add",
            h,
            g.matmul(g.rms_norm(h, f"block{i}.layer0.layer_norm"), f"block{i}.o", bias=False),
        )
        h = g(
            "Add",
            h,
            g.matmul(
                g(
                    "Relu",
                    g.matmul(
                        g.rms_norm(h, f"block{i}.layer1.layer_norm"), f"block{i}.wi", bias=False
                    ),
                ),
                f"block{i}.wo",
                bias=False,
            ),
        )
    g.nodes.append(helper.make_node("Identity", [g.rms_norm(h, "final_layer_norm")], ["y"]))
    return g.model([("x", FLOAT)], [("y", FLOAT)], value_info)


def identity_weights(opset: int) -> onnx.ModelProto:
    """A LayerNorm whose weight and bias reach it through Identity nodes (older exporters wrote
    them for shared and renamed parameters)."""
    g = Graph(opset, seed=3)
    scale = g("Identity", g.weight("ln.weight", (HIDDEN,), 0.3, 1.0))
    bias = g("Identity", g.weight("ln.bias", (HIDDEN,), 0.1))
    g.nodes.append(
        helper.make_node("Identity", [g.layer_norm("x", "ln", scale=scale, bias=bias)], ["y"])
    )
    return g.model([("x", FLOAT)], [("y", FLOAT)])


def cast_wrapped(opset: int) -> onnx.ModelProto:
    """A float16 graph whose norm runs in float32 between Casts, the residual add in float16
    before the Cast (float16 BERT conversions)."""
    g = Graph(opset, seed=4)
    total = g("Add", "x", "r")
    normed = g.layer_norm(g("Cast", total, to=FLOAT), "ln", eps=1e-5)
    g.nodes.append(helper.make_node("Cast", [normed], ["y"], to=FLOAT16))
    g.nodes.append(helper.make_node("Identity", [total], ["s"]))
    return g.model([("x", FLOAT16), ("r", FLOAT16)], [("y", FLOAT16), ("s", FLOAT16)])


def sum_is_output(opset: int) -> onnx.ModelProto:
    """A residual sum that is a graph output itself, normalized: the Skip op's Sum is that
    output."""
    g = Graph(opset, seed=5)
    g.nodes.append(helper.make_node("Add", ["x", "r"], ["s"], name="residual"))
    g.nodes.append(helper.make_node("Identity", [g.layer_norm("s", "ln")], ["y"]))
    return g.model([("x", FLOAT), ("r", FLOAT)], [("y", FLOAT), ("s", FLOAT)])


def shared_input(opset: int) -> onnx.ModelProto:
    """One input normalized twice with different weights (a pre-norm block's two branches)."""
    g = Graph(opset, seed=6)
    g.nodes.append(helper.make_node("Identity", [g.layer_norm("x", "ln_a")], ["a"]))
    g.nodes.append(helper.make_node("Identity", [g.rms_norm("x", "ln_b")], ["b"]))
    return g.model([("x", FLOAT)], [("a", FLOAT), ("b", FLOAT)])


def inlined_layer_norms(opset: int = 18) -> onnx.ModelProto:
    """Two LayerNormalization nodes expanded into ONNX's own function body by onnx's inliner
    (``inline_schema_functions``, as tools that inline functions write them): the first gives
    its Mean and InvStdDev (the mean a graph output, both read by a Mul, as a training graph or
    an analysis tool reads them), the second only Y (the body writes its statistics all the
    same, unused)."""
    from onnx.inliner import inline_selected_functions

    g = Graph(opset, seed=8)
    weights = []
    for name in ("ln_a", "ln_b"):
        weights += [
            g.weight(f"{name}.weight", (HIDDEN,), 0.3, 1.0),
            g.weight(f"{name}.bias", (HIDDEN,), 0.1),
        ]
    g.nodes.append(
        helper.make_node(
            "LayerNormalization",
            ["x", *weights[:2]],
            ["a", "a_mean", "a_inv_std"],
            name="ln_a",
            epsilon=1e-5,
        )
    )
    h = g.matmul("a", "dense")
    g.nodes.append(
        helper.make_node("LayerNormalization", [h, *weights[2:]], ["y"], name="ln_b", epsilon=1e-5)
    )
    g.nodes.append(helper.make_node("Mul", ["a_mean", "a_inv_std"], ["spread"], name="spread"))
    dims: list = ["batch", "sequence", HIDDEN]
    stats: list = ["batch", "sequence", 1]
    graph = helper.make_graph(
        g.nodes,
        "inlined",
        [helper.make_tensor_value_info("x", FLOAT, dims)],
        [
            helper.make_tensor_value_info("y", FLOAT, dims),
            helper.make_tensor_value_info("a_mean", FLOAT, stats),
            helper.make_tensor_value_info("spread", FLOAT, stats),
        ],
        g.inits,
        # (the inliner wants the type of every input of the functions it expands)
        value_info=[helper.make_tensor_value_info(w, FLOAT, [HIDDEN]) for w in weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model = inline_selected_functions(
        model, [("", "LayerNormalization")], inline_schema_functions=True
    )
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


@dataclasses.dataclass(frozen=True)
class Wild:
    name: str
    build: Callable[[], onnx.ModelProto]
    #: onnxnorm op type -> how many the function / fused target holds after fusion
    expect: dict[str, int]


def corpus() -> list[Wild]:
    """The hand-built corpus, each family at the opsets its exporters wrote."""
    entries = []
    for opset in (10, 11, 12, 13, 14):
        entries += [
            Wild(f"bert_opset{opset}", lambda o=opset: bert(o), {"SkipLayerNorm": 5}),
            Wild(
                f"gpt2_opset{opset}", lambda o=opset: gpt2(o), {"LayerNorm": 1, "SkipLayerNorm": 4}
            ),
            Wild(f"t5_opset{opset}", lambda o=opset: t5(o), {"RMSNorm": 1, "SkipRMSNorm": 4}),
        ]
    entries += [
        Wild("bert_opset7", lambda: bert(7), {"SkipLayerNorm": 5}),
        Wild(
            "bert_no_value_info_opset11", lambda: bert(11, value_info=False), {"SkipLayerNorm": 5}
        ),
        Wild(
            "gpt2_no_value_info_opset13",
            lambda: gpt2(13, value_info=False),
            {"LayerNorm": 1, "SkipLayerNorm": 4},
        ),
        Wild(
            "t5_no_value_info_opset12",
            lambda: t5(12, value_info=False),
            {"RMSNorm": 1, "SkipRMSNorm": 4},
        ),
        Wild("identity_weights_opset11", lambda: identity_weights(11), {"LayerNorm": 1}),
        Wild("cast_wrapped_float16_opset13", lambda: cast_wrapped(13), {"SkipLayerNorm": 1}),
        Wild("sum_is_output_opset12", lambda: sum_is_output(12), {"SkipLayerNorm": 1}),
        Wild("shared_input_opset11", lambda: shared_input(11), {"LayerNorm": 1, "RMSNorm": 1}),
        Wild("bert_opset18", lambda: bert(18), {"SkipLayerNorm": 5}),
        # the norm whose statistics are read becomes the standard LayerNormalization
        Wild("inlined_layer_norms_opset18", inlined_layer_norms, {"LayerNorm": 1}),
    ]
    return entries


def _with(model: onnx.ModelProto, change: Callable[[onnx.ModelProto], None]) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    change(copy)
    return copy


def _alias_default(model: onnx.ModelProto) -> None:
    model.opset_import[0].domain = "ai.onnx"


def _nodes_in_alias(model: onnx.ModelProto) -> None:
    for node in model.graph.node:
        node.domain = "ai.onnx"


def _gelu_unimported(model: onnx.ModelProto) -> None:
    """A com.microsoft Gelu after the norm, its domain not imported."""
    out = model.graph.output[0].name
    model.graph.node[-1].output[0] = "pre_gelu"
    model.graph.node.append(
        helper.make_node("Gelu", ["pre_gelu"], [out], name="gelu", domain="com.microsoft")
    )


def _only_microsoft_imported(model: onnx.ModelProto) -> None:
    """The default domain not imported, only com.microsoft (as models of ONNX Runtime's own
    optimizer tests are written), with a com.microsoft Gelu after the last node: ONNX Runtime
    reads the default domain at its newest ONNX opset."""
    del model.opset_import[:]
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    _gelu_unimported(model)


def _constants_twice(model: onnx.ModelProto, second: float) -> None:
    """The epsilon initializer turned into two Constant nodes of one name (the second holding
    ``second``): ONNX Runtime loads it and takes the last."""
    init = next(t for t in model.graph.initializer if t.name.startswith("eps"))
    value = float(numpy_helper.to_array(init))
    model.graph.initializer.remove(init)
    for v in (second, value):  # inserted in front: ``value`` first, ``second`` after it
        model.graph.node.insert(
            0,
            helper.make_node(
                "Constant", [], [init.name], value=numpy_helper.from_array(np.array(v, np.float32))
            ),
        )


def _initializers_twice(model: onnx.ModelProto, scale: float) -> None:
    """The first norm's weight declared twice, the second copy times ``scale``."""
    weight = next(t for t in model.graph.initializer if t.name.endswith(".weight"))
    model.graph.initializer.append(
        numpy_helper.from_array(numpy_helper.to_array(weight) * np.float32(scale), weight.name)
    )


def _constant_over_initializer(model: onnx.ModelProto) -> None:
    """A Constant node producing the name of an initializer, with its value."""
    weight = next(t for t in model.graph.initializer if t.name.endswith(".bias"))
    model.graph.node.insert(0, helper.make_node("Constant", [], [weight.name], value=weight))


def _epsilon(model: onnx.ModelProto, value: float) -> None:
    for tensor in model.graph.initializer:
        if tensor.name.startswith("eps"):
            tensor.CopyFrom(numpy_helper.from_array(np.array(value, np.float32), tensor.name))


def _standard_epsilon(value: float) -> onnx.ModelProto:
    g = Graph(17, seed=7)
    scale, bias = g.weight("ln.weight", (HIDDEN,), 0.3, 1.0), g.weight("ln.bias", (HIDDEN,), 0.1)
    g.nodes.append(
        helper.make_node("LayerNormalization", ["x", scale, bias], ["y"], name="ln", epsilon=value)
    )
    return g.model([("x", FLOAT)], [("y", FLOAT)])


@dataclasses.dataclass(frozen=True)
class Sloppy:
    name: str
    build: Callable[[], onnx.ModelProto]
    #: a fragment of the report's line on what was mended, or on why a norm stays as it is
    report: str
    #: onnxnorm ops after fusion (function / fused targets)
    expect: dict[str, int]


def sloppy() -> list[Sloppy]:
    """Models with faults that ONNX Runtime loads and runs regardless: the pass mends each in
    its output and says so, or leaves the norm it cannot fuse as it is, with the reason."""
    return [
        Sloppy(
            "default domain named ai.onnx",
            lambda: _with(gpt2(13), _alias_default),
            "the default domain is imported as 'ai.onnx': read as ''",
            {"LayerNorm": 1, "SkipLayerNorm": 4},
        ),
        Sloppy(
            "default domain named ai.onnx, no value_info",
            lambda: _with(gpt2(11, value_info=False), _alias_default),
            "the default domain is imported as 'ai.onnx'",
            {"LayerNorm": 1, "SkipLayerNorm": 4},
        ),
        Sloppy(
            "nodes in domain ai.onnx",
            lambda: _with(t5(13), _nodes_in_alias),
            "",
            {"RMSNorm": 1, "SkipRMSNorm": 4},
        ),
        Sloppy(
            "com.microsoft node, domain not imported",
            lambda: _with(t5(13), _gelu_unimported),
            "domain 'com.microsoft' is used by node 'gelu' (com.microsoft::Gelu) but not "
            "imported: imported at version 1, as ONNX Runtime assumes",
            {"RMSNorm": 1, "SkipRMSNorm": 4},
        ),
        Sloppy(
            "only com.microsoft imported",
            lambda: _with(t5(18), _only_microsoft_imported),
            "the default ONNX domain is used by node ",
            {"RMSNorm": 1, "SkipRMSNorm": 4},
        ),
        Sloppy(
            "two Constants, same value",
            lambda: _with(gpt2(13), lambda m: _constants_twice(m, 1e-5)),
            "both hold the same value: one kept",
            {"LayerNorm": 1, "SkipLayerNorm": 4},
        ),
        Sloppy(
            "two Constants, different values",
            lambda: _with(gpt2(13), lambda m: _constants_twice(m, 1e-3)),
            "they hold different values: the last one kept, the value ONNX Runtime uses",
            {"LayerNorm": 1, "SkipLayerNorm": 4},
        ),
        Sloppy(
            "two initializers, same value",
            lambda: _with(bert(12), lambda m: _initializers_twice(m, 1.0)),
            "two initializers are named 'embeddings.LayerNorm.weight'; both hold the same "
            "value: one kept",
            {"SkipLayerNorm": 5},
        ),
        Sloppy(
            "two initializers, different values",
            lambda: _with(bert(12), lambda m: _initializers_twice(m, 2.0)),
            "they hold different values: the last one kept",
            {"SkipLayerNorm": 5},
        ),
        Sloppy(
            "a Constant over an initializer",
            lambda: _with(bert(12), _constant_over_initializer),
            "is an initializer and also produced by node #0 (Constant); both hold the same "
            "value: one kept",
            {"SkipLayerNorm": 5},
        ),
        Sloppy(
            "decomposed norm, epsilon negative",
            lambda: _with(t5(11), lambda m: _epsilon(m, -1e-6)),
            "epsilon must be a finite number >= 0, got -",
            {},
        ),
        Sloppy(
            "LayerNormalization, epsilon NaN",
            lambda: _standard_epsilon(float("nan")),
            "epsilon must be a finite number >= 0, got nan",
            {},
        ),
    ]
