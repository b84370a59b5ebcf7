"""The attributes of norm ops in range: ONNX's and ONNX Runtime's norms (the kind of epsilon,
the axis inside the input's rank) and onnxnorm's ops (by the catalogue's rules, as the native
library checks them)."""

from __future__ import annotations

from typing import Any

import onnx
from onnx import AttributeProto

from onnxnorm._validate.repairs import ModelProblem

_EPSILON = {
    ("", op)
    for op in (
        "LayerNormalization",
        "RMSNormalization",
        "BatchNormalization",
        "InstanceNormalization",
        "GroupNormalization",
    )
} | {
    ("com.microsoft", op)
    for op in (
        "LayerNormalization",
        "SimplifiedLayerNormalization",
        "SkipLayerNormalization",
        "SkipSimplifiedLayerNormalization",
    )
}

_AXIS = {
    ("", "LayerNormalization"),
    ("", "RMSNormalization"),
    ("com.microsoft", "LayerNormalization"),
    ("com.microsoft", "SimplifiedLayerNormalization"),
}

_KIND = {"int": AttributeProto.INT, "float": AttributeProto.FLOAT}

_ONNXNORM = "onnxnorm"  # catalogue.DOMAIN, without importing the catalogue for every model


def _any_value(value: Any) -> str | None:
    """No problem with any value (where the kind alone is checked)."""
    return None


def check_attributes(node: onnx.NodeProto, domain: str, label: str, ranks: dict[str, int]) -> None:
    from onnxnorm.ops import catalogue

    attrs = {a.name: a for a in node.attribute}
    if domain == catalogue.DOMAIN:
        if node.op_type not in catalogue.OPS:
            raise ModelProblem(
                f"{label}: not an op of the onnxnorm domain ({', '.join(catalogue.OPS)})"
            )
        specs = catalogue.get(node.op_type).attributes
        checks = [(spec, spec.validate) for spec in specs]
    else:
        # ONNX Runtime takes any float epsilon (a negative or NaN one gives NaN rows): the
        # fusion rules leave such a norm as it is, with the reason; the kind is checked
        checks = []
        if (domain, node.op_type) in _EPSILON:
            checks.append((catalogue.EPSILON, _any_value))
        if (domain, node.op_type) in _AXIS:
            checks.append((catalogue.AXIS, _any_value))
    for spec, validate in checks:
        attr = attrs.get(spec.name)
        if attr is None:
            continue
        if attr.ref_attr_name:  # a function's attribute, known when called
            continue
        if attr.type != _KIND[spec.kind]:
            kind = "an int" if spec.kind == "int" else "a float"
            raise ModelProblem(
                f"{label}: attribute {spec.name} must be {kind}, got "
                f"{AttributeProto.AttributeType.Name(attr.type)}"
            )
        value = attr.f if spec.kind == "float" else attr.i
        problem = validate(value)
        if problem:
            raise ModelProblem(f"{label}: attribute {spec.name} {problem}")
        if spec.name == "axis" and node.input and node.input[0] in ranks:
            rank = ranks[node.input[0]]
            if not -rank <= value < rank:
                raise ModelProblem(
                    f"{label}: attribute axis {value} is out of range for its input of rank {rank}"
                )


def checks_attributes(domain: str, op_type: str) -> bool:
    """Whether :func:`check_attributes` has anything to check on a node of this op."""
    return domain == _ONNXNORM or (domain, op_type) in _EPSILON or (domain, op_type) in _AXIS
