"""The base of every onnxnorm rewrite rule, and the semantic checks the rules share."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from onnxnorm.fusion.report import Tracker
from onnxnorm.ops import catalogue

#: The element types an onnxnorm node takes, from the catalogue.
DATA_TYPES = frozenset(ir.DataType[t[len("tensor(") : -1].upper()] for t in catalogue.DATA_TYPES)
FLOAT = ir.DataType.FLOAT
#: the metadata key the pass sets on a standard op it wrote itself (an expansion whose
#: statistics are used becomes ONNX's LayerNormalization): the rule that turns that op into an
#: onnxnorm op leaves it alone rather than report it a second time
WRITTEN_BY_PASS = "onnxnorm.written_by"


class Rejected(Exception):
    """Raised by a rule's ``inspect`` when a match is not semantically the fused op."""


class NotThisPattern(Rejected):
    """Raised by ``inspect`` when the structure matched but is plainly another computation
    (an activation where a weight belongs): not a near miss, so not reported as a skip."""


@dataclasses.dataclass(frozen=True)
class Replacement:
    """The onnxnorm node that replaces a match: its op, its inputs by catalogue name (an input
    left out, or None, is absent) and its attributes."""

    op: str
    inputs: dict[str, ir.Value | None]
    attributes: dict[str, Any]
    #: what the fused node computes differently from the original, for the report ("": nothing)
    note: str = ""
    #: inputs the rewrite first reshapes to 1-D (a grouped norm's [groups, group_size] Scale,
    #: which the op takes as one row of weights)
    flatten: tuple[str, ...] = ()
    #: the outputs the node gets (0: every output of the op; a rotary op of Q alone: 1)
    outputs: int = 0
    #: inputs the rewrite first reshapes to the shape given (Reshape's 0 keeps a dim): a
    #: rotary op's constant angles [batch, 1, seq, dim] as [batch, seq, dim]
    reshape: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, node: ir.Node) -> Replacement:
        """An onnxnorm node read back, its attributes merged over the op's defaults: what
        the rules that grow a node start from."""
        spec = catalogue.get(node.op_type)
        inputs = {
            p.name: (node.inputs[i] if i < len(node.inputs) else None)
            for i, p in enumerate(spec.inputs)
        }
        return cls(
            node.op_type,
            inputs,
            {name: attribute(node, name, default) for name, default in spec.defaults.items()},
        )

    def arguments(self) -> list[ir.Value | None]:
        """The inputs in the op's order, without the absent ones at the end."""
        names = [p.name for p in catalogue.get(self.op).inputs]
        unknown = set(self.inputs) - set(names)
        if unknown:
            raise ValueError(f"{self.op} has no input {', '.join(sorted(unknown))}")
        values = [self.inputs.get(name) for name in names]
        while values[-1] is None:
            values.pop()
        return values


#: every attribute's default, whichever ops have it (one definition per name in the catalogue)
_DEFAULTS = {a.name: a.default for spec in catalogue.OPS.values() for a in spec.attributes}


def _own_attributes(replacement: Replacement) -> Replacement:
    """``replacement`` with the attributes its op has; one it lacks (a norm's ``y_float32``
    carried into a Skip op) may only hold its default, else the op cannot compute the match."""
    own = catalogue.get(replacement.op).defaults
    for name, value in replacement.attributes.items():
        if name not in own and value != _DEFAULTS.get(name):
            raise Rejected(
                f"{replacement.op} has no attribute {name}, and the match needs {name} = {value}"
            )
    kept = {k: v for k, v in replacement.attributes.items() if k in own}
    return dataclasses.replace(replacement, attributes=kept)


