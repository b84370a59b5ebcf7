"""LayerNorm as other tools spell it out: ONNX's own function body of LayerNormalization (what
onnx's function expansion and the tools that inline functions write) and the form tf2onnx
writes for Keras' LayerNormalization. Each computes the same function as onnxnorm's LayerNorm
in another arrangement of float32 arithmetic, which the report notes. A function body whose
statistics (LayerNormalization's Mean and InvStdDev outputs) are read becomes the standard op
again, which gives them.

(ONNX's function body of RMSNormalization needs no rule of its own: it is the decomposed RMSNorm
of ``norms.RMSCore`` with axes computed from X's rank, which ``checks.mean_axis`` evaluates.)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from onnxnorm.fusion._base import (
    FLOAT,
    WRITTEN_BY_PASS,
    FusionRule,
    Rejected,
    Replacement,
    attribute,
    check_scale,
    dead,
    dtype,
    epsilon,
    int_values,
    scalar,
    statistics_type,
)
from onnxnorm.fusion.checks import check_type, check_weight, mean_axis, square

#: the report's note on the one-pass variance of ONNX's function body
ONE_PASS = (
    "the original computes the variance in one pass, E[x^2] - E[x]^2 (ONNX's function "
    "body of LayerNormalization); onnxnorm computes it in two passes, E[(x - mean)^2], "
    "which is more accurate for rows far from zero"
)
#: the report's note on TensorFlow's arrangement
FOLDED = (
    "the original folds Scale into 1 / sqrt(var + eps) and computes x * s + (Bias - "
    "mean * s) (TensorFlow's batch_normalization); onnxnorm computes (x - mean) / "
    "sqrt(var + eps) * Scale + Bias: the same function, rounded differently"
)


#: the report's note on a function body whose statistics are used: it becomes the standard op
STANDARD = (
    "became ONNX's LayerNormalization, not onnxnorm's LayerNorm, for every target: its "
    "statistics ({names}) are used outside the norm, and the standard op gives them as its "
    "Mean and InvStdDev outputs; ONNX Runtime's kernel sums them in another order"
)
#: ... and in half precision, where the standard op rounds in the other order
STANDARD_ROUNDING = (
    "in {type}, LayerNormalization rounds once at the end (order B) where the function body "
    "rounds the normalized value to {type} before its Scale and Bias (order A): Y may differ "
    "by one unit in the last place"
)


def _notes(*notes: str) -> str:
    return "; ".join(n for n in notes if n)


def _axis(x: ir.Value, axis: int, what: str) -> int:
    """``axis`` of X made negative (the fused op's axis then holds for any rank)."""
    rank = x.shape.rank() if x.shape is not None else None
    if rank is None:
        if axis < 0:
            return axis
        raise Rejected(f"{what} {axis} with X ({x.name!r}) of unknown rank")
    if not -rank <= axis < rank:
        raise Rejected(f"{what} {axis} is out of range for X of rank {rank}")
    return axis - rank if axis >= 0 else axis


def _flatten_axis(node: ir.Node, x: ir.Value) -> int:
    """The axis of the Flatten of X, or of the Reshape to [rows, cols] that constant folding makes
    of it (onnxscript's optimizer): the last axis whose trailing dims hold cols elements."""
    if node.op_type == "Flatten":
        return _axis(x, attribute(node, "axis", 1), "Flatten axis")
    target = [int(d) for d in int_values(node.inputs[1], "the shape of the 2-D view of X")]
    dims = list(x.shape.dims) if x.shape is not None else []
    if len(target) == 2 and target[1] > 0 and target[0] != 0:
        for k in range(len(dims) - 1, -1, -1):
            trailing = [d for d in dims[k:] if isinstance(d, int)]
            if len(trailing) != len(dims) - k:
                break
            prefix = [d for d in dims[:k] if isinstance(d, int)]
            if np.prod(trailing, dtype=np.int64) == target[1] and (
                target[0] == -1
                or (len(prefix) == k and np.prod(prefix, dtype=np.int64) == target[0])
            ):
                return k - len(dims)
    raise Rejected(
        f"X is reshaped to {target}, which is not X flattened at one of its axes "
        f"(X's shape {[str(d) for d in dims] if dims else '?'})"
    )


def _check_flat_weight(weight: ir.Value, x: ir.Value, axis: int, what: str) -> None:
    """The function body multiplies the normalized [rows, cols] view of X by ``Flatten(W, 0)``,
    which lines W's elements up with the normalized dims whatever W's shape; the fused op
    broadcasts W over X itself, so W's dims must be X's normalized dims (leading 1s aside)."""
    if weight.shape is None:
        raise Rejected(f"the shape of {what} ({weight.name!r}) is unknown")
    dims = list(weight.shape.dims)
    while len(dims) > -axis and dims[0] == 1:
        dims.pop(0)
    if len(dims) != -axis:
        raise Rejected(
            f"{what} of shape {weight.shape} does not have X's {-axis} normalized "
            "dim(s): the function body flattens it, the fused op broadcasts it over X"
        )
    if -axis == 1:
        check_scale(weight, x, axis)  # one normalized dim: the original's Mul fixes its size
        return
    if x.shape is None:
        raise Rejected(f"the shape of X ({x.name!r}) is unknown")
    normalized = list(x.shape.dims)[axis:]
    same = all(
        d == n and (isinstance(d, int) or d.value is not None) for d, n in zip(dims, normalized)
    )
    if not same:
        raise Rejected(
            f"cannot prove that {what} of shape {weight.shape} has X's normalized dims "
            f"{list(x.shape.dims)[axis:]}: the function body flattens both, the fused "
            "op broadcasts it over X"
        )


def _flat_weight(flat: ir.Value, x: ir.Value, axis: int, what: str) -> ir.Value:
    """The weight behind the body's ``Flatten(W, 0)``; a [1, n] constant where a constant
    folding ran before (for one normalized dim it broadcasts over X as W does)."""
    node = flat.producer()
    if node is not None and node.op_type == "Flatten" and node.domain in ("", "ai.onnx"):
        if attribute(node, "axis", 1) != 0:
            raise Rejected(f"{what} is flattened at axis {attribute(node, 'axis', 1)}, not 0")
        weight = node.inputs[0]
        if weight is None:
            raise Rejected(f"{what} is missing")
        _check_flat_weight(weight, x, axis, what)
        return weight
    check_weight(flat, x, what)
    if -axis > 1:
        raise Rejected(
            f"{what} ({flat.name!r}) is already flattened (a constant folding ran) "
            f"and X is normalized over {-axis} dims: the fused op needs {what} in "
            "those dims; fuse before folding constants"
        )
    check_scale(flat, x, axis)
    return flat


def _outside_uses(value: ir.Value, nodes) -> list[ir.Node]:
    return [u for u in value.consumers() if u not in nodes and not dead(u)]


def _default_opset(model: ir.Model) -> int | None:
    imports = model.opset_imports
    return imports.get("", imports.get("ai.onnx"))


#: a dim of a shape computed from X's: X's dim i as ("X", i), else its constant value
_Dim = int | tuple[str, int]


def _dims_from_x(value: ir.Value | None, x: ir.Value, what: str, depth: int = 8) -> list[_Dim]:
    """A 1-D shape computed from X's shape as ONNX's function body computes the shape of the
    statistics (``Concat(Slice(Shape(X), 0, axis), ConstantOfShape(rank - axis))``), whose dims
    need not be static: each of X's dims it holds as ("X", i), constants as their values."""
    try:
        return [int(v) for v in int_values(value, what).reshape(-1)]
    except Rejected:
        if value is None or depth == 0:
            raise
    node = value.producer()
    op = node.op_type if node is not None else None
    if node is None or node.domain not in ("", "ai.onnx") or None in node.inputs:
        pass
    elif op == "Shape" and node.inputs[0] is x and x.shape is not None:
        rank = x.shape.rank()
        # (Shape's start and end clamp as Python's slices do)
        whole: list[_Dim] = [("X", i) for i in range(rank)]
        return whole[attribute(node, "start", 0) : attribute(node, "end", rank)]
    elif op == "Identity":
        return _dims_from_x(node.inputs[0], x, what, depth - 1)
    elif op == "Concat" and attribute(node, "axis", 0) in (0, -1):
        return [d for v in node.inputs for d in _dims_from_x(v, x, what, depth - 1)]
    elif op == "Slice" and len(node.inputs) >= 3:
        data = _dims_from_x(node.inputs[0], x, what, depth - 1)
        starts, ends, *rest = (int_values(v, what).reshape(-1) for v in node.inputs[1:])
        axes = [int(a) for a in rest[0]] if rest else [0]
        steps = [int(a) for a in rest[1]] if len(rest) > 1 else [1]
        if starts.size == 1 and ends.size == 1 and axes in ([0], [-1]) and steps == [1]:
            return data[int(starts[0]) : int(ends[0])]
    elif op == "ConstantOfShape":
        count = int_values(node.inputs[0], what).reshape(-1)
        fill = attribute(node, "value", None)
        array = fill.numpy().reshape(-1) if fill is not None else np.zeros(1, np.float32)
        if count.size == 1 and array.size == 1 and array.dtype.kind in "iu":
            return [int(array[0])] * int(count[0])
    raise Rejected(
        f"{what} ({value.name!r}) is not computed from X's shape in a way this pass follows"
    )


def _check_statistics_shape(shape: ir.Value, x: ir.Value, axis: int) -> None:
    """LayerNormalization's Mean and InvStdDev have X's dims before ``axis``, then 1s: the
    function body reshapes its [rows, 1] statistics to that shape."""
    what = "the shape of the statistics"
    dims = _dims_from_x(shape, x, what)
    if x.shape is None:
        raise Rejected(f"the shape of X ({x.name!r}) is unknown")
    x_dims = list(x.shape.dims)
    kept = len(x_dims) + axis

    def known(d: _Dim) -> int | ir.SymbolicDim | None:
        return x_dims[d[1]] if isinstance(d, tuple) else d

    def same(d: _Dim, i: int) -> bool:
        mine, xs = known(d), x_dims[i]
        return d == ("X", i) or (mine == xs and (isinstance(xs, int) or xs.value is not None))

    if (
        len(dims) != len(x_dims)
        or not all(same(d, i) for i, d in enumerate(dims[:kept]))
        or not all(known(d) == 1 for d in dims[kept:])
    ):
        shown = [f"X[{d[1]}]" if isinstance(d, tuple) else d for d in dims]
        raise Rejected(
            f"the statistics are reshaped to {shown}, not to X's dims before axis {axis} "
            "then 1s (the shape of LayerNormalization's Mean and InvStdDev)"
        )


@dataclasses.dataclass(frozen=True)
class _Statistics:
    """Where the statistics of a function body go: the outputs of the Reshapes of its mean and of
    its inverse standard deviation to X's rank (LayerNormalization's Mean and InvStdDev; None
    where unused)."""

    mean: ir.Value | None
    inv_std_dev: ir.Value | None

    def names(self) -> str:
        return ", ".join(repr(v.name) for v in (self.mean, self.inv_std_dev) if v is not None)


def _is_op(node: ir.Node, op_type: str) -> bool:
    return node.op_type == op_type and node.domain in ("", "ai.onnx")


def _view(
    value: ir.Value, users: list[ir.Node], x: ir.Value, axis: int, what: str
) -> ir.Value | None:
    """The Reshape of a statistic to X's rank, the one reader of ``value`` (None: no reader)."""
    for user in users:
        if not _is_op(user, "Reshape") or user.inputs[0] is not value:
            raise Rejected(
                f"the {what} ({value.name!r}) is read by {user.op_type} node {user.name!r}: "
                "LayerNormalization gives it in X's rank, not in the function body's [rows, 1] "
                "view"
            )
        shape = user.inputs[1] if len(user.inputs) > 1 else None
        if shape is None:
            raise Rejected(f"Reshape node {user.name!r} has no shape")
        _check_statistics_shape(shape, x, axis)
    if len(users) > 1:
        raise Rejected(
            f"the {what} ({value.name!r}) is reshaped by {len(users)} nodes; "
            "LayerNormalization gives it once"
        )
    return users[0].outputs[0] if users else None


def _statistics(nodes, x: ir.Value, axis: int, mean: ir.Value, std: ir.Value) -> _Statistics | None:
    """What of the function body's statistics is used outside the norm (None: nothing): its mean
    and the reciprocal of its standard deviation, each reshaped to X's rank, as the body
    computes LayerNormalization's Mean and InvStdDev."""
    for value, what in ((mean, "mean"), (std, "standard deviation")):
        if value.is_graph_output():
            raise Rejected(
                f"the {what} ({value.name!r}) is a graph output in the function body's "
                "[rows, 1] view: LayerNormalization gives it in X's rank"
            )
    inverse, readers = None, []
    for user in _outside_uses(std, nodes):
        if not _is_op(user, "Reciprocal"):
            raise Rejected(
                f"the standard deviation ({std.name!r}) is read by {user.op_type} node "
                f"{user.name!r}: LayerNormalization gives only its reciprocal (InvStdDev)"
            )
        if inverse is not None:
            raise Rejected(f"the standard deviation ({std.name!r}) is inverted twice")
        inverse = user.outputs[0]
        if inverse.is_graph_output():
            raise Rejected(
                f"the inverse standard deviation ({inverse.name!r}) is a graph output in the "
                "function body's [rows, 1] view: LayerNormalization gives it in X's rank"
            )
        readers = _outside_uses(inverse, nodes)
    mean_readers = _outside_uses(mean, nodes)
    if not mean_readers and not readers:
        return None
    return _Statistics(
        _view(mean, mean_readers, x, axis, "mean"),
        _view(inverse, readers, x, axis, "inverse standard deviation") if inverse else None,
    )


class ExpandedLayerNorm(FusionRule):
    """ONNX's function body of LayerNormalization (opset 17): X flattened to [rows, cols] at
    ``axis``, cast to ``stash_type``, the mean and E[x^2] - E[x]^2 over each row, the normalized
    value cast back to X's type, times ``Flatten(Scale, 0)``, plus ``Flatten(B, 0)`` (an
    Identity without B), reshaped to X's shape. The match is anchored on that Flatten/Reshape
    pair: the reduction over the flattened row is the one over X's dims [axis, rank).

    Where the body's statistics are used (its mean and ``Reciprocal`` of its standard
    deviation, each reshaped to X's rank: LayerNormalization's Mean and InvStdDev outputs), the
    match becomes one standard ``LayerNormalization`` with those outputs, on every target:
    onnxnorm's LayerNorm does not give them."""

    title = "LayerNorm (ONNX LayerNormalization function body)"
    #: X's 2-D view may have other readers: its producer then stays for them (and the
    #: statistics, where the standard op takes their readers: ``check`` sets it per match)
    shared: tuple[str, ...] = ("x2d",)

    def __init__(self, tracker, strict_precision: bool = False) -> None:
        super().__init__(tracker, "ExpandedLayerNormalization", strict_precision)
        #: the statistics the accepted match gives its readers (None: the onnxnorm op)
        self._statistics: _Statistics | None = None

    def forget(self) -> None:
        super().forget()
        self._statistics = None

    def pattern(self, op, x, eps, scale2d, bias2d, shape, like, flat_shape):
        x2d = pattern.OrValue([op.Flatten(x), op.Reshape(x, flat_shape)], name="x2d")
        # (a tag: onnxscript 0.7's commute cannot clone an untagged backtracking OrValue)
        xu = pattern.OrValue([op.Cast(x2d), x2d], name="xu", tag_var="cast_in")
        mean = op.ReduceMean(xu, _allow_other_inputs=True, _outputs=["mean"])
        square_mean = op.ReduceMean(
            op.Mul(xu, xu), _allow_other_inputs=True, _outputs=["square_mean"]
        )
        std = op.Sqrt(op.Add(op.Sub(square_mean, op.Mul(mean, mean)), eps), _outputs=["std"])
        normalized = op.Div(op.Sub(xu, mean), std, _outputs=["normalized"])
        rounded = pattern.OrValue(
            [op.Cast(normalized), op.CastLike(normalized, like), normalized], name="rounded"
        )
        scaled = op.Mul(rounded, scale2d)
        biased = pattern.OrValue([op.Add(scaled, bias2d), op.Identity(scaled), scaled])
        return op.Reshape(biased, shape, _outputs=["y"])

    def check(self, context: Any, **bindings: Any) -> Any:  # type: ignore[override]
        self._statistics, self.shared = None, ("x2d",)
        return super().check(context, **bindings)

    def inspect(
        self,
        context,
        x,
        x2d,
        xu,
        eps,
        mean,
        square_mean,
        std,
        rounded,
        scale2d,
        shape,
        y,
        bias2d=None,
        **_,
    ):
        x_type = dtype(x, "X")
        stats = dtype(xu, "the statistics")
        if xu is not x2d and stats != FLOAT:
            raise Rejected(
                f"stash_type is {stats.name}: the statistics are computed in "
                f"{stats.name}; onnxnorm computes them in FLOAT"
                + (
                    " and has no DOUBLE kernels: fusing would lose the original's precision"
                    if stats == ir.DataType.DOUBLE
                    else ""
                )
            )
        note = statistics_type(stats, self.strict_precision)
        axis = _flatten_axis(x2d.producer(), x)
        statistics = _statistics(set(context.nodes), x, axis, mean, std)
        scale = _flat_weight(scale2d, x, axis, "Scale")
        bias = _flat_weight(bias2d, x, axis, "Bias") if bias2d is not None else None
        check_type(x_type, Y=y, Scale=scale, **({"Bias": bias} if bias is not None else {}))
        if dtype(rounded, "the normalized value") != x_type:
            raise Rejected(
                f"the normalized value is {dtype(rounded, 'it').name}, X is {x_type.name}"
            )
        for value in (mean, square_mean):
            if mean_axis(value.producer(), xu, rank=2) != -1:
                raise Rejected(
                    f"ReduceMean {value.producer().name!r} does not reduce the rows "
                    "of the flattened X"
                )
        self._check_shape(x, shape)
        attributes = {"axis": axis, "epsilon": epsilon(scalar(eps, "epsilon"))}
        inputs = {"X": x, "Scale": scale, "Bias": bias}
        if statistics is None:
            return Replacement(
                "LayerNorm",
                inputs,
                {**attributes, "cast_before_scale": int(x_type != FLOAT)},
                _notes(ONE_PASS, note),
            )
        # the statistics are used: the standard op, which gives them
        if stats != FLOAT:
            raise Rejected(
                f"the statistics ({statistics.names()}) are used outside the norm and "
                f"computed in {stats.name} (no Cast to stash_type FLOAT): LayerNormalization "
                "gives them in FLOAT"
            )
        opset = _default_opset(context.model)
        if opset is not None and opset < 17:
            raise Rejected(
                f"the statistics ({statistics.names()}) are used outside the norm and only "
                f"LayerNormalization gives them, which needs opset 17; the model imports "
                f"opset {opset} (converted down after ONNX wrote the function body?)"
            )
        self._statistics, self.shared = statistics, ("x2d", "mean", "std")
        rounding = STANDARD_ROUNDING.format(type=x_type.name) if x_type != FLOAT else ""
        return Replacement(
            "LayerNorm",
            inputs,
            {**attributes, "cast_before_scale": 0},
            _notes(STANDARD.format(names=statistics.names()), rounding),
        )

    def rewrite(self, op, y, total=None, **bindings):
        statistics, self._statistics = self._statistics, None
        if statistics is None:
            return super().rewrite(op, y, total, **bindings)
        accepted, self._accepted = self._accepted, None
        if accepted is None:
            raise RuntimeError(f"{self.title}: rewrite without a check that accepted the match")
        root, new = accepted
        self.tracker.fused(self.title, root, new.note)
        inputs = [new.inputs["X"], new.inputs["Scale"]]
        if new.inputs.get("Bias") is not None:
            inputs.append(new.inputs["Bias"])
        outputs = op.LayerNormalization(
            *inputs,
            axis=new.attributes["axis"],
            epsilon=new.attributes["epsilon"],
            stash_type=int(FLOAT),
            _outputs=2 if statistics.inv_std_dev is None else 3,
            _name=f"{root.name}/LayerNormalization" if root.name else None,
        )
        written = outputs[0].producer()
        if written is not None:
            written.metadata_props[WRITTEN_BY_PASS] = self.title
        # the readers of the body's statistics (graph outputs too) read the op's outputs
        for old, value in zip((statistics.mean, statistics.inv_std_dev), outputs[1:]):
            if old is not None:
                value.name = old.name
                value.type = old.type or ir.TensorType(FLOAT)
                value.shape = old.shape
                old.replace_all_uses_with(value, replace_graph_outputs=True)
        return outputs[0]

    @staticmethod
    def _check_shape(x: ir.Value, shape: ir.Value) -> None:
        """The Reshape must restore X's own shape: ``Shape(X)``, or X's static dims."""
        node = shape.producer()
        if node is not None and node.op_type == "Shape" and node.inputs[0] is x:
            if not node.attributes:
                return
            raise Rejected(f"the output is reshaped to a slice of X's shape ({node.name!r})")
        try:
            target = [int(d) for d in int_values(shape, "the output shape").reshape(-1)]
        except Rejected as e:
            raise Rejected(f"cannot prove that the output is reshaped to X's shape: {e}") from None
        dims = list(x.shape.dims) if x.shape is not None else None
        if dims != target:
            raise Rejected(
                f"the output is reshaped to {target}, not to X's shape "
                f"{[str(d) for d in dims] if dims is not None else '?'}"
            )


class KerasLayerNorm(FusionRule):
    """tf2onnx's Keras LayerNormalization (``tf.nn.moments`` then ``tf.nn.batch_normalization``;
    ONNX Runtime's optimizer calls it the TF LayerNorm): ``s = gamma / sqrt(var + eps)``
    (``Reciprocal(Sqrt)``, ``Pow(., -0.5)`` or ``Div(1, Sqrt)``), then ``x * s + (beta - mean *
    s)``; the variance of the squared difference ``(x - mean)^2`` (``Mul`` or ``Pow``)."""

    title = "LayerNorm (TensorFlow/Keras: scale folded into the reciprocal)"

    def __init__(self, tracker, strict_precision: bool = False) -> None:
        super().__init__(tracker, "KerasLayerNorm", strict_precision)

    def pattern(self, op, x, eps, gamma, beta, two, power, one):
        mean = op.ReduceMean(x, _allow_other_inputs=True, _outputs=["mean"])
        var = op.ReduceMean(
            square(op, op.Sub(x, mean), two), _allow_other_inputs=True, _outputs=["var"]
        )
        shifted = op.Add(var, eps)
        inverse = pattern.OrValue(
            [op.Reciprocal(op.Sqrt(shifted)), op.Pow(shifted, power), op.Div(one, op.Sqrt(shifted))]
        )
        s = op.Mul(inverse, gamma)
        return op.Add(op.Mul(x, s), op.Sub(beta, op.Mul(mean, s)), _outputs=["y"])

    def inspect(
        self, context, x, eps, gamma, beta, mean, var, y, two=None, power=None, one=None, **_
    ):
        x_type = dtype(x, "X")
        note = statistics_type(x_type, self.strict_precision)
        if two is not None and scalar(two, "the Pow exponent") != 2:
            raise Rejected(f"the Pow exponent is {scalar(two, 'the Pow exponent')}, not 2")
        if power is not None and scalar(power, "the Pow exponent") != -0.5:
            raise Rejected(
                f"the exponent of var + eps is {scalar(power, 'the exponent')}, not -0.5"
            )
        if one is not None and scalar(one, "the reciprocal's numerator") != 1:
            raise Rejected(f"the reciprocal's numerator is {scalar(one, 'the numerator')}, not 1")
        axis = mean_axis(var.producer(), x)
        if mean_axis(mean.producer(), x) != axis:
            raise Rejected("the mean and the variance reduce over different axes")
        check_weight(gamma, x, "gamma")
        check_weight(beta, x, "beta")
        check_type(x_type, Scale=gamma, Bias=beta, Y=y)
        check_scale(gamma, x, axis)
        check_scale(beta, x, axis)
        return Replacement(
            "LayerNorm",
            {"X": x, "Scale": gamma, "Bias": beta},
            {"axis": axis, "epsilon": epsilon(scalar(eps, "epsilon")), "cast_before_scale": 0},
            _notes(FOLDED, note),
        )


def standard_rules(tracker, strict_precision: bool = False) -> list[pattern.RewriteRule]:
    return [
        ExpandedLayerNorm.rule(tracker, strict_precision=strict_precision),
        KerasLayerNorm.rule(tracker, strict_precision=strict_precision),
    ]
