"""Writing one onnxnorm node in standard or ONNX Runtime ops: the node writer of
:mod:`onnxnorm.fusion.lowering` (which decides which nodes, in which form, and the model's
imports). ``target`` says what the norm becomes ("ort": ONNX Runtime's ops, "onnx": ONNX's,
"decomposed": plain ops, ``onnxnorm.fusion.decomposed``); the arithmetic around it is the
catalogue's own, written by the builder of its function bodies (``functions.scale_and_shift``).
How each case is written and why it is exact: the lowering module's docstring.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnxnorm.fusion import decomposed, ort_gated
from onnxnorm.fusion.ort_gated import MS_DOMAIN
from onnxnorm.ops import catalogue, functions
from onnxnorm.ops.functions import Note

_FLOAT = TensorProto.FLOAT


class NormWriter(functions.OpsetWriter):
    """Writes onnxnorm nodes of ``model`` (of standard opset ``opset``) for ``target`` into
    ``new_nodes``; ``weights``: initializers kept apart from the model."""

    def __init__(
        self,
        model: onnx.ModelProto,
        target: str,
        opset: int,
        weights: Sequence[onnx.TensorProto] = (),
    ):
        self.target, self.opset = target, opset
        self.notes: list[Note] = []
        self.new_nodes: list[onnx.NodeProto] = []
        self.prefix = ""
        self.uses_ms = False
        #: how many onnxnorm nodes stay (without a body): the opset cannot express them
        self.kept = 0
        self.count = 0
        #: the element type of the X of the node being lowered
        self.t: int | None = None
        #: whether that node is the mixed form (a float32 Y of a 16-bit X)
        self.mixed = False
        # X's type and dims, inferred where undeclared (without them a node takes the safe path)
        self.types, self.dims = functions.node_types(
            model, list(functions.onnxnorm_nodes(model)), opset, weights, all_x=True
        )
        self.model = model
        #: the initializers by name, those kept apart from the model included (a constant
        #: Scale folded into ORT's GatedRMSNorm is read from them)
        self.initializers = {t.name: t for t in [*model.graph.initializer, *weights]}

    # -- emitting nodes -------------------------------------------------------------------
    def _name(self, hint: str) -> str:
        self.count += 1
        return f"{self.prefix}{hint}_{self.count}"

    def emit(
        self, op: str, inputs: list[str], outs: list[str] | None = None, domain: str = "", **attrs
    ) -> list[str]:
        outs = outs or [self._name(op)]
        self.new_nodes.append(
            helper.make_node(op, inputs, outs, name=self._name(op), domain=domain, **attrs)
        )
        return outs

    def __call__(self, op: str, *inputs: str, out: str | None = None, **attrs) -> str:
        """One node of one output (``out``, or a new name), for ``functions.scale_and_shift``
        as for the rest."""
        return self.emit(op, list(inputs), outs=[out] if out else None, **attrs)[0]

    def float32(self, value: str) -> str:
        return value if self.types.get(value) == _FLOAT else self("Cast", value, to=_FLOAT)

    def round(self, value: str) -> str:
        """``value`` rounded to the type of the node's X, kept in float32."""
        return self("Cast", self("Cast", value, to=self.x_type), to=_FLOAT)

    @property
    def x_type(self) -> int:
        """The element type of the node's X, which a node lowered to standard ops has."""
        if self.t is None:
            raise ValueError("the element type of X is unknown")
        return self.t

    def _declare(self, name: str, x: str) -> None:
        """A new value of X's type and ``x``'s dims (where known)."""
        self.types[name] = self.x_type
        dims = self.dims.get(x)
        if dims is None:
            self.dims.pop(name, None)
        else:
            self.dims[name] = dims

    # -- the forms of a node ----------------------------------------------------------------
    def _float(self, spec, attrs, args, outs) -> tuple[str, str]:
        if spec.residual == "none":
            return self._norm(spec, attrs, args["X"], args["Scale"], args["Bias"], outs["Y"]), ""
        if spec.residual == "skip":
            return self._skip(spec, attrs, args, outs)
        inner = self._name("inner")
        self._declare(inner, args["X"])
        k1 = self._norm(spec, attrs, args["X"], args["InnerScale"], args["InnerBias"], inner)
        fake = dict(args, X=inner, XBias=None)
        k2, _ = self._skip(spec, {**attrs, "alpha": 1.0}, fake, outs)
        return f"{k1} + {k2}", ""

    def _quantized(self, spec, attrs, args, outs) -> tuple[str, str]:
        """The norm (its Y in X's type: Y_float, or a new value), then the quantizer."""
        base = catalogue.get(spec.norm_op)
        y_float = outs["Y_float"] or self._name("y_float")
        self._declare(y_float, args["X"])
        norm_args = {p.name: args[p.name] for p in base.inputs}
        norm_outs = {"Y": y_float, "Sum": outs.get("Sum")}
        emitted, reason = self._float(
            base,
            {a.name: attrs.get(a.name, a.default) for a in base.attributes},
            norm_args,
            norm_outs,
        )
        value = self.float32(y_float)
        if spec.quantize == "dynamic":
            self.emit(
                "DynamicQuantizeLinear",
                [value],
                outs=[outs["Y"], outs["Y_scale"] or "", outs["Y_zero_point"] or ""],
            )
            return f"{emitted} + DynamicQuantizeLinear", reason
        inputs = [value, self.float32(args["Y_scale"])]
        if args["Y_zero_point"] is not None:
            inputs.append(args["Y_zero_point"])
        self.emit("QuantizeLinear", inputs, outs=[outs["Y"]])
        return f"{emitted} + QuantizeLinear", reason

    def _core_op(self, spec: catalogue.OpSpec) -> str | None:
        """The target's op for the norm (None: it has none); all are in the ONNX domain."""
        if self.target == "decomposed":
            return "decomposed"
        if spec.norm == "layer":
            return "LayerNormalization" if self.target == "ort" or self.opset >= 17 else None
        if self.target == "ort":
            return "SimplifiedLayerNormalization"
        return "RMSNormalization" if self.opset >= 23 else None

    def _rank(self, name: str) -> int | None:
        d = self.dims.get(name)
        return None if d is None else len(d)

    def _normalized_count(self, x: str, axis: int) -> int | None:
        if axis < 0:
            return -axis
        rank = self._rank(x)
        return None if rank is None else rank - axis

    def _direct(self, spec, attrs, x, scale, bias) -> str | None:
        """Why the one op with Scale and Bias is not exact here (None: it is)."""
        t = self.t
        if t != _FLOAT:
            return "float16/bfloat16: ORT and the ONNX standard round in different orders"
        if attrs.get("scale_offset", 0.0):
            return "scale offset"
        count = self._normalized_count(x, attrs["axis"])
        for what, value in (("Scale", scale), ("Bias", bias)):
            if value is None:
                continue
            if self.types.get(value) != t:
                return f"{what} is not of X's type"
            if count is None or self._rank(value) != count:
                return f"{what} does not span exactly the normalized dims"
        if bias is not None and spec.norm == "rms":
            return "the RMS op has no Bias"
        return None

    def _norm(self, spec, attrs, x, scale, bias, y) -> str:
        op, t = self._core_op(spec), self.t
        if op is None:  # (node() inlines the body instead)
            raise ValueError(f"opset {self.opset} has no standard op of {spec.name}'s norm")
        axis, eps = attrs["axis"], float(attrs["epsilon"])
        if op == "decomposed":
            count = self._normalized_count(x, axis)
            if count is None:  # (_unavailable refuses this form first)
                raise ValueError("the decomposed form needs the rank of X")
            normed = decomposed.norm(self, spec.norm, self.float32(x), count, eps)
            return self._scaled(spec, attrs, normed, scale, bias, y, "plain ops")
        if self._direct(spec, attrs, x, scale, bias) is None and scale is not None:
            inputs = [x, scale] + ([bias] if bias is not None else [])
            self.emit(op, inputs, outs=[y], axis=axis, epsilon=eps)
            return op
        # the norm with a unit Scale on X in float32, then the catalogue's own arithmetic
        xf = x if t == _FLOAT else self("Cast", x, to=_FLOAT)
        ones = self.ones(xf, axis, self._normalized_count(x, axis))
        normed = self(op, xf, ones, axis=axis, epsilon=eps)
        return self._scaled(spec, attrs, normed, scale, bias, y, f"{op} (unit scale)")

    def _scaled(self, spec, attrs, normed, scale, bias, y, what: str) -> str:
        """Scale and Bias on ``normed`` (float32) in the catalogue's own arithmetic, rounded
        to X's type into ``y``."""
        t = self.t
        mixed = self.mixed and spec.residual == "none"
        value = functions.scale_and_shift(
            self,
            normed,
            scale,
            bias,
            float(attrs.get("scale_offset", 0.0)) or None,
            bool(attrs["cast_before_scale"]) and t != _FLOAT,
            round_last=not mixed,
        )
        if t == _FLOAT or mixed:
            self("Identity", value, out=y)
        else:
            self("Cast", value, to=t, out=y)
        return f"{what} + float32 arithmetic"

    def _skip(self, spec, attrs, args, outs) -> tuple[str, str]:
        x, residual, scale, bias, xbias = (
            args["X"],
            args["Residual"],
            args["Scale"],
            args["Bias"],
            args["XBias"],
        )
        y, total = outs["Y"], outs["Sum"] or self._name("sum")
        t = self.t
        self._declare(total, x)
        alpha = float(attrs["alpha"])
        why_not = self._direct(spec, attrs, x, scale, bias)
        if why_not is None and self.target == "ort" and scale is not None:
            if attrs["axis"] not in (-1, (self._rank(x) or 0) - 1) or self._rank(x) not in (2, 3):
                why_not = "the Skip ops normalize the last axis of a 2-D or 3-D input only"
            elif self._rank(scale) != 1:
                why_not = "the Skip ops take a 1-D gamma"
            elif xbias is not None and (self.types.get(xbias) != t or self._rank(xbias) != 1):
                why_not = "XBias is not a 1-D tensor of X's type"
        if why_not is None and self.target == "ort" and scale is not None:
            if alpha != 1.0:
                residual = self("Mul", residual, self.scalar(alpha))
            op = (
                "SkipLayerNormalization"
                if spec.norm == "layer"
                else "SkipSimplifiedLayerNormalization"
            )
            inputs = [x, residual, scale] + ([bias or ""] if spec.norm == "layer" else [])
            if xbias is not None:
                inputs.append(xbias)
            while inputs and not inputs[-1]:
                inputs.pop()
            self.emit(
                op,
                inputs,
                outs=[y, "", "", outs["Sum"] or ""],
                domain=MS_DOMAIN,
                epsilon=float(attrs["epsilon"]),
            )
            self.uses_ms = True
            return f"{MS_DOMAIN}.{op}" + (" after Mul(alpha)" if alpha != 1.0 else ""), ""
        # the sum as the catalogue computes it: in float32, rounded once to X's type
        if t == _FLOAT and alpha == 1.0 and xbias is None:
            self("Add", residual, x, out=total)
        else:
            acc = self("Cast", residual, to=_FLOAT) if t != _FLOAT else residual
            if alpha != 1.0:
                acc = self("Mul", acc, self.scalar(alpha))
            acc = self("Add", acc, x if t == _FLOAT else self("Cast", x, to=_FLOAT))
            if xbias is not None:
                acc = self("Add", acc, self.float32(xbias))
            self("Cast", acc, to=t, out=total)
        kind = self._norm(spec, attrs, total, scale, bias, y)
        return f"Add + {kind}", (why_not or "") if self.target == "ort" else ""

    # -- the norms of hybrid models ----------------------------------------------------------
    def _hybrid(self, node, spec, attrs, args, outs) -> tuple[str, str]:
        """GatedRMSNorm and L2Norm, which ONNX has no op of: ONNX Runtime's GatedRMSNorm where
        it is exact (``ort``), else the function body."""
        if spec.norm == "l2" and self.target == "decomposed":
            count = self._normalized_count(args["X"], attrs["axis"])
            if count is None:  # (_unavailable refuses this form first)
                raise ValueError("the decomposed form needs the rank of X")
            normed = decomposed.norm(
                self, "l2", self.float32(args["X"]), count, float(attrs["epsilon"])
            )
            if self.t == _FLOAT:
                self("Identity", normed, out=outs["Y"])
            else:
                self("Cast", normed, to=self.x_type, out=outs["Y"])
            return "plain ops", ""
        if spec.norm == "l2":
            return self._inline(
                node,
                "no op of ONNX or ONNX Runtime divides by sqrt(sum(x^2) + epsilon) "
                "(LpNormalization has no epsilon and gives 0 for an all-zero row)",
            )
        if self.target == "onnx":
            return self._inline(node, "ONNX has no gated RMS norm")
        why, scale = ort_gated.scale_for(
            attrs, args, self.x_type, self.dims, self.types, self._initializer
        )
        if why or scale is None:  # (scale_for gives a scale where it gives no reason)
            return self._inline(node, f"not ONNX Runtime's GatedRMSNorm: {why}")
        if isinstance(scale, np.ndarray):  # ones, or Scale + scale_offset: a new initializer
            scale = self._constant_scale(scale, f"{args['Scale']}_ort" if args["Scale"] else "ones")
        self.emit(
            "GatedRMSNorm",
            [args["X"], scale, args["Gate"]],
            outs=[outs["Y"]],
            domain=MS_DOMAIN,
            activation=ort_gated.MS_ACTIVATION_NAMES[int(attrs["activation"])],
            epsilon=float(attrs["epsilon"]),
        )
        self.uses_ms = True
        return f"{MS_DOMAIN}.GatedRMSNorm", ""

    def _initializer(self, name: str) -> np.ndarray | None:
        """The values of the initializer ``name`` held in the model's file (None: not an
        initializer, or its data is elsewhere)."""
        tensor = self.initializers.get(name)
        if tensor is None or tensor.data_location == TensorProto.EXTERNAL:
            return None
        try:
            return numpy_helper.to_array(tensor)
        except (OSError, ValueError):
            return None

    def _constant_scale(self, values: np.ndarray, hint: str) -> str:
        """A new initializer of ``values`` in the node's X type."""
        taken = {t.name for t in self.model.graph.initializer} | set(self.types)
        name, index = f"{hint}_scale", 0
        while name in taken:
            index += 1
            name = f"{hint}_scale_{index}"
        t = self.x_type
        array = values.astype(helper.tensor_dtype_to_np_dtype(t))
        tensor = helper.make_tensor(
            name,
            t,
            list(array.shape),
            array.view(np.uint16).tobytes() if t == TensorProto.BFLOAT16 else array.tobytes(),
            raw=True,
        )
        self.model.graph.initializer.append(tensor)
        self.types[name], self.dims[name] = t, list(array.shape)
        return name

    def _keep(self, node: onnx.NodeProto, reason: str) -> tuple[str, str]:
        """``node`` as it is, without a body: the model's opset cannot express it."""
        kept = onnx.NodeProto()
        kept.CopyFrom(node)
        kept.overload = ""
        self.new_nodes.append(kept)
        self.kept += 1
        return functions.WITHOUT_BODY, reason

    # -- inlining the catalogue's function body --------------------------------------------
    def _inline(self, node: onnx.NodeProto, reason: str) -> tuple[str, str]:
        spec = catalogue.get(node.op_type)
        body = functions.function_proto(
            node.op_type, functions.node_variant(node, self.opset, self.t), self.opset
        )
        values = {
            **spec.defaults,
            **{a.name: helper.get_attribute_value(a) for a in node.attribute},
        }
        rename = dict(zip(body.input, node.input))
        for i, formal in enumerate(body.output):
            actual = node.output[i] if i < len(node.output) and node.output[i] else None
            rename[formal] = actual or self._name(formal)
        for inner in body.node:
            new = onnx.NodeProto()
            new.CopyFrom(inner)
            for i, name in enumerate(new.input):
                if name:
                    new.input[i] = rename.setdefault(name, self.prefix + name)
            for i, name in enumerate(new.output):
                new.output[i] = rename.setdefault(name, self.prefix + name)
            new.name = self._name(new.op_type)
            for attr in new.attribute:
                if attr.ref_attr_name:
                    resolved = helper.make_attribute(attr.name, values[attr.ref_attr_name])
                    if attr.type == onnx.AttributeProto.FLOAT:
                        resolved = helper.make_attribute(
                            attr.name, float(values[attr.ref_attr_name])
                        )
                    attr.CopyFrom(resolved)
            self.new_nodes.append(new)
        return "inlined function body", reason
