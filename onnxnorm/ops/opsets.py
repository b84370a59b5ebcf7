"""The standard opsets that onnxnorm writes in: what each has, which one a model imports, and
``OpsetWriter``, which writes constants, shapes and slices in the ops of one of them.

The function bodies (``onnxnorm.ops.bodies``) and the lowering (``onnxnorm.fusion.lowering``)
both write standard ops in the model's own opset, any from opset 7; each rule of the form "this
op (or attribute) exists from opset N" is written here once, as a constant or in the writer.
"""

from __future__ import annotations

from typing import Any

import onnx
from onnx import TensorProto, helper

#: The oldest standard opset bodies are written in (Add and Mul broadcast as numpy from 7).
OLDEST_OPSET = 7
#: From this opset the bodies cast with CastLike and the overload names carry no type
#: (``onnxnorm.ops.overloads``); also the opset a model that imports no standard opset is given.
MIN_OPSET = 15
#: From this opset Constant takes ``value_float``, so a body refers to the node's attributes;
#: below it the values are in the overload name.
REF_OPSET = 12
#: Cast-13 added bfloat16.
BFLOAT16_MIN_OPSET = 13
#: The standard opset of the quantizer a quantized op's body ends in (QuantizeLinear-10,
#: DynamicQuantizeLinear-11).
QUANTIZE_MIN_OPSET = {"static": 10, "dynamic": 11}
#: IR version 10 introduced function overloads.
MIN_IR_VERSION = 10
#: The standard opset from which QuantizeLinear quantizes to float8 (QuantizeLinear-19): the
#: least a model needs whose static quantized nodes have a float8e4m3fn zero point, as their
#: bodies (and their lowered form) end in that QuantizeLinear.
FLOAT8_MIN_OPSET = 19
#: The names of the standard domain in opset imports ("ai.onnx" is an alias of "").
DEFAULT_DOMAINS = ("", "ai.onnx")

_FLOAT = TensorProto.FLOAT
_INT64_MAX = 2**63 - 1


class Ref:
    """A reference to one of the function's own attributes."""

    def __init__(self, name: str):
        self.name = name


class OpsetWriter:
    """Constants, shapes and slices in the standard ops of one opset: the one place for each
    opset rule, shared by the function bodies and the lowering (``onnxnorm.fusion.lowering``).
    A subclass sets ``opset`` and defines ``__call__(op, *inputs, out=None, **attributes)``,
    which adds a node and returns its output."""

    opset: int

    def __call__(self, op: str, *inputs: str, out: str | None = None, **attrs: Any) -> str:
        raise NotImplementedError

    def scalar(self, value: float | Ref) -> str:
        """A float32 scalar; a Ref (to a function's attribute) needs REF_OPSET."""
        if self.opset >= REF_OPSET:
            return self("Constant", value_float=value)
        if isinstance(value, Ref):
            raise ValueError(f"a reference to attribute {value.name} needs opset {REF_OPSET}")
        return self("Constant", value=helper.make_tensor("value", _FLOAT, [], [float(value)]))

    def ints(self, values: list[int]) -> str:
        """A 1-D int64 tensor of small values (Constant takes int64 from opset 9; below it they
        go through float32, exactly)."""
        if self.opset >= REF_OPSET:
            return self("Constant", value_ints=values)
        if self.opset >= 9:
            return self(
                "Constant",
                value=helper.make_tensor("value", TensorProto.INT64, [len(values)], values),
            )
        floats = self("Constant", value=helper.make_tensor("value", _FLOAT, [len(values)], values))
        return self("Cast", floats, to=TensorProto.INT64)

    def slice(self, value: str, starts: list[int], ends: list[int], axes: list[int]) -> str:
        """Slice, whose bounds are attributes below opset 10 and inputs from it."""
        if self.opset < 10:
            return self("Slice", value, starts=starts, ends=ends, axes=axes)
        return self("Slice", value, self.ints(starts), self.ints(ends), self.ints(axes))

    def shape(self, value: str, start: int = 0) -> str:
        """The shape of ``value`` from dimension ``start`` on (negative: from the back); Shape
        takes ``start`` from opset 15, below it Slice cuts it."""
        if not start:
            return self("Shape", value)
        if self.opset >= MIN_OPSET:
            return self("Shape", value, start=start)
        return self.slice(self("Shape", value), [start], [_INT64_MAX], [0])

    def ones(self, value: str, axis: int, count: int | None = None) -> str:
        """float32 ones of the shape of ``value`` from ``axis`` on: a unit Scale. ConstantOfShape
        from opset 9; below it a Tile of ones of ``count`` dims (the dims from ``axis`` on),
        which the caller must know there."""
        dims = self.shape(value, axis)
        if self.opset >= 9:
            return self(
                "ConstantOfShape", dims, value=helper.make_tensor("one", _FLOAT, [1], [1.0])
            )
        if count is None:
            raise ValueError(f"opset {self.opset} has no ConstantOfShape: ones need their rank")
        one = self("Constant", value=helper.make_tensor("one", _FLOAT, [1] * count, [1.0]))
        return self("Tile", one, dims)

    def reduce_mean(self, value: str, axis: int = 1) -> str:
        """Mean over ``axis`` (>= 0), keepdims (the axes an input from opset 18)."""
        return self.reduce("ReduceMean", value, [axis])

    def reduce_sum_square(self, value: str, axis: int = 1) -> str:
        """Sum of squares over ``axis`` (>= 0), keepdims."""
        return self.reduce("ReduceSumSquare", value, [axis])

    def reduce(self, op: str, value: str, axes: list[int]) -> str:
        """``op`` (a Reduce op) over ``axes``, keepdims: the axes are an input from opset 18
        (ReduceSum: 13), an attribute before."""
        if self.opset >= (13 if op == "ReduceSum" else 18):
            return self(op, value, self.ints(axes), keepdims=1)
        return self(op, value, axes=axes, keepdims=1)


def model_opset(model: onnx.ModelProto, domain: str = "") -> int | None:
    """The version of ``domain`` the model imports (None: none); "" and "ai.onnx" are one."""
    domains = DEFAULT_DOMAINS if domain in DEFAULT_DOMAINS else (domain,)
    for imp in model.opset_import:
        if imp.domain in domains:
            return imp.version
    return None


def set_opset(model: onnx.ModelProto, domain: str, version: int) -> None:
    """Makes ``model`` import version ``version`` of ``domain`` (in place), replacing the
    version it imports; "" and "ai.onnx" are one."""
    domains = DEFAULT_DOMAINS if domain in DEFAULT_DOMAINS else (domain,)
    for imp in model.opset_import:
        if imp.domain in domains:
            imp.version = version
            return
    model.opset_import.append(helper.make_opsetid(domain, version))
