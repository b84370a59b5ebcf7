"""The catalogue's ops (``catalogue.OPS`` and the rotary ops of ``catalogue.ROTARY_OPS``) as onnx
schemas, so that onnx.checker, onnx shape inference and the PyTorch exporter know them."""

from __future__ import annotations

import onnx
from onnx import defs

from onnxnorm.ops import catalogue

_ATTR = {"int": defs.OpSchema.AttrType.INT, "float": defs.OpSchema.AttrType.FLOAT}
_OPTION = defs.OpSchema.FormalParameterOption


def _type_constraints(spec: catalogue.OpSpec) -> list[tuple[str, list[str], str]]:
    out = []
    for var, types in spec.type_constraints.items():
        names = ", ".join(p.name for p in spec.inputs + spec.outputs if p.type_var == var)
        out.append((var, list(types), f"{names}: {catalogue.TYPE_VARS[var]}."))
    return out


def _parameter(p: catalogue.Param) -> defs.OpSchema.FormalParameter:
    return defs.OpSchema.FormalParameter(
        p.name, p.type_var, p.doc, param_option=_OPTION.Optional if p.optional else _OPTION.Single
    )


_FLOAT = onnx.TensorProto.FLOAT


def _elem(onnx_type: str) -> int:
    """ "tensor(uint8)" -> TensorProto.UINT8."""
    return onnx.helper.np_dtype_to_tensor_dtype(
        onnx.helper.tensor_dtype_to_np_dtype(
            getattr(onnx.TensorProto, onnx_type[len("tensor(") : -1].upper())
        )
    )


def _y_type(ctx, x: onnx.TypeProto) -> onnx.TypeProto:
    """Y of type U: X's type and shape, or float32 where the node's y_float32 is 1."""
    out = onnx.TypeProto()
    out.CopyFrom(x)
    flag = ctx.get_attribute("y_float32")
    if flag is not None and flag.i == 1:
        out.tensor_type.elem_type = _FLOAT
    return out


def _inference(spec: catalogue.OpSpec):
    """Type and shape inference: every output of type T has X's type and shape (of type U: X's
    type, or float32 where y_float32 = 1); a quantized Y
    has Y_zero_point's type (else the op's first quantized type) and X's shape; DynamicQuantize's
    Y_scale (float32) and Y_zero_point are scalars. Residual and Y_scale must have X's type,
    Scale/Bias/XBias X's type or float32, Y_zero_point one of the quantized types, axis must
    fit X's rank, and a GatedRMSNorm's group_size must divide the normalized extent where it is
    known."""
    quant_types = [_elem(t) for t in spec.quant_types]

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
            allowed = {"T": {x_type}, "S": {x_type, _FLOAT}, "Q": set(quant_types), "F": {_FLOAT}}[
                param.type_var
            ]
            if elem not in allowed:
                names = " or ".join(onnx.TensorProto.DataType.Name(t) for t in sorted(allowed))
                fail(
                    ctx,
                    f"{param.name} must be {names} (X is "
                    f"{onnx.TensorProto.DataType.Name(x_type)}), got "
                    f"{onnx.TensorProto.DataType.Name(elem)}",
                )
        if x.tensor_type.HasField("shape"):
            rank = len(x.tensor_type.shape.dim)
            axis = ctx.get_attribute("axis")
            axis = axis.i if axis is not None else spec.attribute("axis").default
            if not -rank <= axis < rank:
                fail(ctx, f"axis {axis} is out of range for X of rank {rank}")
            group = ctx.get_attribute("group_size") if spec.gated else None
            dims = x.tensor_type.shape.dim[axis % rank :]
            if group is not None and group.i > 0 and all(d.HasField("dim_value") for d in dims):
                extent = 1
                for d in dims:
                    extent *= d.dim_value
                if extent % group.i:
                    fail(
                        ctx,
                        f"group_size {group.i} does not divide the normalized extent {extent}",
                    )
        # (an op without quantized types has no output of one)
        q_type = quant_types[0] if quant_types else onnx.TensorProto.UNDEFINED
        for index, param in enumerate(spec.inputs):
            if param.type_var == "Q" and index < ctx.get_num_inputs() and ctx.has_input(index):
                given = ctx.get_input_type(index)
                if given is not None and given.HasField("tensor_type"):
                    q_type = given.tensor_type.elem_type
        for index, param in enumerate(spec.outputs):
            if index >= ctx.get_num_outputs() or not ctx.has_output(index):
                continue
            if param.type_var == "T":
                ctx.set_output_type(index, x)
            elif param.type_var == "U":
                ctx.set_output_type(index, _y_type(ctx, x))
            elif param.name == "Y":
                out = onnx.TypeProto()
                out.CopyFrom(x)
                out.tensor_type.elem_type = q_type
                ctx.set_output_type(index, out)
            else:  # DynamicQuantizeLinear's scalar Y_scale and Y_zero_point
                elem = _FLOAT if param.type_var == "F" else q_type
                ctx.set_output_type(index, onnx.helper.make_tensor_type_proto(elem, []))

    return infer


