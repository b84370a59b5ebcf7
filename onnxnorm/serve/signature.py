"""A model's inputs and outputs as a server sees them: names, element types, dims (``-1`` where
free) and whether the first dim is a batch dim that requests can be stacked along.

Both ways of serving read it: the Triton model configuration (:mod:`onnxnorm.serve.triton`)
and the tensors bound to PyTriton (:mod:`onnxnorm.serve`).
"""

from __future__ import annotations

import dataclasses

import onnx
from onnx import TensorProto

from onnxnorm.errors import OnnxNormError

#: ONNX element type -> Triton's data type name (the config's ``TYPE_<name>`` and the
#: protocol's datatype, except strings: TYPE_STRING in the config, BYTES on the wire)
TRITON_TYPES: dict[int, str] = {
    TensorProto.FLOAT: "FP32",
    TensorProto.FLOAT16: "FP16",
    TensorProto.BFLOAT16: "BF16",
    TensorProto.DOUBLE: "FP64",
    TensorProto.INT8: "INT8",
    TensorProto.INT16: "INT16",
    TensorProto.INT32: "INT32",
    TensorProto.INT64: "INT64",
    TensorProto.UINT8: "UINT8",
    TensorProto.UINT16: "UINT16",
    TensorProto.UINT32: "UINT32",
    TensorProto.UINT64: "UINT64",
    TensorProto.BOOL: "BOOL",
    TensorProto.STRING: "STRING",
}


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One input or output: ``dims`` holds -1 for a free dim; ``symbols`` the dims' names
    (``""`` for a fixed or unnamed dim)."""

    name: str
    elem_type: int
    dims: tuple[int, ...]
    symbols: tuple[str, ...]

    @property
    def triton_type(self) -> str:
        return TRITON_TYPES[self.elem_type]

    @property
    def numpy_dtype(self):
        return onnx.helper.tensor_dtype_to_np_dtype(self.elem_type)


@dataclasses.dataclass(frozen=True)
class Signature:
    """A model's inputs and outputs. ``batch`` says whether the first dim of every one of them
    is a free batch dim (requests of the same shape may be stacked along it); ``why_not`` says
    why not when it is not."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    batch: bool
    why_not: str = ""


def _spec(value: onnx.ValueInfoProto, what: str) -> TensorSpec:
    kind = value.type.WhichOneof("value")
    if kind != "tensor_type":
        raise OnnxNormError(
            f"{what} {value.name!r} is a {kind or 'value of no type'}, not a "
            "tensor: servers take tensors only"
        )
    tensor = value.type.tensor_type
    if tensor.elem_type not in TRITON_TYPES:
        name = TensorProto.DataType.Name(tensor.elem_type) if tensor.elem_type else "undefined"
        raise OnnxNormError(
            f"{what} {value.name!r} has element type {name}, which Triton does not serve"
        )
    if not tensor.HasField("shape"):
        raise OnnxNormError(
            f"{what} {value.name!r} has no shape (not even its rank); a server needs its rank"
        )
    dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim)
    symbols = tuple(d.dim_param if d.HasField("dim_param") else "" for d in tensor.shape.dim)
    return TensorSpec(value.name, tensor.elem_type, dims, symbols)


def _why_not_batched(inputs, outputs) -> str:
    for spec in (*inputs, *outputs):
        if not spec.dims:
            return f"{spec.name!r} is a scalar"
        if spec.dims[0] != -1:
            return f"the first dim of {spec.name!r} is fixed ({spec.dims[0]})"
    names = {s.symbols[0] for s in inputs if s.symbols[0]}
    if len(names) > 1:
        return f"the inputs' first dims have different names ({', '.join(sorted(names))})"
    for spec in inputs:
        for position, symbol in enumerate(spec.symbols[1:], start=1):
            if symbol and symbol in names:
                return (
                    f"dim {position} of {spec.name!r} is the first dims' {symbol!r}: "
                    "requests cannot be stacked along it"
                )
    return ""


def signature(model: onnx.ModelProto) -> Signature:
    """The inputs (initializers listed as graph inputs left out: they have defaults) and outputs
    of ``model``; OnnxNormError for one that a server cannot carry."""
    initializers = {t.name for t in model.graph.initializer}
    initializers |= {t.values.name for t in model.graph.sparse_initializer}
    inputs = tuple(_spec(v, "input") for v in model.graph.input if v.name not in initializers)
    outputs = tuple(_spec(v, "output") for v in model.graph.output)
    if not outputs:
        raise OnnxNormError("the model has no output")
    why_not = _why_not_batched(inputs, outputs) if inputs else "the model has no input"
    return Signature(inputs, outputs, not why_not, why_not)
