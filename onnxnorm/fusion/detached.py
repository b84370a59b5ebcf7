"""A model's weights kept apart from it while the pass works: the IR is built from a copy of the
model without its large initializers (stand-ins of their name, type and shape that read no
data), the unchanged weights come back by reference beside the fused model, and onnx's version
converter runs on the stand-ins (:func:`upgrade_opset`). This is how a model of many gigabytes is
fused without a copy of its weights in memory (docs/design.md)."""

from __future__ import annotations

import onnx
import onnx_ir as ir

from onnxnorm.errors import first_line


def add_stand_in(graph: onnx.GraphProto, tensor: onnx.TensorProto) -> None:
    """An initializer of ``tensor``'s name, type and shape whose data is nowhere (an external
    reference to no file): what reads the graph sees the weight, nothing reads its bytes."""
    stand_in = graph.initializer.add()
    stand_in.name, stand_in.data_type = tensor.name, tensor.data_type
    stand_in.dims.extend(tensor.dims)
    stand_in.data_location = onnx.TensorProto.EXTERNAL
    entry = stand_in.external_data.add()
    entry.key, entry.value = "location", "onnxnorm-stand-in"


def deserialize_apart(
    model: onnx.ModelProto, base_dir: str | None, repairs=()
) -> tuple[ir.Model, dict[str, onnx.TensorProto]]:
    """The IR of ``model`` built from a copy of everything but its weights (onnx_ir would
    otherwise write into the protos it wraps, e.g. naming a Constant's tensor); the weights,
    initializers of 1 KiB or more and external-data references, are wrapped where they are,
    read only where a rule needs their values. ``repairs`` (``_validate.check_model``'s) are
    made in the copy."""
    from onnx import external_data_helper

    from onnxnorm._io import SMALL_TENSOR, weightless_shell
    from onnxnorm._validate import apply_repairs, dropped_initializers

    shell = weightless_shell(model)
    apply_repairs(shell, list(repairs), main_initializers=False)
    dropped = dropped_initializers(list(repairs))
    originals: dict[str, onnx.TensorProto] = {}
    for index, tensor in enumerate(model.graph.initializer):
        if index in dropped:
            continue
        if tensor.ByteSize() >= SMALL_TENSOR or external_data_helper.uses_external_data(tensor):
            add_stand_in(shell.graph, tensor)
            originals[tensor.name] = tensor
        else:
            shell.graph.initializer.add().CopyFrom(tensor)
    graph = ir.serde.deserialize_model(shell)
    for name, tensor in originals.items():
        graph.graph.initializers[name].const_value = ir.serde.deserialize_tensor(
            tensor, base_dir or ""
        )
    return graph, originals


def serialize_detached(
    model: ir.Model, originals: dict[str, onnx.TensorProto]
) -> tuple[onnx.ModelProto, list[onnx.TensorProto]]:
    """Serializes ``model`` without copying its weights: initializers that still hold one of
    the input's ``originals`` (unchanged weights held inline) are left out of the proto and
    returned, by reference, beside it."""
    detached: list[onnx.TensorProto] = []
    removed = []
    for name, value in list(model.graph.initializers.items()):
        tensor = value.const_value
        if isinstance(tensor, ir.serde.TensorProtoTensor) and originals.get(name) is tensor.raw:
            detached.append(tensor.raw)
            removed.append(value)
            model.graph.initializers.pop(name)
    try:
        proto = ir.serde.serialize_model(model)
    finally:
        for value in removed:
            model.graph.register_initializer(value)
    return proto, detached


def upgrade_opset(
    model: onnx.ModelProto, weights: list[onnx.TensorProto]
) -> tuple[onnx.ModelProto, str]:
    """``model`` converted by onnx's version converter to the oldest standard opset at which
    every onnxnorm node has a function body (bfloat16 needs 13, a quantizer 10 or 11, float8
    19: ``functions.body_problem``), and the report's line on it; ``model`` and "" where no
    node needs it. ``weights``: the model's initializers kept apart from it, which the
    converter sees as stand-ins without data (no weight is read) and which keep their names.
    Where the converter fails, the model is kept as it is and the line says why."""
    from onnxnorm.ops import functions

    opset = functions.model_opset(model)
    nodes = list(functions.onnxnorm_nodes(model))
    if opset is None or not nodes:
        return model, ""
    types = functions.node_types(model, nodes, opset, weights, all_x=True)[0]
    if all(functions.node_problem(n, opset, types) is None for n in nodes):
        return model, ""
    newest = onnx.defs.onnx_opset_version()
    target = next(
        (
            v
            for v in range(opset + 1, newest + 1)
            if all(functions.node_problem(n, v, types) is None for n in nodes)
        ),
        None,
    )
    if target is None:
        return model, (
            f"no opset up to {newest} gives every onnxnorm node a body; the model keeps its opset"
        )
    shell = onnx.ModelProto()
    shell.CopyFrom(model)
    names = {t.name for t in weights}
    for tensor in weights:
        add_stand_in(shell.graph, tensor)
    try:
        from onnx import version_converter

        converted = version_converter.convert_version(shell, target)
    except Exception as error:  # noqa: BLE001 - the converter's own words go in the report
        return model, (
            f"onnx's version converter could not take the model "
            f"from opset {opset} to {target} ({first_line(error)}); the model keeps "
            "its opset"
        )
    kept = [t for t in converted.graph.initializer if t.name not in names]
    del converted.graph.initializer[:]
    converted.graph.initializer.extend(kept)
    return converted, (
        f"ONNX opset {opset} -> {target} (onnx's version converter), the oldest "
        "where every onnxnorm node has a function body"
    )
