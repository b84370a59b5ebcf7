"""OpenVINO reads onnxnorm's ops: a conversion extension for its ONNX frontend.

    import openvino as ov
    from onnxnorm.deploy import openvino as onnxnorm_openvino

    core = onnxnorm_openvino.add_to(ov.Core())   # or: core.add_extension(extensions())
    model = core.read_model("model.onnx")        # any onnxnorm file: function, fused, ...
    compiled = core.compile_model(model, "CPU")

    model = onnxnorm_openvino.read_model("model.onnx")   # the same, in one call
    ov.save_model(model, "model.xml", compress_to_fp16=False)   # an IR read without onnxnorm

Why: OpenVINO's ONNX frontend does not run a node's model-local function body; it converts
each node by a rule of its own, and has none for the ``onnxnorm`` domain, so it refuses every
onnxnorm file (``OpConversionFailure ... No conversion rule found for operations:
onnxnorm.RMSNorm``), with the bodies or without them.

How: an onnxnorm node becomes what ``onnxnorm lower --for openvino`` writes for it
(:func:`onnxnorm.fusion.lowering.lower_with_notes` with ``runtime="openvino"``, at opset 23
whatever the model's own opset): ONNX's RMSNormalization and LayerNormalization with the
catalogue's own float32 arithmetic around them where they alone would round otherwise, the
residual add, the QuantizeLinear or DynamicQuantizeLinear of a quantized op, and the function
body of GatedRMSNorm and L2Norm, which OpenVINO has no layer of. The node alone is written as a
one-node ONNX model (its inputs of the element types and ranks the frontend gives, every dim
symbolic), lowered, read by OpenVINO's own ONNX frontend, and that graph is spliced in place of
the node. So each op is converted by the frontend's own translations of the standard ops, which
OpenVINO's CPU plugin compiles to its RMS and MVN layers (GatedRMSNorm's body to RMS too). What
a node is converted to depends on its op, attributes, input types and ranks only: it is lowered
and read once per such kind, and copied for each node.

Exactness, measured with openvino 2026.4 on its CPU device (tests/deploy/): float32 within
float32 rounding of the reference, a quantized Y as the reference quantizes the Y_float
computed; float16 and bfloat16 norms without a residual in rounding order B
(``cast_before_scale = 0``) bit for bit what ONNX Runtime computes of the same lowered graph.
The CPU plugin computes a float16 or bfloat16 graph in float32 and so drops the roundings to
X's type between steps: order A, the Sum a residual op normalizes and the value a quantizer
takes are then up to one unit in the last place (one quantization step) away.
OpenVINO's DynamicQuantizeLinear gives scale 0 for an all-zero tensor, where the op gives 1
(its Y and zero point agree: 0).

Nothing of OpenVINO is imported until a function here is called; without it they raise
:class:`~onnxnorm.errors.MissingDependency`.
"""

from __future__ import annotations

import importlib
import itertools
import os
import threading
from types import ModuleType
from typing import Any

import onnx
from onnx import TensorProto, helper

from onnxnorm import _deps
from onnxnorm.errors import MissingDependency, OnnxNormError
from onnxnorm.ops import catalogue

__all__ = ["OPSET", "add_to", "extensions", "read_model"]

#: the standard opset a node is lowered in: the first with RMSNormalization
OPSET = 23

#: OpenVINO's element type (its name) -> ONNX's: the types of the catalogue's inputs
_ELEMENT_TYPES = {
    "f32": TensorProto.FLOAT,
    "f16": TensorProto.FLOAT16,
    "bf16": TensorProto.BFLOAT16,
    "u8": TensorProto.UINT8,
    "i8": TensorProto.INT8,
    "f8e4m3": TensorProto.FLOAT8E4M3FN,  # OpenVINO's f8e4m3 is e4m3fn (max 448, no Inf)
    "i64": TensorProto.INT64,  # a rotary op's PositionIds
}

_INSTALL = "pip install openvino"


