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


_FLOAT = onnx.TensorProto.FLOAT


def _inference(spec: catalogue.OpSpec):
    """Type and shape inference: every output has X's type and shape; Residual must have X's
    type, Scale/Bias/XBias X's type or float32, and axis must fit X's rank."""

    def fail(ctx, message: str) -> None:
        raise onnx.shape_inference.InferenceError(f"{ctx.get_display_name()}: {message}")

    def infer(ctx) -> None:
        x = ctx.get_input_type(0)
        if x is None or not x.HasField("tensor_type"):
            return
        x_type = x.tensor_type.elem_type
        for index, param in enumerate(spec.inputs[1:], start=1):
            if index >= ctx.get_num_inputs() or not ctx.has_input(index):
                continue
            given = ctx.get_input_type(index)
            if given is None or not given.HasField("tensor_type"):
                continue
            elem = given.tensor_type.elem_type
            allowed = {x_type} if param.type_var == "T" else {x_type, _FLOAT}
            if elem not in allowed:
                names = " or ".join(onnx.TensorProto.DataType.Name(t) for t in sorted(allowed))
                fail(ctx, f"{param.name} must be {names} (X is "
                          f"{onnx.TensorProto.DataType.Name(x_type)}), got "
                          f"{onnx.TensorProto.DataType.Name(elem)}")
        if x.tensor_type.HasField("shape"):
            rank = len(x.tensor_type.shape.dim)
            axis = ctx.get_attribute("axis")
            axis = axis.i if axis is not None else spec.attribute("axis").default
            if not -rank <= axis < rank:
                fail(ctx, f"axis {axis} is out of range for X of rank {rank}")
        for index in range(ctx.get_num_outputs()):
            if ctx.has_output(index):
                ctx.set_output_type(index, x)

    return infer


def op_schema(spec: catalogue.OpSpec) -> defs.OpSchema:
    attributes = []
    for a in spec.attributes:
        default = float(a.default) if a.kind == "float" else a.default
        attributes.append(defs.OpSchema.Attribute(a.name, onnx.helper.make_attribute(a.name, default), a.doc))
    schema = defs.OpSchema(
        spec.name, catalogue.DOMAIN, catalogue.VERSION,
        doc=f"{spec.summary}\n\n{spec.formula}",
        inputs=[_parameter(p) for p in spec.inputs],
        outputs=[_parameter(p) for p in spec.outputs],
        type_constraints=_type_constraints(),
        attributes=attributes,
    )
    schema.set_type_and_shape_inference_function(_inference(spec))
    return schema


def register() -> None:
    """Registers every catalogue op with onnx (idempotent)."""
    for spec in catalogue.OPS.values():
        if not defs.has(spec.name, catalogue.VERSION, catalogue.DOMAIN):
            defs.register_schema(op_schema(spec))
