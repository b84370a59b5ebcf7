"""A gated norm's activation, whatever nodes the exporter wrote for it: :func:`activation`
finds ``Sigmoid(g)`` (sigmoid), SiLU as ``Mul(g, Sigmoid(g))`` (both PyTorch exporters) or ONNX's
``Swish(g)`` with alpha 1 (opset 24), and names the activations a ``GatedRMSNorm`` does not take
(GELU, tanh, ONNX Runtime's FastGelu, ...) so that a gate through one of them is reported as a
near miss. :func:`gate_of` is what the gated rules (``gated.py``) ask of a gate: its activation,
of a tensor of X's shape.
"""

from __future__ import annotations

import dataclasses
from typing import TypeGuard

import onnx_ir as ir

from onnxnorm.fusion._base import FLOAT, NotThisPattern, Rejected, attribute
from onnxnorm.fusion.ort_gated import MS_DOMAIN
from onnxnorm.fusion.residual import same_shape

#: the catalogue's ``activation`` values
SILU, SIGMOID = 0, 1
ACTIVATIONS = {SILU: "SiLU", SIGMOID: "sigmoid"}
#: ONNX Runtime's GatedRMSNorm ``activation`` attribute -> the catalogue's
MS_ACTIVATIONS = {"silu": SILU, "swish": SILU, "sigmoid": SIGMOID}
#: unary ops that are an activation, but not one a GatedRMSNorm takes: a gate through one of
#: them is a near miss
OTHER_ACTIVATIONS = frozenset(
    {
        "Celu",
        "Elu",
        "Gelu",
        "HardSigmoid",
        "HardSwish",
        "LeakyRelu",
        "Mish",
        "Relu",
        "Selu",
        "Softplus",
        "Softsign",
        "Tanh",
        "ThresholdedRelu",
    }
)
#: ONNX Runtime's activation ops, other than a GatedRMSNorm takes
OTHER_MS_ACTIVATIONS = frozenset({"BiasGelu", "FastGelu", "Gelu", "QuickGelu"})


def is_standard(node: ir.Node | None) -> TypeGuard[ir.Node]:
    """Whether ``node`` is an op of ONNX's own domain."""
    return node is not None and node.domain in ("", "ai.onnx")


@dataclasses.dataclass(frozen=True)
class Activation:
    """A gate's activation as the graph computes it."""

    #: SILU or SIGMOID (None: one a GatedRMSNorm does not take; ``problem`` says why)
    kind: int | None
    #: the value the activation is of
    gate: ir.Value
    #: why a GatedRMSNorm cannot take it ("": it can)
    problem: str = ""
    #: another activation than SiLU or sigmoid
    other: bool = False


def activation(value: ir.Value) -> Activation | None:
    """The activation that computes ``value``, or None where ``value`` is no activation at all
    (a weight, a rotary table, another tensor: not a gate). SiLU is ``Mul(g, Sigmoid(g))``
    (both exporters) or ``Swish(g)`` with alpha 1 (ONNX opset 24); sigmoid is ``Sigmoid(g)``.
    Computed in another type than float32, or through another activation, it is returned with
    the ``problem``."""
    node = value.producer()
    if node is None:
        return None
    op = node.op_type
    found: Activation | None = None
    first = node.inputs[0] if node.inputs else None
    if first is None:
        return None
    if node.domain == MS_DOMAIN and op in OTHER_MS_ACTIVATIONS:
        return Activation(None, first, _other(f"{MS_DOMAIN} {op}"), other=True)
    if not is_standard(node):
        return None
    if op == "Sigmoid":
        found = Activation(SIGMOID, first)
    elif op == "Swish":
        alpha = float(attribute(node, "alpha", 1.0))
        found = Activation(SILU, first)
        if alpha != 1.0:
            found = Activation(None, first, _other(f"Swish with alpha {alpha}"), other=True)
    elif op == "Mul" and len(node.inputs) == 2:
        for g, other in (node.inputs, reversed(node.inputs)):
            inner = other.producer() if other is not None else None
            if is_standard(inner) and inner.inputs and inner.inputs[0] is g and g is not None:
                if inner.op_type == "Sigmoid":
                    found = Activation(SILU, g)
                elif inner.op_type in OTHER_ACTIVATIONS:
                    found = Activation(None, g, _other(f"g * {inner.op_type}(g)"), other=True)
                if found is not None:
                    break
        if found is None:
            return None
    elif op in OTHER_ACTIVATIONS:
        return Activation(None, first, _other(op), other=True)
    else:
        return None
    t = value.dtype
    if found.kind is not None and t is not None and t != FLOAT:
        return Activation(
            None,
            found.gate,
            f"the gate's {ACTIVATIONS[found.kind]} is computed in {t.name}; GatedRMSNorm "
            "computes it in float32",
        )
    return found


def _other(what: str) -> str:
    return f"the gate's activation is {what}; GatedRMSNorm takes SiLU or sigmoid"


def gate_of(value: ir.Value, x: ir.Value) -> Activation:
    """The activation of a gate of X's shape that computes ``value``: NotThisPattern where
    ``value`` is no activation or broadcasts against X as a weight would (lower rank), Rejected
    where it is not a gate the op takes."""
    act = activation(value)
    if act is None:
        raise NotThisPattern(f"{value.name!r} is no gate activation")
    rank = act.gate.shape.rank() if act.gate.shape is not None else None
    x_rank = x.shape.rank() if x.shape is not None else None
    if rank is not None and x_rank is not None and rank < x_rank:
        raise NotThisPattern(f"{act.gate.name!r} has a lower rank than X: a weight, not a gate")
    if act.problem:
        if act.other:
            # another activation of a tensor of X's very shape is a near miss; of another shape
            # it is some other computation
            try:
                same_shape(act.gate, x, "the gate and X", "Mul")
            except Rejected:
                raise NotThisPattern(act.problem) from None
        raise Rejected(act.problem)
    same_shape(act.gate, x, "the gate and X", "Mul")
    return act
