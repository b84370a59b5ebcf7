"""Two producers of one name: what each holds, and whether the model may keep one of them (two
constants) or is refused (anything else)."""

from __future__ import annotations

from pathlib import Path

from onnx import AttributeProto, TensorProto

from onnxnorm._validate.repairs import DEFAULT_ALIAS, ModelProblem
from onnxnorm._validate.tensors import tensor_bytes


def produced_value(producer, folder: Path | None):
    """What a producer (an initializer, or a Constant node) holds, comparable with ``==``;
    None where it cannot be known here (any other node)."""
    if isinstance(producer, TensorProto):
        return tensor_bytes(producer, folder)
    if (
        producer.op_type != "Constant"
        or producer.domain not in ("", DEFAULT_ALIAS)
        or len(producer.attribute) != 1
    ):
        return None
    attr = producer.attribute[0]
    if attr.ref_attr_name:
        return None
    if attr.type == AttributeProto.TENSOR:
        return tensor_bytes(attr.t, folder)
    copy = AttributeProto()
    copy.CopyFrom(attr)
    return attr.name, copy.SerializeToString()


def duplicate(first, second, folder: Path | None, label: str) -> str:
    """For two producers of one name, the report's words on keeping the second (the one ONNX
    Runtime uses: it takes the last it meets, initializers before Constant nodes); raises
    unless both are constants (an initializer or a Constant node)."""
    a, b = produced_value(first, folder), produced_value(second, folder)
    if is_constant(first) and is_constant(second):
        if a is not None and a == b:
            return "both hold the same value: one kept"
        return (
            "they hold different values: the last one kept, the value ONNX Runtime uses "
            "(other runtimes may take the first)"
        )
    raise ModelProblem(label)


def is_constant(producer) -> bool:
    return isinstance(producer, TensorProto) or (
        producer.op_type == "Constant" and producer.domain in ("", DEFAULT_ALIAS)
    )