class FusionRule(pattern.RewriteRuleClassBase):
    """A rule that replaces each match it accepts with one onnxnorm node, and records every
    match in a :class:`Tracker`.

    Subclasses define ``title`` (the report line), ``pattern`` and ``inspect``. The pattern
    names its output ``y``; a rule that fuses a residual add returns ``(y, total)``, the norm
    and the sum, and the new node's Y and Sum take their places. ``inspect(context,
    **bindings)`` returns the :class:`Replacement`, or raises :class:`Rejected` with the
    reason (a near miss: reported as a skip) or :class:`NotThisPattern` (another computation:
    not reported). An op with a Residual always gets its Sum output, used or not (for targets
    but ``function``, ``passes.drop_unused_sums`` removes it where nothing reads it). Matched
    nodes are left to the final dead-code pass (``remove_nodes=False``) so that a match whose
    intermediate values are used elsewhere reaches ``check`` and is reported, not dropped.

    onnxscript calls ``rewrite`` right after a ``check`` that succeeded, with the same
    bindings but without the match context; ``check`` leaves the accepted root node and its
    replacement in ``self._accepted`` for it, as onnxscript's own rules leave what their check
    computed on ``self``.
    """

    title: str
    #: bindings whose values may be used outside the match (the rewrite keeps their producer)
    shared: tuple[str, ...] = ()
    #: inspect(context, **bindings): each rule's takes the variables its pattern names
    inspect: Callable[..., Replacement]

    def __init__(self, tracker: Tracker, name: str, strict_precision: bool = False) -> None:
        super().__init__(name, remove_nodes=False)
        self.tracker = tracker
        #: refuse, rather than fuse with a note, a norm whose statistics the original computes
        #: in float16/bfloat16 (the fused op computes them in float32)
        self.strict_precision = strict_precision
        tracker.register(self.title)
        tracker.adopt(self)
        self._accepted: tuple[ir.Node, Replacement] | None = None

    def forget(self) -> None:
        """Drops what a check kept for its rewrite (the match it accepted): the pipeline reuses
        its rules from run to run, and a check whose match was then not rewritten must not
        keep the last run's graph alive."""
        self._accepted = None

    # onnxscript calls check(context, **bindings), as its docs write a rule's check; its base
    # class declares check(op, *args, **kwargs)
    def check(self, context: Any, **bindings: Any) -> pattern.MatchResult:  # type: ignore[override]
        root = context.root
        if not context.output_values:
            # onnxscript passes on a node with fewer outputs than the pattern names (a
            # SkipSimplifiedLayerNormalization without its Sum output, as model builders write
            # the final norm) with no output bound: it is another rule's node
            return pattern.MatchResult().fail("the node has fewer outputs than the pattern", root)
        try:
            function = context.graph_or_function
            if isinstance(function, ir.Function) and function.domain == catalogue.DOMAIN:
                # the body of an onnxnorm node: already fused, nothing to report
                raise NotThisPattern(f"inside {function.domain}::{function.name}'s own body")
            if isinstance(function, ir.Function):
                # attach_functions gives bodies to the nodes of the main graph only
                raise Rejected(
                    f"inside model-local function {context.graph_or_function.domain}::"
                    f"{context.graph_or_function.name}; inline it first"
                )
            replacement = _own_attributes(self.inspect(context, **bindings))
            _only_used_inside(context, {bindings[n] for n in self.shared if n in bindings})
        except NotThisPattern as e:
            return pattern.MatchResult().fail(str(e), root)
        except Rejected as e:
            self.tracker.checked(self.title, root, str(e))
            return pattern.MatchResult().fail(str(e), root)
        self.tracker.checked(self.title, root, None)
        self._accepted = (root, replacement)
        return pattern.MatchResult()

    def rewrite(self, op, y, total=None, **_):
        accepted, self._accepted = self._accepted, None
        if accepted is None:
            raise RuntimeError(f"{self.title}: rewrite without a check that accepted the match")
        root, new = accepted
        self.tracker.fused(self.title, root, new.note)
        for name in new.flatten:
            value = new.inputs.get(name)
            if value is not None:
                new = dataclasses.replace(new, inputs={**new.inputs, name: _flat(op, value)})
        for name, shape in new.reshape.items():
            value = new.inputs[name]
            if value is None:
                continue
            target = op.Constant(value=ir.tensor(np.array(shape, np.int64)))
            viewed = op.Reshape(value, target)
            viewed.type = value.type
            new = dataclasses.replace(new, inputs={**new.inputs, name: viewed})
        outputs = op.op(
            new.op,
            *new.arguments(),
            _domain=catalogue.DOMAIN,
            _outputs=new.outputs or len(catalogue.get(new.op).outputs),
            _name=f"{root.name}/{new.op}" if root.name else None,
            **new.attributes,
        )
        if isinstance(outputs, ir.Value):
            outputs = [outputs]
        for value in outputs:
            # Y and Sum have the type and shape of the norm's output; a Sum the original did
            # not have (a Skip op without one) gets them too, for the rules that match it next
            if value.type is None and y.type is not None:
                value.type, value.shape = y.type, y.shape
        if (total is None and catalogue.get(new.op).has_residual) or len(outputs) == 1:
            return outputs[0]
        return outputs


def _flat(op, value: ir.Value) -> ir.Value:
    """``value`` reshaped to 1-D by a new Reshape node (valid at every opset)."""
    flat = op.Reshape(value, op.Constant(value=ir.tensor(np.array([-1], np.int64))))
    flat.type = value.type
    dims = list(value.shape.dims) if value.shape is not None else []
    sizes = [d for d in dims if isinstance(d, int)]
    if dims and len(sizes) == len(dims):
        flat.shape = ir.Shape([math.prod(sizes)])
    return flat


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
                if user not in nodes and not dead(user):
                    raise Rejected(
                        f"intermediate value {value.name!r} is also used by "
                        f"{user.op_type} node {user.name!r}"
                    )


