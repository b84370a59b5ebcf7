"""Rules that turn a norm written as one op of another domain into one onnxnorm node: ONNX's
``LayerNormalization`` (opset 17) and ``RMSNormalization`` (opset 23) and ONNX Runtime's
``SimplifiedLayerNormalization`` become ``LayerNorm`` / ``RMSNorm``, com.microsoft
``SkipLayerNormalization`` and ``SkipSimplifiedLayerNormalization`` become ``SkipLayerNorm`` /
``SkipRMSNorm``.

Such an op states what a decomposed norm spells out: its attributes give the axis and epsilon
(the ops without a skip also the statistics' type, ``stash_type``), and how its kernels round
gives the rounding order. Each rule checks that nothing reads the outputs the catalogue op does
not have (the mean, the inverse standard deviation); those of the ops without a skip leave out
a Scale of ones and a Bias of zeros. ``norms.norm_rules`` puts these rules in the norms stage
beside the decomposed norms' core and absorb rules.
"""

from __future__ import annotations

import onnx_ir as ir

from onnxnorm.fusion._base import (
    FLOAT,
    WRITTEN_BY_PASS,
    FusionRule,
    NotThisPattern,
    Rejected,
    Replacement,
    attribute,
    check_scale,
    dtype,
    epsilon,
    statistics_type,
)
from onnxnorm.fusion.checks import check_mixed, check_type
from onnxnorm.fusion.ort_gated import MS_DOMAIN
from onnxnorm.fusion.report import Tracker


class StandardLayerNorm(FusionRule):
    """ONNX ``LayerNormalization`` (opset 17). PyTorch's layer_norm, which the exporters turn
    into it, and ONNX Runtime's kernels round once at the end: order B."""

    title = "LayerNorm (ONNX LayerNormalization)"

    def __init__(self, tracker: Tracker, strict_precision: bool = False) -> None:
        super().__init__(tracker, "LayerNormalization", strict_precision)

    def pattern(self, op, x, scale):
        return op.LayerNormalization(x, scale, _allow_other_inputs=True, _outputs=["y"])

    def inspect(self, context, x, scale, y, **_):
        node = y.producer()
        if WRITTEN_BY_PASS in node.metadata_props:  # reported by the rule that wrote it
            raise NotThisPattern("written by the pass for its statistics")
        _extra_outputs_unused(node)
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        note = _stash(node, self.strict_precision)
        x_type = dtype(x, "X")
        mixed = check_mixed(x_type, y, Scale=scale, Bias=bias)
        axis = _axis(node, x)
        for value in (scale, bias):
            if value is not None:
                check_scale(value, x, axis)
        inputs = {
            "X": x,
            "Scale": None if _is_ones(scale) else scale,
            "Bias": None if bias is None or _is_zeros(bias) else bias,
        }
        return Replacement(
            "LayerNorm",
            inputs,
            {
                "axis": axis,
                "epsilon": epsilon(attribute(node, "epsilon", 1e-5)),
                "cast_before_scale": 0,
                **({"y_float32": 1} if mixed else {}),
            },
            note,
        )


class StandardRMSNorm(FusionRule):
    """ONNX ``RMSNormalization`` (opset 23), as PyTorch's rms_norm computes it: the normalized
    value rounded, then the scale in X's type (order A)."""

    title = "RMSNorm (ONNX RMSNormalization)"
    source_op = "RMSNormalization"
    #: whether the op rounds the normalized value before its scale in float16/bfloat16
    order_a = True

    def __init__(self, tracker: Tracker, strict_precision: bool = False) -> None:
        super().__init__(tracker, self.source_op, strict_precision)

    def pattern(self, op, x, scale):
        return getattr(op, self.source_op)(x, scale, _outputs=["y"])

    def inspect(self, context, x, scale, y, **_):
        node = y.producer()
        _extra_outputs_unused(node)
        note = _stash(node, self.strict_precision)
        x_type = dtype(x, "X")
        mixed = False
        if self.order_a:
            # (RMSNormalization-23's own body rounds the normalized value to X's type and
            # multiplies it by a Scale of another type: no arithmetic to match for mixed types)
            check_type(x_type, Scale=scale, Y=y)
        else:
            mixed = check_mixed(x_type, y, Scale=scale)
        axis = _axis(node, x)
        check_scale(scale, x, axis)
        return Replacement(
            "RMSNorm",
            {"X": x, "Scale": None if _is_ones(scale) else scale},
            {
                "axis": axis,
                "epsilon": epsilon(attribute(node, "epsilon", 1e-5)),
                "cast_before_scale": int(self.order_a and x_type != FLOAT),
                **({"y_float32": 1} if mixed else {}),
            },
            note,
        )


class SimplifiedLayerNorm(StandardRMSNorm):
    """ONNX Runtime's ``SimplifiedLayerNormalization`` (RMSNorm; its kernels round once: B)."""

    title = "RMSNorm (ORT SimplifiedLayerNormalization)"
    source_op = "SimplifiedLayerNormalization"
    order_a = False