def _rotary_inference(spec: catalogue.OpSpec):
    """Type and shape inference of a rotary op: QOut has Q's type and shape, KOut K's; with
    layout 2 the shape is [batch, heads, seq, head_size] (Q's dims 1 and 2 swapped, a 3-D Q's
    heads * head_size split by head_size first). K must have Q's type, the norm weights (S)
    and Cos and Sin (A) Q's type or float32, each group one type; Q and K are 3-D (with
    head_size, layout 0 or 2) or 4-D, and per_head = 0 needs layout 0 or 2."""
    types = {"T": "Q's type", "S": "Q's type or float32", "A": "Q's type or float32"}

    def fail(ctx, message: str) -> None:
        raise onnx.shape_inference.InferenceError(f"{ctx.get_display_name()}: {message}")

    def attribute(ctx, name: str) -> int:
        value = ctx.get_attribute(name)
        return value.i if value is not None else spec.attribute(name).default

    def given(ctx, index: int) -> onnx.TypeProto | None:
        if index >= ctx.get_num_inputs() or not ctx.has_input(index):
            return None
        value = ctx.get_input_type(index)
        return value if value is not None and value.HasField("tensor_type") else None

    def out_dims(ctx, name: str, x: onnx.TypeProto, layout: int, head_size: int):
        dims = list(x.tensor_type.shape.dim)
        if len(dims) not in (3, 4):
            fail(ctx, f"{name} must be 3-D or 4-D, got rank {len(dims)}")
        if len(dims) == 3 and (not head_size or layout == 1):
            fail(ctx, f"a 3-D {name} needs head_size (> 0) and layout 0 or 2")
        if layout != 2:
            return dims
        if len(dims) == 4:
            return [dims[0], dims[2], dims[1], dims[3]]
        heads = onnx.TensorShapeProto.Dimension()
        if dims[2].HasField("dim_value"):
            heads.dim_value = dims[2].dim_value // head_size
        size = onnx.TensorShapeProto.Dimension(dim_value=head_size)
        return [dims[0], heads, dims[1], size]

    def infer(ctx) -> None:
        q = given(ctx, 0)
        if q is None:
            return
        q_type = q.tensor_type.elem_type
        found: dict[str, set[int]] = {"S": set(), "A": set()}
        for index, param in enumerate(spec.inputs[1:], start=1):
            value = given(ctx, index)
            if value is None or param.type_var not in types:
                continue
            elem = value.tensor_type.elem_type
            if elem not in ({q_type} if param.type_var == "T" else {q_type, _FLOAT}):
                fail(
                    ctx,
                    f"{param.name} must be of {types[param.type_var]} "
                    f"({onnx.TensorProto.DataType.Name(q_type)}), got "
                    f"{onnx.TensorProto.DataType.Name(elem)}",
                )
            found.get(param.type_var, set()).add(elem)
        for var, names in (("S", "the norm weights"), ("A", "Cos and Sin")):
            if len(found[var]) > 1:
                fail(ctx, f"{names} must share one type")
        layout, head_size = attribute(ctx, "layout"), attribute(ctx, "head_size")
        if layout == 1 and attribute(ctx, "per_head") == 0:
            fail(ctx, "per_head = 0 normalizes a token's heads together: layout 0 or 2")
        for index, name in enumerate(("Q", "K")):
            x = given(ctx, index)
            if x is None or index >= ctx.get_num_outputs() or not ctx.has_output(index):
                continue
            out = onnx.TypeProto()
            out.tensor_type.elem_type = q_type
            if x.tensor_type.HasField("shape"):
                out.tensor_type.shape.dim.extend(out_dims(ctx, name, x, layout, head_size))
            ctx.set_output_type(index, out)

    return infer


def op_schema(spec: catalogue.OpSpec) -> defs.OpSchema:
    attributes = []
    for a in spec.attributes:
        default = float(a.default) if a.kind == "float" else a.default
        attributes.append(
            defs.OpSchema.Attribute(a.name, onnx.helper.make_attribute(a.name, default), a.doc)
        )
    schema = defs.OpSchema(
        spec.name,
        catalogue.DOMAIN,
        catalogue.VERSION,
        doc=f"{spec.summary}\n\n{spec.formula}",
        inputs=[_parameter(p) for p in spec.inputs],
        outputs=[_parameter(p) for p in spec.outputs],
        type_constraints=_type_constraints(spec),
        attributes=attributes,
    )
    schema.set_type_and_shape_inference_function(
        _rotary_inference(spec) if spec.rotary else _inference(spec)
    )
    return schema


def register() -> None:
    """Registers every catalogue op (those of OPS and ROTARY_OPS) with onnx (idempotent)."""
    for spec in (*catalogue.OPS.values(), *catalogue.ROTARY_OPS.values()):
        if not defs.has(spec.name, catalogue.VERSION, catalogue.DOMAIN):
            defs.register_schema(op_schema(spec))
