"""Reshape targets computed from shapes, evaluated over symbolic dims: what the grouped gated
norm rule (``gated.GroupAbsorb``) needs to prove that a view into groups and the view back
restore X's shape when the dims are dynamic (``Shape`` nodes with ``Gather``, ``Slice``,
``Concat``, integer arithmetic, and the 0 and -1 of ``Reshape``)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import onnx_ir as ir

from onnxnorm.fusion._base import Rejected, attribute
from onnxnorm.fusion.activations import is_standard
from onnxnorm.fusion.residual import symbolic
from onnxnorm.ops import catalogue


@dataclasses.dataclass(frozen=True)
class _Dim:
    """Dim ``axis`` of ``value``, which no inference made static: a symbol."""

    value: ir.Value
    axis: int


#: a dim as the product ``coefficient * dims...`` (an integer: no dims)
_Term = tuple[int, tuple[_Dim, ...]]
#: ops through which a value keeps its input's shape
_SAME_SHAPE = ("Cast", "Identity", "CastLike")


def _same_shape_source(value: ir.Value) -> ir.Value | None:
    """The input whose shape ``value`` has: that of a Cast or Identity, or X of an onnxnorm
    node (its Y and Sum have X's shape)."""
    node = value.producer()
    if node is None or not node.inputs or node.inputs[0] is None:
        return None
    if node.domain == catalogue.DOMAIN or (is_standard(node) and node.op_type in _SAME_SHAPE):
        return node.inputs[0]
    return None


def _size(value: ir.Value, axis: int) -> _Term:
    """Dim ``axis`` of ``value``: an integer where an inference made it static, else the dim
    of the first value it takes its shape from (through casts, one symbol for all of them)."""
    while True:
        for shape in (value.shape, symbolic(value)):
            dim = shape.dims[axis] if shape is not None and axis < shape.rank() else None
            if isinstance(dim, int):
                return dim, ()
        source = _same_shape_source(value)
        if source is None:
            return 1, (_Dim(value, axis),)
        value = source


def _same(a: _Dim, b: _Dim) -> bool:
    """Whether two dims are proved equal: one dim, or one symbol of one inference (onnx's
    shapes, ORT's symbolic shapes), as the gated rules prove two values of one shape."""
    if a == b:
        return True
    for shape_a, shape_b in (
        (a.value.shape, b.value.shape),
        (symbolic(a.value), symbolic(b.value)),
    ):
        if shape_a is None or shape_b is None:
            continue
        if a.axis >= shape_a.rank() or b.axis >= shape_b.rank():
            continue
        da, db = shape_a.dims[a.axis], shape_b.dims[b.axis]
        if isinstance(da, ir.SymbolicDim) and da.value is not None and da == db:
            return True
    return False


def _divide(a: _Term, b: _Term) -> _Term | None:
    """``a / b`` where it is exact for every value of the symbols (b's dims among a's, b's
    coefficient a divisor of a's), else None."""
    rest = list(a[1])
    for dim in b[1]:
        match = next((i for i, d in enumerate(rest) if _same(dim, d)), None)
        if match is None:
            return None
        del rest[match]
    if b[0] == 0 or a[0] % b[0]:
        return None
    return a[0] // b[0], tuple(rest)


def _equal(a: _Term, b: _Term) -> bool:
    return a == b or _divide(a, b) == (1, ())


def _product(terms: list[_Term]) -> _Term:
    return math.prod(t[0] for t in terms), tuple(d for t in terms for d in t[1])


def show(term: _Term) -> str:
    def name(d: _Dim) -> str:
        dim = d.value.shape.dims[d.axis] if d.value.shape is not None else None
        if isinstance(dim, ir.SymbolicDim) and dim.value is not None:
            return dim.value
        return f"{d.value.name}[{d.axis}]"

    factors = ([str(term[0])] if term[0] != 1 or not term[1] else []) + [name(d) for d in term[1]]
    return "*".join(factors)


class Shapes:
    """Evaluates the integer graph that computes a reshape's target (TorchScript's ``Shape``,
    ``Gather``, ``Div``, ``Unsqueeze``, ``Concat``; the dynamo exporter's ``Shape(start, end)``
    and ``Concat`` with constants; ``Slice``; the 0 and -1 dims of ``Reshape``) over the dims
    of the values it reads the shapes of: each dim is an integer where an inference made it
    static, else a symbol (:class:`_Dim`), equal to another where it is the same dim or the
    same name in one inference. Anything else it does not evaluate: Rejected, with the reason."""

    #: the integer ops evaluated element-wise
    ARITHMETIC = ("Add", "Sub", "Mul", "Div")

    def __init__(self) -> None:
        #: dims derived by the rule: the grouped view's
        self.known: dict[ir.Value, list[_Term]] = {}
        #: the values whose shape the evaluated computations read
        self.read: set[ir.Value] = set()
        #: the dims the reshape after the norm gives, once evaluated, and the values whose
        #: shapes its target reads
        self.back: list[_Term] | None = None
        self.back_read: set[ir.Value] = set()

    def dims(self, value: ir.Value, read: bool = False) -> list[_Term]:
        """The dims of ``value`` (``read``: as a Shape node reads them)."""
        source: ir.Value | None = value
        while source is not None:
            if read:
                self.read.add(source)
            if source in self.known:
                return self.known[source]
            source = _same_shape_source(source)
        shape = value.shape if value.shape is not None else symbolic(value)
        if shape is None:
            raise Rejected(f"the rank of {value.name!r} is unknown")
        return [_size(value, axis) for axis in range(shape.rank())]

    def evaluate(self, value: ir.Value, depth: int = 16) -> tuple[list[_Term], bool]:
        """(the elements, whether it is a scalar) of the integer tensor ``value``."""
        tensor = ir.convenience.get_const_tensor(value)
        if tensor is not None and not value.is_graph_input():
            array = tensor.numpy()
            if array.dtype.kind not in "iu" or array.ndim > 1:
                raise Rejected(f"{value.name!r} is no 1-D integer constant")
            return [(int(v), ()) for v in array.reshape(-1)], array.ndim == 0
        node = value.producer()
        if node is None or depth == 0 or not is_standard(node):
            raise Rejected(f"{value.name!r} is not computed from shapes and constants")
        op = node.op_type
        if op == "Shape" and node.inputs[0] is not None:
            dims = self.dims(node.inputs[0], read=True)
            start, end = attribute(node, "start", 0), attribute(node, "end", len(dims))
            return dims[start:end], False
        args = [None if v is None else self.evaluate(v, depth - 1) for v in node.inputs]
        if not args or args[0] is None:
            raise Rejected(f"{value.name!r} is computed by {op} without its input")
        (data, is_scalar), rest = args[0], args[1:]
        if op in ("Identity", "Cast") and (op == "Identity" or _integer(value)):
            return data, is_scalar
        if op in self.ARITHMETIC and rest and rest[0] is not None:
            other, other_scalar = rest[0]
            if len(data) != len(other) and 1 not in (len(data), len(other)):
                raise Rejected(f"{value.name!r} is a {op} of {len(data)} and {len(other)} dims")
            pairs = (
                zip(data * len(other), other) if len(data) == 1 else zip(data, other * len(data))
            )
            return [_arithmetic(op, a, b, value) for a, b in pairs], is_scalar and other_scalar
        if op == "Concat" and all(a is not None and not a[1] for a in args):
            return [t for a in args if a is not None for t in a[0]], False
        if op == "Gather" and rest and rest[0] is not None and not is_scalar:
            indices, scalar_index = rest[0]
            picked = [data[_index(t, len(data), value)] for t in indices]
            return picked, scalar_index
        if op == "Slice" and not is_scalar and len(rest) >= 2:
            return self._slice(value, data, rest), False
        if op == "Unsqueeze" and is_scalar:
            return data, False
        if op == "Squeeze" and len(data) == 1:
            return data, True
        if op == "Reshape" and rest and rest[0] is not None and len(data) == 1:
            return data, not rest[0][0]
        raise Rejected(f"{value.name!r} is computed by {op}, which this pass does not evaluate")

    @staticmethod
    def _slice(value: ir.Value, data: list[_Term], rest: list) -> list[_Term]:
        bounds = [None if r is None else [_integer_term(t, value) for t in r[0]] for r in rest]
        starts, ends = bounds[0], bounds[1]
        axes = bounds[2] if len(bounds) > 2 else None
        steps = bounds[3] if len(bounds) > 3 else None
        if not starts or not ends or len(starts) != 1 or len(ends) != 1:
            raise Rejected(f"{value.name!r} is a Slice of more than one axis")
        if axes not in (None, [0], [-1]) or steps not in (None, [1]):
            raise Rejected(f"{value.name!r} is a Slice with steps or axes this pass does not take")
        return data[starts[0] : ends[0]]  # Python clamps as ONNX does for step 1

    def reshape(
        self,
        source: list[_Term],
        target: ir.Value,
        allowzero: int,
        total: _Term,
        partial: bool = False,
    ) -> list[_Term]:
        """The dims ``Reshape(v, target)`` gives, v of dims ``source`` (``total`` values);
        ``partial``: a -1 that does not divide out stays -1."""
        dims, is_scalar = self.evaluate(target)
        if is_scalar:
            raise Rejected(f"the reshape's shape ({target.name!r}) is a scalar")
        dims = list(dims)
        for i, term in enumerate(dims):
            if term == (0, ()) and not allowzero:
                if i >= len(source):
                    raise Rejected(f"the reshape's shape copies dim {i} of a rank-{len(source)} X")
                dims[i] = source[i]
        holes = [i for i, term in enumerate(dims) if term == (-1, ())]
        if len(holes) > 1:
            raise Rejected(f"the reshape's shape ({target.name!r}) has more than one -1")
        if holes:
            known = _product([t for i, t in enumerate(dims) if i != holes[0]])
            inferred = _divide(total, known)
            if inferred is None and partial:
                return dims
            if inferred is None:
                raise Rejected(
                    f"the -1 of the reshape's shape is {show(total)} / {show(known)}, "
                    "which this pass cannot divide"
                )
            dims[holes[0]] = inferred
        return dims

    def view(self, z: ir.Value, view: ir.Value, s1: ir.Value) -> list[_Term] | None:
        """The grouped view's dims, evaluated (a -1 that does not divide out left -1), or
        None where its target is not evaluated."""
        try:
            z_dims = self.dims(z)
            dims = self.reshape(z_dims, s1, _allowzero(view), _product(z_dims), partial=True)
        except Rejected:
            return None
        if (-1, ()) not in dims:
            self.known[view] = dims
        return dims

    def not_restored(
        self, z: ir.Value, view: ir.Value, y: ir.Value, s2: ir.Value, static: str
    ) -> str:
        """ "" where the reshape of the norm by ``s2`` is proved to give z's shape, else why
        not (``static``: why the static shapes did not prove it)."""
        before = set(self.read)
        try:
            z_dims = self.dims(z)
            self.back = self.reshape(self.dims(view), s2, _allowzero(y), _product(z_dims))
        except Rejected as e:
            return f"{static}; {e}"
        finally:
            self.back_read = self.read - before
        if len(self.back) == len(z_dims) and all(map(_equal, self.back, z_dims)):
            return ""
        return (
            f"X is [{', '.join(map(show, z_dims))}], "
            f"the reshape gives [{', '.join(map(show, self.back))}]"
        )

    def splits(self, z: ir.Value, view_dims: list[_Term] | None, size: int) -> bool:
        """Whether the view is ``[*z's leading dims, k, size]``: with as many values as z, k
        times size is z's last dim, whatever it is."""
        if view_dims is None:
            return False
        z_dims = self.dims(z)
        return (
            len(view_dims) == len(z_dims) + 1
            and view_dims[-1] == (size, ())
            and all(map(_equal, view_dims[:-2], z_dims[:-1]))
        )

    def named(self, y: ir.Value) -> ir.Shape | None:
        """y's shape, where onnx's inference could not name a dim (a -1 of the reshape) the
        symbol the evaluation proves it equal to: the shape of the Reshape of z that gives y's
        shape, for the rules that prove its gate of the same shape."""
        if y.shape is None or self.back is None or len(self.back) != y.shape.rank():
            return y.shape
        dims: list = []
        for dim, (coefficient, factors) in zip(y.shape.dims, self.back):
            unnamed = isinstance(dim, ir.SymbolicDim) and (dim.value or "unk__").startswith("unk__")
            if unnamed and not factors:
                dim = coefficient
            elif unnamed and coefficient == 1 and len(factors) == 1:
                source = factors[0].value.shape
                name = source.dims[factors[0].axis] if source is not None else None
                dim = name if isinstance(name, ir.SymbolicDim) and name.value else dim
            dims.append(dim)
        return ir.Shape(dims)

    def x_target(
        self, view: ir.Value, norm: ir.Value, y: ir.Value, s2: ir.Value
    ) -> tuple[ir.Value | np.ndarray, int]:
        """(the target, allowzero) of a Reshape of z to y's shape: y's static shape, else the
        reshape's own target where it reads no shape of the view or the norm (or the Reshape
        of z would wait for them) and copies no dim of the view (0 without allowzero)."""
        dims = list(y.shape.dims) if y.shape is not None else None
        if dims and all(isinstance(d, int) and d > 0 for d in dims):
            return np.array(dims, np.int64), 0
        if self.back is None:
            raise Rejected(
                "the shape the reshape after the norm gives is neither static nor evaluated"
            )
        if self.back_read & {view, norm}:
            raise Rejected("the shape after the norm is computed from the norm's own shape")
        allowzero = _allowzero(y)
        if not allowzero and (0, ()) in self.evaluate(s2)[0]:
            raise Rejected("the reshape after the norm copies dims of the grouped view (a 0 dim)")
        return s2, allowzero


def _allowzero(value: ir.Value) -> int:
    """The allowzero of the Reshape that computes ``value``."""
    node = value.producer()
    return int(attribute(node, "allowzero", 0)) if node is not None else 0


def _integer(value: ir.Value) -> bool:
    """Whether the Cast that computes ``value`` casts to an integer type."""
    node = value.producer()
    to = attribute(node, "to", None) if node is not None else None
    return to is not None and ir.DataType(to).numpy().kind in "iu"


def _integer_term(term: _Term, value: ir.Value) -> int:
    if term[1]:
        raise Rejected(f"{value.name!r} takes {show(term)}, not static, as an index")
    return term[0]


def _index(term: _Term, length: int, value: ir.Value) -> int:
    index = _integer_term(term, value)
    index += length if index < 0 else 0
    if not 0 <= index < length:
        raise Rejected(f"{value.name!r} gathers index {term[0]} of {length} dims")
    return index


def _arithmetic(op: str, a: _Term, b: _Term, value: ir.Value) -> _Term:
    """``a op b`` (ONNX's integer Add, Sub, Mul, Div) where it is a term for every value of the
    symbols."""
    if not a[1] and not b[1]:
        x, y = a[0], b[0]
        if op in ("Add", "Sub", "Mul"):
            return {"Add": x + y, "Sub": x - y, "Mul": x * y}[op], ()
        if y == 0:
            raise Rejected(f"{value.name!r} divides by zero")
        truncated = abs(x) // abs(y)  # ONNX's integer Div truncates
        return (truncated if (x < 0) == (y < 0) else -truncated), ()
    if op == "Mul":
        return _product([a, b])
    if op == "Div":
        quotient = _divide(a, b)
        if quotient is None:
            raise Rejected(f"{value.name!r} divides {show(a)} by {show(b)}, not proved exact")
        return quotient
    if op in ("Add", "Sub") and b == (0, ()):
        return a
    if op == "Add" and a == (0, ()):
        return b
    raise Rejected(f"{value.name!r} is {show(a)} {op} {show(b)}, which this pass does not evaluate")
