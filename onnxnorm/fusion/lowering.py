"""Lowering onnxnorm nodes to a fusion target (docs/design.md).

``lower(model, target)`` returns a new model; the input is left as it is. This module walks
the graphs and picks each node's form; ``norm_writer.py`` writes a node in the form picked
(``rope_writer.py`` a rotary op).

- ``function``: onnxnorm nodes with their model-local function bodies (``attach_functions``).
- ``fused``: onnxnorm nodes without bodies (``strip_functions``; the library is required).
- ``ort``: ONNX Runtime's own ops: LayerNormalization, SimplifiedLayerNormalization (ORT
  registers both in the ONNX domain, as contrib ops from version 1 and LayerNormalization as
  ONNX's from 17) and com.microsoft SkipLayerNormalization / SkipSimplifiedLayerNormalization;
  onnxruntime 1.32 loads and runs all four in models of every standard opset from 7 (measured);
  for the rotary ops com.microsoft RotaryEmbedding besides.
- ``onnx``: standard ONNX only: LayerNormalization (opset >= 17), RMSNormalization
  (opset >= 23), and RotaryEmbedding (opset >= 23) for the rotary ops; below those opsets the
  catalogue's own function body is inlined.

Every opset from 7 is lowered; what the lowering writes besides the norm ops (shapes, constants,
casts) is in the model's own opset's ops, through the body builder's ``functions.OpsetWriter``.
A node that the model's opset cannot express at all (``functions.body_problem``: bfloat16 below
opset 13, a quantizer older than its op, a float8 zero point below 19) stays an onnxnorm node
without a body, which needs the onnxnorm library, and its note says why.

Exactness. Measured with onnxruntime 1.32 on CPU: its LayerNormalization,
SimplifiedLayerNormalization and RMSNormalization kernels round once at the end for float16
and bfloat16 (rounding order B, ``cast_before_scale = 0``), bit for bit; its Skip kernels
normalize the float32 sum before rounding it, which is up to one unit in the last place away
from the catalogue (which normalizes the rounded Sum) for float16/bfloat16. The ONNX standard's
own definitions of LayerNormalization/RMSNormalization round in order A. So a norm op with its
Scale and Bias is emitted only where every reading gives the same bits:

- float32, Scale and Bias of X's type spanning exactly the normalized dims, no scale offset:
  the one op with Scale and Bias (Skip ops included, alpha through a Mul before them);
- otherwise the norm op with a unit Scale, applied to X in float32 (so the normalized value is
  the same in every reading), followed by the scale offset, Scale and Bias in float32, rounded
  to X's type after each step in order A and once at the end in order B: the catalogue's own
  arithmetic, written by the builder of its function bodies (``functions.scale_and_shift``).

Where a target has no op at all (RMSNorm at opset < 23 for ``onnx``), the function body is
inlined. The norms of hybrid models have no standard op: ``onnx`` inlines the body of
GatedRMSNorm and L2Norm (an ``LpNormalization`` has no epsilon and gives 0 for an all-zero row
in ONNX Runtime, where the division gives NaN), and so does ``ort`` for L2Norm. ``ort`` writes
ONNX Runtime's ``com.microsoft GatedRMSNorm`` for a GatedRMSNorm it computes exactly
(``ort_gated.py`` says where), and inlines the function body elsewhere, with the reason.

The rotary ops (``catalogue.ROTARY_OPS``: the Q/K norm and RoPE, written by ``rope_writer.py``)
become the norm op of the target over each head (each token: per_head = 0), with a unit scale
and the weights after it as above, for Q and for K, and a RotaryEmbedding: ONNX's (opset 23;
``onnx``) or ONNX Runtime's ``com.microsoft RotaryEmbedding`` (``ort``, at every opset), with the
Transposes and Reshapes of the layouts, in the order of ``rotary_first``. RotaryEmbedding takes
one angle per rotated pair: Cos and Sin of one per pair are taken as they are (per token: as
``onnx``'s op takes them, expanded to Q's batch where they hold one row for it); one per value
only where both are initializers whose halves (interleaved: pairs) hold the same bits, their
first halves then written as new initializers. ONNX Runtime's op gathers its caches by position
ids, so ``ort`` needs the node's PositionIds. Elsewhere the function body is inlined, with the
reason: L2NormRotary (no op of ONNX or ONNX Runtime is its norm), ``onnx`` below opset 23, Cos of
one angle per value not proved to repeat (per token, from the model's own rotary: the common
case of exported Hugging Face models), ``ort`` without PositionIds, Q or K of a head size or head
count not known, and rotary_in_t = 1 for float16 / bfloat16 (below).

Measured with onnxruntime 1.32 on CPU (``tests/fusion/test_rotary_lowering.py`` checks the
float16 and bfloat16 findings): ONNX's RotaryEmbedding-23 and com.microsoft's compute float16 in
float32 and round once (their float16 results are the bits of the float32 op's rounded to
float16, in 262,144 of 262,144 values; rounding each product and the sum to float16 agrees
with 66% of them); neither has a bfloat16 kernel (com.microsoft's: not implemented; ONNX's falls
back to its function, whose bfloat16 Mul ORT's CPU provider has no kernel of); for float32 both
round the first product and take the second in one fused multiply-add (``fma(cos, x1, -(sin *
x2))``), within a float32 unit in the last place of the products rounded apart; com.microsoft's
needs ``num_heads`` for a partial rotation, and neither broadcasts per-token caches of one row
over the batch. ONNX's own definition of RotaryEmbedding (its function) rounds each step in T
(rotary_in_t = 1), ONNX Runtime's kernel once (rotary_in_t = 0), so for float16 / bfloat16 the
op is run on float32 values (Casts around it), where every reading computes in float32 and
rounds once to Q's type: rotary_in_t = 0, as the body computes it (over the test matrix the
same bits as the reference in every value, and as the body in all but 4 in 100,000, where the
fused multiply-add and the body's rounded products round apart); ``ort`` runs com.microsoft's
op on float16 values directly where Cos and Sin are float16 too (the same bits, measured).
rotary_in_t = 1 (each product rounded to Q's type, as eager PyTorch computes) is no reading of
ONNX Runtime's, so its 16-bit nodes get the body.

Written for a runtime whose ``rms`` forms start with ``attention`` (``--for ort-cuda``), the
per-head Q/K RMSNorms before a ``com.microsoft GroupQueryAttention`` become that op's own
``q_norm_weight`` / ``k_norm_weight`` where ONNX Runtime computes exactly the same norm there
(``gqa_writer.py`` says where), before any other node is written; the others take the next form.

A quantized op becomes its norm, lowered as above, and the QuantizeLinear or
DynamicQuantizeLinear it stands for (after a Cast to float32 for a float16 / bfloat16 X, where
the quantizer computes in float32 anyway), its zero point as given: a float8e4m3fn zero point
gives a QuantizeLinear to float8 (with its default ``saturate = 1``, which the op computes),
which needs opset 19 or newer. ``lower_with_notes`` also says, per node, what was emitted and
why.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import onnx
from onnx import helper

from onnxnorm import targets
from onnxnorm.fusion import gqa_writer
from onnxnorm.fusion.ort_gated import MS_DOMAIN, ms_gated_rms_norm_problem
from onnxnorm.fusion.rope_writer import ROTARY_OPSET, RopeWriter
from onnxnorm.ops import catalogue, functions
from onnxnorm.ops.functions import Note

__all__ = ["Note", "lower", "lower_with_notes", "ms_gated_rms_norm_problem", "op_types"]


def lower(
    model: onnx.ModelProto, target: str = targets.DEFAULT, runtime: str | None = None
) -> onnx.ModelProto:
    """``model`` with its onnxnorm nodes written for ``target``, or node by node in the forms
    ``runtime`` runs best (a name of :data:`onnxnorm.targets.RUNTIMES`; it takes the place of
    the target) (a new model)."""
    return lower_with_notes(model, target, runtime=runtime)[0]


def lower_with_notes(
    model: onnx.ModelProto,
    target: str = targets.DEFAULT,
    weights: Sequence[onnx.TensorProto] = (),
    runtime: str | None = None,
) -> tuple[onnx.ModelProto, list[Note]]:
    """:func:`lower`, and a note per node (``function``: per node left without a body);
    ``weights``: initializers kept apart from ``model`` (``fuse_detached``), whose types and
    shapes the lowering needs all the same."""
    targets.check(target)
    forms = None
    if runtime is not None:
        forms = targets.RUNTIMES[targets.check_runtime(runtime)].forms
    out = onnx.ModelProto()
    out.CopyFrom(model)
    notes: list[Note] = []
    if forms is None and target == "function":
        return functions.attach_functions(out, notes), notes
    if forms is None and target == "fused":
        return functions.strip_functions(out), []
    opset = functions.model_opset(out) or functions.MIN_OPSET
    lowerer = _Lowerer(out, target, opset, weights, forms)
    if forms is not None and gqa_writer.ATTENTION in forms.get("rms", ()):
        folded, lowerer.attention = gqa_writer.fold_norms(
            out, lowerer.types, lowerer.dims, lowerer.initializers
        )
        lowerer.notes += folded
    lowerer.graph(out.graph)
    if lowerer.library:  # nodes kept as onnxnorm ops, with their bodies
        functions.attach_functions(out, notes)
        return out, lowerer.notes + notes
    keep = [f for f in out.functions if f.domain != catalogue.DOMAIN]
    del out.functions[:]
    out.functions.extend(keep)
    imports = [i for i in out.opset_import if i.domain != catalogue.DOMAIN or lowerer.kept]
    if lowerer.uses_ms and not any(i.domain == MS_DOMAIN for i in imports):
        imports.append(helper.make_opsetid(MS_DOMAIN, 1))
    del out.opset_import[:]
    out.opset_import.extend(imports)
    if functions.model_opset(out) is None and lowerer.kept < len(lowerer.notes):
        functions.set_opset(out, "", opset)  # the standard ops written are of this opset
    return out, lowerer.notes


#: what each form of a runtime's table is written as: the lowering's target for it
_FORM_TARGETS = {"contrib": "ort", "standard": "onnx", "decomposed": "decomposed"}


class _Lowerer(RopeWriter):
    """Walks the model's graphs and writes each onnxnorm node for ``target``, or in the first
    form of its family in ``forms`` (a runtime's, ``targets.RUNTIMES``) it can take."""

    def __init__(
        self,
        model: onnx.ModelProto,
        target: str,
        opset: int,
        weights: Sequence[onnx.TensorProto] = (),
        forms: Mapping[str, tuple[str, ...]] | None = None,
    ):
        super().__init__(model, target, opset, weights)
        #: a runtime's forms by family (``targets.RUNTIMES``): chosen node by node
        self.forms = forms
        #: how many onnxnorm nodes a runtime's forms keep as they are (the ``library`` form)
        self.library = 0
        #: why each Q/K norm before a GroupQueryAttention was not written into it, by the name
        #: of its output (the ``attention`` form: ``gqa_writer.fold_norms``)
        self.attention: dict[str, str] = {}

    # -- the graph ------------------------------------------------------------------------
    def graph(self, graph: onnx.GraphProto) -> None:
        nodes = list(graph.node)
        result: list[onnx.NodeProto] = []
        for node in nodes:
            if node.domain != catalogue.DOMAIN:
                for attr in node.attribute:  # subgraphs first, in place
                    if attr.type == onnx.AttributeProto.GRAPH:
                        self.graph(attr.g)
                    elif attr.type == onnx.AttributeProto.GRAPHS:
                        for sub in attr.graphs:
                            self.graph(sub)
                result.append(node)
                continue
            self.new_nodes = []
            self.prefix = f"{node.name or node.op_type}/lowered{len(self.notes)}/"
            emitted, reason = self.node(node)
            result.extend(self.new_nodes)
            self.notes.append(Note(node.name or node.op_type, node.op_type, emitted, reason))
        del graph.node[:]
        graph.node.extend(result)

    def node(self, node: onnx.NodeProto) -> tuple[str, str]:
        spec = catalogue.get(node.op_type)
        attrs = {**spec.defaults, **{a.name: helper.get_attribute_value(a) for a in node.attribute}}
        args = {
            p.name: (node.input[i] if i < len(node.input) and node.input[i] else None)
            for i, p in enumerate(spec.inputs)
        }
        outs = {
            p.name: (node.output[i] if i < len(node.output) and node.output[i] else None)
            for i, p in enumerate(spec.outputs)
        }
        x = args[spec.inputs[0].name]  # X (a rotary op's Q)
        self.t = self.types.get(x) if x is not None else None
        #: the mixed form: a float32 Y of a 16-bit X
        self.mixed = bool(attrs.get("y_float32", 0))
        if self.forms is not None:
            return self._by_forms(node, spec, attrs, args, outs)
        return self._lower(node, spec, attrs, args, outs)

    def _lower(self, node, spec, attrs, args, outs) -> tuple[str, str]:
        """``node`` written for ``self.target``."""
        x, t = args[spec.inputs[0].name], self.t
        problem = functions.node_problem(node, self.opset, self.types)
        if problem:
            return self._keep(node, problem)
        if x is None or t is None:
            return self._inline(node, f"the element type of {spec.inputs[0].name} is unknown")
        if spec.rotary:
            return self._rotary(node, spec, attrs, args, outs)
        if spec.gated or spec.norm == "l2":
            return self._hybrid(node, spec, attrs, args, outs)
        if self._core_op(spec) is None:
            core = (
                "RMSNormalization (needs 23)"
                if spec.norm == "rms"
                else "LayerNormalization (needs 17)"
            )
            return self._inline(node, f"opset {self.opset} has no standard {core}")
        if self.opset < 9 and self._normalized_count(x, attrs["axis"]) is None:
            return self._inline(
                node,
                f"opset {self.opset} has no ConstantOfShape for a unit "
                "scale, and the rank of X is unknown",
            )
        if spec.quantize != "none":
            return self._quantized(spec, attrs, args, outs)
        return self._float(spec, attrs, args, outs)

    def _by_forms(self, node, spec, attrs, args, outs) -> tuple[str, str]:
        """``node`` in the first form of its family (``self.forms``) it can be written in;
        the reason names the forms passed over."""
        family = "l2" if spec.norm == "l2" else "gated" if spec.gated else spec.norm
        if spec.rotary:
            family = targets.ROTARY
        passed: list[str] = []
        for form in (self.forms or {}).get(family, ("body",)):
            if form == gqa_writer.ATTENTION:  # (written before the walk, where it could be)
                why = self.attention.get(node.output[0]) if node.output else None
                if why:
                    passed.append(f"not {form}: {why}")
                continue
            if form == "library":
                kept = onnx.NodeProto()
                kept.CopyFrom(node)
                self.new_nodes.append(kept)
                self.library += 1
                return "onnxnorm op", "; ".join(passed)
            if form == "body":
                problem = functions.node_problem(node, self.opset, self.types)
                if problem:
                    return self._keep(node, problem)
                return self._inline(node, "; ".join(passed))
            why = self._unavailable(form, family, spec, attrs, args[spec.inputs[0].name])
            if why:
                passed.append(f"not {form}: {why}")
                continue
            self.target = _FORM_TARGETS[form]
            emitted, reason = self._lower(node, spec, attrs, args, outs)
            return emitted, "; ".join([*passed, reason] if reason else passed)
        raise ValueError(f"no form of {family!r} ends in 'body' or 'library'")

    def _unavailable(self, form: str, family: str, spec, attrs, x: str | None) -> str:
        """Why ``node`` cannot be written in ``form`` ("": it can)."""
        if family == targets.ROTARY:
            return self._rotary_unavailable(form, spec)
        if form == "standard":
            if family in ("gated", "l2"):
                return "ONNX has no such op"
            self.target = "onnx"
            if self._core_op(spec) is None:
                needs = "RMSNormalization (23)" if family == "rms" else "LayerNormalization (17)"
                return f"opset {self.opset} has no {needs}"
        elif form == "contrib":
            if family == "l2":
                return "ONNX Runtime has no such op"
        elif form == "decomposed":
            if family == "gated":
                return "not spelled out but as its function body"
            if x is None or self._normalized_count(x, attrs["axis"]) is None:
                return "the rank of X is unknown"
        return ""

    def _rotary_unavailable(self, form: str, spec) -> str:
        """Why a rotary node cannot be written in ``form`` ("": it may be; the lowering says
        where not, and inlines the body)."""
        if form == "decomposed":
            return "not spelled out but as its function body"
        if spec.norm == "l2":
            return f"{'ONNX' if form == 'standard' else 'ONNX Runtime'} has no L2 norm op"
        if form == "standard" and self.opset < ROTARY_OPSET:
            return f"opset {self.opset} has no RotaryEmbedding (needs {ROTARY_OPSET})"
        return ""


def op_types(model: onnx.ModelProto) -> Iterator[tuple[str, str]]:
    """(domain, op_type) of every node in the model's graphs."""
    for graph in functions.all_graphs(model.graph):
        for node in graph.node:
            yield node.domain, node.op_type