def _openvino() -> ModuleType:
    """The openvino package, or MissingDependency."""
    if not _deps.available("openvino"):
        raise MissingDependency(
            f"reading onnxnorm models with OpenVINO needs openvino, which is not installed: "
            f"{_INSTALL}",
            name="openvino",
        )
    return importlib.import_module("openvino")


def extensions() -> list[Any]:
    """One ``openvino.frontend.onnx.ConversionExtension`` per catalogue op, for
    ``openvino.Core.add_extension`` (which takes the list) or a frontend's ``add_extension``."""
    _openvino()
    frontend = importlib.import_module("openvino.frontend.onnx")
    return [
        frontend.ConversionExtension(name, catalogue.DOMAIN, _converter(name))
        for name in catalogue.ALL_OPS
    ]


def add_to(core: Any) -> Any:
    """``core`` (an ``openvino.Core``) with onnxnorm's extensions added: its ``read_model``
    then reads onnxnorm files. Returns ``core``."""
    core.add_extension(extensions())
    return core


def read_model(model: str | os.PathLike | bytes | onnx.ModelProto, core: Any | None = None) -> Any:
    """``model`` (a path, the bytes of an ONNX file, or a ModelProto) read by OpenVINO with
    onnxnorm's extensions: an ``openvino.Model``. ``core``: the ``openvino.Core`` to read it
    with (its extensions added to it; default a new one).

        compiled = openvino.Core().compile_model(read_model("model.onnx"), "CPU")
    """
    ov = _openvino()
    core = add_to(core if core is not None else ov.Core())
    if isinstance(model, onnx.ModelProto):
        return core.read_model(model.SerializeToString(), b"")
    if isinstance(model, bytes):
        return core.read_model(model, b"")
    return core.read_model(os.fspath(model))


# -- converting one node ---------------------------------------------------------------------

#: (op, attributes, inputs' (type, rank)) -> the openvino.Model of its lowered form
_converted: dict[tuple, Any] = {}
_lock = threading.Lock()
_private: list[Any] = []  # the Core that reads the lowered forms, made on first use
_count = itertools.count()  # numbers the converted nodes: their layers' names stay unique


def _converter(op: str):
    """The frontend's conversion function of ``op``: NodeContext -> the outputs, in the op's
    order (those the node does not have are ignored by the frontend)."""
    spec = catalogue.get(op)

    def convert(context: Any) -> list[Any]:
        inputs = _inputs(spec, context)
        attributes = _attributes(spec, context)
        key = (
            op,
            tuple(sorted(attributes.items())),
            tuple(None if i is None else i[1:] for i in inputs),
        )
        with _lock:
            lowered = _converted.get(key)
            if lowered is None:
                lowered = _converted[key] = _read(_lowered(spec, inputs, attributes))
            sub = lowered.clone()
        given = {p.name: i[0] for p, i in zip(spec.inputs, inputs, strict=True) if i is not None}
        return _splice(sub, spec, given, f"{catalogue.DOMAIN}.{op}_{next(_count)}/")

    return convert


def _splice(sub: Any, spec: catalogue.OpSpec, given: dict[str, Any], prefix: str) -> list[Any]:
    """The outputs of ``sub`` (a lowered node, read) in ``spec``'s order, its Parameters
    replaced by the frontend's values ``given`` (by input name): its nodes become part of the
    model being read. Its layers' names start with ``prefix``; its values have no tensor names
    (the frontend gives the outputs the node's)."""
    results = {n: r for r in sub.get_results() for n in r.input_value(0).get_names()}
    for node in sub.get_ordered_ops():  # (before the splice: then it would reach the model's)
        for port in node.outputs():
            port.get_tensor().set_names(set())
        if node.get_type_name() not in ("Parameter", "Result"):
            node.set_friendly_name(prefix + node.get_friendly_name())
    # by name: the frontend leaves out an input that nothing uses (a float8 zero point, whose
    # type alone counts)
    for parameter in sub.get_parameters():
        parameter.output(0).replace(given[parameter.get_friendly_name()])
    return [
        results[f"{p.name}_out"].input_value(0)
        for p in spec.outputs
        if f"{p.name}_out" in results  # (a rotary node of Q alone has no KOut)
    ]