def dead(node: ir.Node, depth: int = 4) -> bool:
    """Whether nothing reads ``node``'s outputs, directly or through nodes nothing reads (the
    final dead-code pass removes it): ONNX's function expansion writes the statistics of
    LayerNormalization's optional outputs whether the node had them or not."""
    return depth > 0 and all(
        not v.is_graph_output() and all(dead(u, depth - 1) for u in v.consumers())
        for v in node.outputs
    )


def dtype(value: ir.Value, what: str) -> ir.DataType:
    """The element type of a value (a Cast's output has the Cast's target type)."""
    if value.dtype is not None:
        return value.dtype
    producer = value.producer()
    if producer is not None and producer.op_type == "Cast" and producer.domain == "":
        to = attribute(producer, "to", None)
        if to is not None:
            return ir.DataType(to)
    raise Rejected(
        f"the element type of {what} ({value.name!r}) is unknown; run shape inference first"
    )


def constant(value: ir.Value | None, what: str) -> np.ndarray:
    """The value of a constant (an initializer that is no graph input, or a Constant's output)."""
    if value is None:
        raise Rejected(f"{what} is missing")
    if value.is_graph_input():
        raise Rejected(f"{what} ({value.name!r}) is a graph input, not a constant")
    tensor = ir.convenience.get_const_tensor(value)
    if tensor is not None:
        return tensor.numpy()
    producer = value.producer()
    if producer is not None and producer.op_type == "Cast" and producer.domain in ("", "ai.onnx"):
        # a constant cast to another type (float16 converters cast their constants back to
        # float32 where they keep a computation in float32): the cast's exact result
        source, to = producer.inputs[0], attribute(producer, "to", None)
        if source is not None and to is not None and ir.DataType(to).numpy() is not None:
            try:
                array = constant(source, what)
            except Rejected:
                array = None
            if array is not None:
                return array.astype(ir.DataType(to).numpy())
    raise Rejected(f"{what} ({value.name!r}) is not a constant")


#: integer ops :func:`int_values` evaluates (those of ONNX's function bodies' axis arithmetic)
_INT_OPS = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}


def int_values(value: ir.Value | None, what: str, depth: int = 8) -> np.ndarray:
    """The value of a small integer computation on constants and on the rank or static shape of
    a value, as ONNX's function bodies compute axes (``Range(axis, Size(Shape(X)), 1)``), which
    no constant folding has run on."""
    if value is None:
        raise Rejected(f"{what} is missing")
    node = value.producer()
    if node is None or ir.convenience.get_const_tensor(value) is not None or depth == 0:
        return constant(value, what)
    args = [a for a in node.inputs if a is not None]
    if node.domain not in ("", "ai.onnx") or len(args) != len(node.inputs):
        return constant(value, what)
    op = node.op_type
    if op in ("Shape", "Size"):
        source = args[0]
        inner = source.producer()
        if op == "Size" and inner is not None and inner.op_type == "Shape" and not inner.attributes:
            shaped = inner.inputs[0]
            if shaped is not None and shaped.shape is not None:
                return np.array(shaped.shape.rank(), np.int64)  # Size(Shape(v)): the rank
        dims = list(source.shape.dims) if source.shape is not None else []
        sizes = [d for d in dims if isinstance(d, int)]
        if source.shape is None or len(sizes) != len(dims):
            raise Rejected(
                f"{what} ({value.name!r}) depends on the dims of {source.name!r}, "
                "which are not static"
            )
        if op == "Size":
            return np.array(np.prod(sizes, dtype=np.int64), np.int64)
        rank = len(sizes)
        start, end = attribute(node, "start", 0), attribute(node, "end", rank)
        return np.array(sizes, np.int64)[slice(start, end)]
    values = [int_values(a, what, depth - 1) for a in args]
    if any(v.dtype.kind not in "iu" for v in values):
        raise Rejected(f"{what} ({value.name!r}) is not an integer computation")
    if op == "Identity":
        return values[0]
    if op == "Neg":
        return -values[0]
    if op in _INT_OPS and len(values) == 2:
        return _INT_OPS[op](values[0], values[1])
    if op == "Range":
        if len(values) != 3 or any(v.size != 1 for v in values):
            raise Rejected(f"{what} ({value.name!r}) is a Range of non-scalar bounds")
        start, limit, delta = (int(v.reshape(())) for v in values)
        if delta == 0 or (limit - start) // delta > 64:  # axes lists are short; no huge arrays
            raise Rejected(f"{what} ({value.name!r}) is a Range of more than 64 values")
        return np.arange(start, limit, delta, dtype=np.int64)
    if op == "Concat":
        return np.concatenate(values, axis=attribute(node, "axis", 0))
    if op == "Div" and len(values) == 2:
        if (values[1] == 0).any():
            raise Rejected(f"{what} ({value.name!r}) divides by zero")
        quotient = np.abs(values[0]) // np.abs(values[1])  # ONNX's integer Div truncates
        return (quotient * np.sign(values[0]) * np.sign(values[1])).astype(values[0].dtype)
    if op == "Cast" and ir.DataType(attribute(node, "to", 0)).numpy().kind in "iu":
        return values[0].astype(ir.DataType(attribute(node, "to", 0)).numpy())
    if op == "Gather" and len(values) == 2:
        return np.take(values[0], values[1], axis=attribute(node, "axis", 0))
    if op in ("Unsqueeze", "Squeeze"):
        axes = values[1] if len(values) > 1 else attribute(node, "axes", None)
        if op == "Squeeze":
            return np.squeeze(values[0], None if axes is None else tuple(int(a) for a in axes))
        out = values[0]
        for a in sorted(int(a) % (out.ndim + len(axes)) for a in axes):
            out = np.expand_dims(out, a)
        return out
    if op == "Slice" and len(values) >= 3 and values[0].ndim == 1:
        starts, ends = values[1], values[2]
        steps = values[4] if len(values) > 4 else np.ones_like(starts)
        if starts.size != 1 or (len(values) > 3 and [int(a) for a in values[3]] not in ([0], [-1])):
            raise Rejected(f"{what} ({value.name!r}) is a Slice this pass does not evaluate")
        start, end, step = int(starts[0]), int(ends[0]), int(steps[0])
        return values[0][slice(start, end, step)]
    raise Rejected(f"{what} ({value.name!r}) is computed by {op}, not a constant")


