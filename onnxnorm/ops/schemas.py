"""The catalogue's ops as onnx schemas, so that onnx.checker, onnx shape inference and the
PyTorch exporter know them."""

from __future__ import annotations

import onnx
from onnx import defs

from onnxnorm.ops import catalogue

_ATTR = {"int": defs.OpSchema.AttrType.INT, "float": defs.OpSchema.AttrType.FLOAT}
_OPTION = defs.OpSchema.FormalParameterOption


def _type_constraints() -> list[tuple[str, list[str], str]]:
    return [
        ("T", list(catalogue.DATA_TYPES), "X, Residual, Y and Sum: one float type per node."),
        ("S", list(catalogue.DATA_TYPES), "Scale, Bias and XBias: X's type or float32."),
    ]


def _parameter(p: catalogue.Param) -> defs.OpSchema.FormalParameter:
    return defs.OpSchema.FormalParameter(
        p.name, p.type_var, p.doc, param_option=_OPTION.Optional if p.optional else _OPTION.Single)


def op_schema(spec: catalogue.OpSpec) -> defs.OpSchema:
    attributes = []
    for a in spec.attributes:
        default = float(a.default) if a.kind == "float" else a.default
        attributes.append(defs.OpSchema.Attribute(a.name, onnx.helper.make_attribute(a.name, default), a.doc))
    return defs.OpSchema(
        spec.name, catalogue.DOMAIN, catalogue.VERSION,
        doc=f"{spec.summary}\n\n{spec.formula}",
        inputs=[_parameter(p) for p in spec.inputs],
        outputs=[_parameter(p) for p in spec.outputs],
        type_constraints=_type_constraints(),
        attributes=attributes,
    )


def register() -> None:
    """Registers every catalogue op with onnx (idempotent)."""
    for spec in catalogue.OPS.values():
        if not defs.has(spec.name, catalogue.VERSION, catalogue.DOMAIN):
            defs.register_schema(op_schema(spec))
