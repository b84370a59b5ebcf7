"""The base of every onnxnorm rewrite rule, and the semantic checks the rules share."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from onnxnorm.ops import catalogue
from onnxnorm.fusion.report import Tracker

#: The element types an onnxnorm node takes, from the catalogue.
DATA_TYPES = frozenset(ir.DataType[t[len("tensor("):-1].upper()] for t in catalogue.DATA_TYPES)
FLOAT = ir.DataType.FLOAT


class Rejected(Exception):
    """Raised by a rule's ``inspect`` when a match is not semantically the fused op."""


class NotThisPattern(Rejected):
    """Raised by ``inspect`` when the structure matched but is plainly another computation
    (an activation where a weight belongs): not a near miss, so not reported as a skip."""


class FusionRule(pattern.RewriteRuleClassBase):
    """A rule whose every structural match is recorded in a :class:`Tracker`.

    Subclasses define ``title`` (the report line), ``fused_op`` (the onnxnorm op emitted),
    ``pattern`` (root output named ``y``; inputs named as the op's, lower-case) and ``inspect``,
    which raises :class:`Rejected` with a reason or returns the new node's attributes. Matched
    nodes are left to the final dead-code pass (``remove_nodes=False``) so that a match whose
    intermediate values are used elsewhere reaches ``check`` and is reported, not dropped.
    """

    title: str
    fused_op: str
    #: bindings whose values may be used outside the match (the rewrite keeps their producer)
    shared: tuple[str, ...] = ()

    def __init__(self, tracker: Tracker, name: str) -> None:
        super().__init__(name, remove_nodes=False)
        self.tracker = tracker
        tracker.register(self.title)
        self._accepted: dict[ir.Node, dict[str, Any]] = {}

    def inspect(self, context, **bindings) -> dict[str, Any]:
        raise NotImplementedError

    def check(self, context, **bindings):
        root = context.root
        try:
            if isinstance(context.graph_or_function, ir.Function):
                # attach_functions gives bodies to the nodes of the main graph only
                raise Rejected(f"inside model-local function {context.graph_or_function.domain}::"
                               f"{context.graph_or_function.name}; inline it first")
            attributes = self.inspect(context, **bindings)
            _only_used_inside(context, {bindings[n] for n in self.shared if n in bindings})
        except NotThisPattern as e:
            return pattern.MatchResult().fail(str(e), root)
        except Rejected as e:
            self.tracker.checked(self.title, root, str(e))
            return pattern.MatchResult().fail(str(e), root)
        self.tracker.checked(self.title, root, None)
        self._accepted[root] = attributes
        return True

    def rewrite(self, op, y, **bindings):
        root = y.producer()
        attributes = self._accepted.pop(root)
        inputs = [bindings.get(p.name.lower()) for p in catalogue.get(self.fused_op).inputs]
        while inputs[-1] is None:
            inputs.pop()
        self.tracker.fused(self.title, root)
        return op.op(self.fused_op, *inputs, _domain=catalogue.DOMAIN,
                     _name=f"{root.name}/{self.fused_op}" if root.name else None, **attributes)


def _only_used_inside(context, shared=frozenset()) -> None:
    """Every value the match computes, but its outputs and ``shared``, must be used by the match
    alone."""
    nodes = set(context.nodes)
    for node in context.nodes:
        for value in node.outputs:
            if value in context.output_values or value in shared:
                continue
            if value.is_graph_output():
                raise Rejected(f"intermediate value {value.name!r} is a graph output")
            for user in value.consumers():
                if user not in nodes:
                    raise Rejected(f"intermediate value {value.name!r} is also used by "
                                   f"{user.op_type} node {user.name!r}")


def dtype(value: ir.Value, what: str) -> ir.DataType:
    """The element type of a value (a Cast's output has the Cast's target type)."""
    if value.dtype is not None:
        return value.dtype
    producer = value.producer()
    if producer is not None and producer.op_type == "Cast" and producer.domain == "":
        to = attribute(producer, "to", None)
        if to is not None:
            return ir.DataType(to)
    raise Rejected(f"the element type of {what} ({value.name!r}) is unknown; "
                   "run shape inference first")


def constant(value: ir.Value | None, what: str) -> np.ndarray:
    """The value of a constant (an initializer that is no graph input, or a Constant's output)."""
    if value is None:
        raise Rejected(f"{what} is missing")
    if value.is_graph_input():
        raise Rejected(f"{what} ({value.name!r}) is a graph input, not a constant")
    tensor = ir.convenience.get_const_tensor(value)
    if tensor is None:
        raise Rejected(f"{what} ({value.name!r}) is not a constant")
    return tensor.numpy()


def scalar(value: ir.Value | None, what: str) -> float:
    """A constant of one element, of any numeric type, as a Python float."""
    array = constant(value, what)
    if array.size != 1 or array.ndim > 1:
        raise Rejected(f"{what} ({value.name!r}) is not a scalar: shape {list(array.shape)}")
    return float(array.reshape(()).astype(np.float64))


def attribute(node: ir.Node, name: str, default: Any) -> Any:
    attr = node.attributes.get(name)
    if attr is None:
        return default
    if attr.is_ref():
        raise Rejected(f"attribute {name} of {node.op_type} node {node.name!r} is a reference "
                       "to a function attribute")
    return attr.value


def epsilon(value: float) -> float:
    problem = catalogue.EPSILON.validate(value)
    if problem:
        raise Rejected(f"epsilon {problem}")
    return value


def check_scale(scale: ir.Value, x: ir.Value, axis: int) -> None:
    """Scale's shape must be a suffix of X's shape covering the normalized dims [axis, rank):
    then broadcasting it changes neither Y's shape nor which elements it scales."""
    if scale.shape is None:
        raise Rejected(f"the shape of Scale ({scale.name!r}) is unknown")
    dims = list(scale.shape.dims)
    x_dims = list(x.shape.dims) if x.shape is not None else None
    rank = len(x_dims) if x_dims is not None else None
    if axis < 0:
        normalized = -axis
    elif rank is None:
        raise Rejected(f"axis {axis} with X ({x.name!r}) of unknown rank")
    else:
        normalized = rank - axis
    if rank is not None and len(dims) > rank:
        raise Rejected(f"Scale of shape {_shape(scale)} has a higher rank than X {_shape(x)}")
    if rank is None and len(dims) > normalized:
        raise Rejected(f"Scale of shape {_shape(scale)} spans more than the normalized dims of X "
                       f"({x.name!r}) of unknown rank")
    while len(dims) > normalized and dims[0] == 1:
        dims.pop(0)
    if len(dims) < normalized:
        raise Rejected(f"Scale of shape {_shape(scale)} does not cover the {normalized} "
                       f"normalized dim(s) of X {_shape(x)}")
    trailing = x_dims[len(x_dims) - len(dims):] if x_dims is not None else [None] * len(dims)
    for s, d in zip(dims, trailing):
        if isinstance(s, int) and isinstance(d, int):
            if s != d:
                raise Rejected(f"Scale of shape {_shape(scale)} is not a suffix of X's shape "
                               f"{_shape(x)}")
        elif isinstance(s, int) and s > 1:
            pass  # X's dim is not static: the original graph's broadcast forces it to s
        elif not (isinstance(s, ir.SymbolicDim) and s.value is not None and s == d):
            raise Rejected(f"cannot prove that Scale of shape {_shape(scale)} fits X {_shape(x)}")


def _shape(value: ir.Value) -> str:
    if value.shape is None:
        return "?"
    return "[" + ", ".join(str(d) if isinstance(d, int) else (d.value or "?")
                           for d in value.shape.dims) + "]"