def scalar(value: ir.Value | None, what: str) -> float:
    """A constant of one element, of any numeric type, as a Python float."""
    if value is None:
        raise Rejected(f"{what} is missing")
    array = constant(value, what)
    if array.size != 1 or array.ndim > 1:
        raise Rejected(f"{what} ({value.name!r}) is not a scalar: shape {list(array.shape)}")
    return float(array.reshape(()).astype(np.float64))


def attribute(node: ir.Node, name: str, default: Any) -> Any:
    attr = node.attributes.get(name)
    if attr is None:
        return default
    if attr.is_ref():
        raise Rejected(
            f"attribute {name} of {node.op_type} node {node.name!r} is a reference "
            "to a function attribute"
        )
    return attr.value


#: the report's words for a norm whose statistics the original computes in half precision
HALF_STATISTICS = (
    "statistics computed in {type} in the original; onnxnorm computes them in "
    "float32 (more accurate, no overflow above |x| 256 where x*x passes 65504)"
)


def statistics_type(x_type: ir.DataType, strict: bool, what: str = "the statistics are") -> str:
    """The report note for statistics the original computes in ``x_type`` ("" for float32);
    raises :class:`Rejected` where the fused op cannot take them (another type, or
    ``strict``: the caller wants the original's precision or nothing)."""
    if x_type == FLOAT:
        return ""
    if x_type in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16) and not strict:
        return HALF_STATISTICS.format(type=x_type.name)
    hint = " (strict precision)" if strict and x_type in DATA_TYPES else ""
    if x_type == ir.DataType.DOUBLE:
        hint = " and has no DOUBLE kernels: fusing would lose the original's precision"
    raise Rejected(f"{what} computed in {x_type.name}; onnxnorm computes them in FLOAT{hint}")


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
        raise Rejected(
            f"Scale of shape {_shape(scale)} spans more than the normalized dims of X "
            f"({x.name!r}) of unknown rank"
        )
    while len(dims) > normalized and dims[0] == 1:
        dims.pop(0)
    if len(dims) < normalized:
        raise Rejected(
            f"Scale of shape {_shape(scale)} does not cover the {normalized} "
            f"normalized dim(s) of X {_shape(x)}"
        )
    trailing = x_dims[len(x_dims) - len(dims) :] if x_dims is not None else [None] * len(dims)
    for s, d in zip(dims, trailing):
        if isinstance(s, int) and isinstance(d, int):
            if s != d:
                raise Rejected(
                    f"Scale of shape {_shape(scale)} is not a suffix of X's shape {_shape(x)}"
                )
        elif isinstance(s, int) and s > 1:
            pass  # X's dim is not static: the original graph's broadcast forces it to s
        elif not (isinstance(s, ir.SymbolicDim) and s.value is not None and s == d):
            raise Rejected(f"cannot prove that Scale of shape {_shape(scale)} fits X {_shape(x)}")


def _shape(value: ir.Value) -> str:
    if value.shape is None:
        return "?"
    return (
        "["
        + ", ".join(str(d) if isinstance(d, int) else (d.value or "?") for d in value.shape.dims)
        + "]"
    )