class MsSkipNorm(FusionRule):
    """com.microsoft ``SkipLayerNormalization(input, skip, gamma, beta?, bias?)`` and
    ``SkipSimplifiedLayerNormalization(input, skip, gamma, bias?)``: Sum is output 3.
    (ONNX Runtime normalizes the float32 sum before rounding it; the catalogue op normalizes the
    rounded Sum: the same definition, at most one unit in the last place apart for float16.)"""

    def __init__(self, tracker: Tracker, layer: bool, n_out: int) -> None:
        self.layer, self.n_out = layer, n_out
        self.ms_op = "SkipLayerNormalization" if layer else "SkipSimplifiedLayerNormalization"
        self.op_name = "SkipLayerNorm" if layer else "SkipRMSNorm"
        self.title = f"{self.op_name} (ORT {self.ms_op})"
        super().__init__(tracker, f"{self.ms_op}{n_out}")

    def pattern(self, op, x, residual, scale):
        names = ["y", "mean", "inv", "total"][: self.n_out]
        outs = getattr(op, self.ms_op)(
            x, residual, scale, _domain=MS_DOMAIN, _allow_other_inputs=True, _outputs=names
        )
        return (outs[0], outs[3]) if self.n_out == 4 else outs

    def inspect(self, context, x, residual, scale, y, **_):
        node = y.producer()
        for value in node.outputs[1:3]:
            if value is not None and (value.uses() or value.is_graph_output()):
                raise Rejected("the mean or inverse standard deviation output is used")
        x_type = dtype(x, "X")
        check_type(x_type, Residual=residual, Scale=scale, Y=y)
        if x.shape is None or residual.shape is None or x.shape != residual.shape:
            raise Rejected("cannot prove that input and skip have the same shape")
        check_scale(scale, x, -1)
        rest = list(node.inputs[3:])
        bias = rest.pop(0) if self.layer and rest else None
        xbias = rest.pop(0) if rest else None
        for what, value in (("Bias", bias), ("XBias", xbias)):
            if value is not None:
                check_type(x_type, **{what: value})
                check_scale(value, x, -1)
        inputs = {"X": x, "Residual": residual, "Scale": scale, "Bias": bias, "XBias": xbias}
        return Replacement(
            self.op_name,
            inputs,
            {
                "axis": -1,
                "epsilon": epsilon(attribute(node, "epsilon", 1e-12)),
                "cast_before_scale": 0,
            },
        )


def _extra_outputs_unused(node: ir.Node) -> None:
    for value in node.outputs[1:]:
        if value is not None and (value.uses() or value.is_graph_output()):
            raise Rejected(
                f"output {value.name!r} (the mean or inverse standard deviation) is used"
            )


def _stash(node: ir.Node, strict: bool) -> str:
    """The report's note on the op's statistics type (``stash_type``)."""
    stash = ir.DataType(attribute(node, "stash_type", 1))
    if stash == FLOAT:
        return ""
    try:
        return statistics_type(stash, strict)
    except Rejected:
        why = (
            " and has no DOUBLE kernels: fusing would lose the original's precision"
            if stash == ir.DataType.DOUBLE
            else " (strict precision)"
            if strict
            else ""
        )
        raise Rejected(
            f"stash_type is {stash.name}; onnxnorm computes the statistics in FLOAT{why}"
        ) from None


def _axis(node: ir.Node, x: ir.Value) -> int:
    axis = attribute(node, "axis", -1)
    rank = x.shape.rank() if x.shape is not None else None
    if rank is not None and not -rank <= axis < rank:
        raise Rejected(f"axis {axis} is out of range for X of rank {rank}")
    if axis >= 0 and rank is not None:
        axis -= rank  # negative: independent of X's rank
    elif axis >= 0:
        raise Rejected(f"axis {axis} with X of unknown rank")
    return axis


def all_equal(value: ir.Value, number: float) -> bool:
    """Whether ``value`` is a constant of ``number`` everywhere: an initializer or Constant, or a
    ConstantOfShape of it (the lowering's unit Scale, which a norm op's output never takes its
    shape from)."""
    producer = value.producer()
    if producer is not None and producer.op_type == "ConstantOfShape" and producer.domain == "":
        filled = producer.attributes.get("value")
        if filled is None:
            return number == 0
        return bool((filled.as_tensor().numpy() == number).all())
    tensor = ir.convenience.get_const_tensor(value)
    if tensor is None:
        return False
    try:
        return bool((tensor.numpy() == number).all())
    except (OSError, ValueError):  # external data that cannot be read here: keep the input
        return False


def _is_ones(value: ir.Value) -> bool:
    return all_equal(value, 1)


def _is_zeros(value: ir.Value) -> bool:
    return all_equal(value, 0)
