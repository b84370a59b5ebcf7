"""The Q/K norms before a ``com.microsoft GroupQueryAttention`` that rotates Q and K itself
(``do_rotary = 1``, as onnxruntime-genai's model builder writes Qwen3-style models): reported as
a near miss of the rotary ops, not fused.

Fusing them is possible exactly: with ``do_rotary = 0`` the rotary op would take
GroupQueryAttention's ``cos_cache`` / ``sin_cache`` and the positions it derives, which its
schema (ONNX Runtime 1.32) defines as ``max(seqlens_k + 1 - S, 0) + s`` for row ``s`` of ``S``
new tokens when it has neither ``position_ids`` nor ``query_seqlens``; a prototype built so
matched the builder's graph bit for bit in float16 and within a float32 unit in the last place
on ONNX Runtime's CPU provider, in first, padded first, decode and mixed-length steps. It is not
done because it gains nothing worth its cost: on the CPU the rotation moved out of
GroupQueryAttention saved nothing in a decode step (within 0.4 µs of 35-55 µs per layer) and
1-4 % of the norm and attention time of 8- to 128-token steps (32 query and 8 key heads of
128); on CUDA GroupQueryAttention rotates in the kernel that appends to the KV cache, and the
norms go into its own norm weights (``gqa_writer.py``, ``--for ort-cuda``), which need
``do_rotary = 1``; and every runtime without the onnxnorm library would get a rotary op lowered
to a norm op, a RotaryEmbedding and a position subgraph in place of the rotation
GroupQueryAttention does anyway (docs/fusion.md).
"""

from __future__ import annotations

import onnx_ir as ir

from onnxnorm.fusion.ort_gated import MS_DOMAIN
from onnxnorm.fusion.report import Tracker
from onnxnorm.ops import catalogue

#: the report's title
TITLE = "Q/K norm and GroupQueryAttention's own rotary"
REASON = (
    "GroupQueryAttention rotates Q and K itself (do_rotary = 1); moving its rotation into a "
    "rotary op would be exact but is not worth it (onnxnorm/fusion/rotary_gqa.py)"
)
#: the views between a norm and GroupQueryAttention's Q or K
_VIEWS = {"Reshape", "Identity", "Cast", "Transpose"}
_NORMS = {"RMSNorm", "LayerNorm"}


def _norm_before(value: ir.Value | None, depth: int = 4) -> bool:
    """Whether ``value`` is an onnxnorm norm's output through at most ``depth`` views."""
    while value is not None and depth >= 0:
        node = value.producer()
        if node is None:
            return False
        if node.domain == catalogue.DOMAIN:
            return node.op_type in _NORMS
        if node.domain not in ("", "ai.onnx") or node.op_type not in _VIEWS:
            return False
        value, depth = node.inputs[0], depth - 1
    return False


def report(model: ir.Model, tracker: Tracker) -> int:
    """Records each GroupQueryAttention with ``do_rotary = 1`` whose Q and K come from onnxnorm
    norms as a near miss of ``tracker`` (its title registered only then); returns how many."""
    found = 0
    for graph in model.graphs():
        for node in graph:
            if node.op_type != "GroupQueryAttention" or node.domain != MS_DOMAIN:
                continue
            rotary = node.attributes.get("do_rotary")
            if rotary is None or rotary.as_int() != 1 or len(node.inputs) < 2:
                continue
            if _norm_before(node.inputs[0]) and _norm_before(node.inputs[1]):
                if not found:
                    tracker.register(TITLE)
                tracker.checked(TITLE, node, REASON)
                found += 1
    return found