def _inputs(spec: catalogue.OpSpec, context: Any) -> list[tuple[Any, int, int | None] | None]:
    """Per input of the op: (the frontend's value, its ONNX element type, its rank, None for
    a dynamic rank), None where the node has not got it."""
    count = context.get_input_size()
    if count > len(spec.inputs):
        raise OnnxNormError(f"{spec.name} takes at most {len(spec.inputs)} inputs, got {count}")
    found: list[tuple[Any, int, int | None] | None] = []
    for index, param in enumerate(spec.inputs):
        value = context.get_input(index) if index < count else None
        if value is None or value.get_node().get_type_name() == "NullNode":
            if not param.optional:
                raise OnnxNormError(f"{spec.name}: input {param.name} is required")
            found.append(None)
            continue
        element = value.get_element_type().get_type_name()
        if element not in _ELEMENT_TYPES:
            raise OnnxNormError(
                f"{spec.name}: input {param.name} is of OpenVINO element type {element}, "
                f"not one of {', '.join(_ELEMENT_TYPES)}"
            )
        rank = value.get_partial_shape().rank
        found.append(
            (value, _ELEMENT_TYPES[element], rank.get_length() if rank.is_static else None)
        )
    return found


def _attributes(spec: catalogue.OpSpec, context: Any) -> dict[str, int | float]:
    """The node's attributes of the catalogue (those it sets), checked."""
    found: dict[str, int | float] = {}
    for attribute in spec.attributes:
        if not context.has_attribute(attribute.name):
            continue
        raw = context.get_attribute(attribute.name)
        value = float(raw) if attribute.kind == "float" else int(raw)
        problem = attribute.validate(value)
        if problem:
            raise OnnxNormError(f"{spec.name}: attribute {attribute.name} {problem}")
        found[attribute.name] = value
    return found


def _lowered(
    spec: catalogue.OpSpec,
    inputs: list[tuple[Any, int, int | None] | None],
    attributes: dict[str, int | float],
) -> onnx.ModelProto:
    """One node of ``spec`` with these inputs' types and ranks (every dim symbolic) and
    ``attributes``, lowered for OpenVINO at :data:`OPSET`."""
    from onnxnorm.fusion import lowering

    names, declared = [], []
    for param, given in zip(spec.inputs, inputs, strict=True):
        if given is None:
            names.append("")
            continue
        _, element, rank = given
        dims = None if rank is None else [f"{param.name}_{d}" for d in range(rank)]
        names.append(param.name)
        declared.append(helper.make_tensor_value_info(param.name, element, dims))
    while names and not names[-1]:
        names.pop()
    # a rotary node of Q alone has QOut alone
    order = [p.name for p in spec.inputs]
    alone = spec.rotary and inputs[order.index("K")] is None
    outputs = [f"{p.name}_out" for p in spec.outputs if not (alone and p.name == "KOut")]
    node = helper.make_node(spec.name, names, outputs, name=spec.name, domain=catalogue.DOMAIN)
    node.attribute.extend(helper.make_attribute(k, v) for k, v in sorted(attributes.items()))
    graph = helper.make_graph(
        [node],
        spec.name,
        declared,
        [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs],
    )
    model = helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid("", OPSET),
            helper.make_opsetid(catalogue.DOMAIN, catalogue.VERSION),
        ],
    )
    lowered, notes = lowering.lower_with_notes(model, runtime="openvino")
    left = [n for n in lowered.graph.node if n.domain == catalogue.DOMAIN]
    if left:
        why = "; ".join(f"{n.emitted}: {n.reason}" for n in notes)
        raise OnnxNormError(f"{spec.name} is not lowered for OpenVINO ({why})")
    return lowered


def _read(model: onnx.ModelProto) -> Any:
    """``model`` read by a Core of this module's own (without the extensions)."""
    if not _private:
        _private.append(_openvino().Core())
    return _private[0].read_model(model.SerializeToString(), b"")
