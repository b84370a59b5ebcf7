"""What the checks say: :class:`ModelProblem` (a refusal, in one line) and :class:`Repair` (a mend
of a sloppy model that ONNX Runtime runs as it is), and how the repairs are applied."""

from __future__ import annotations

import dataclasses

import onnx
from onnx import helper


class ModelProblem(ValueError):
    """What is wrong with a model, in one line (callers prefix the file name)."""


#: the name the default domain also goes by
DEFAULT_ALIAS = "ai.onnx"


@dataclasses.dataclass(frozen=True)
class Repair:
    """One mend of a sloppy model that ONNX Runtime runs as it is (see the module's docstring).

    ``kind``: "alias" (``ai.onnx`` read as the default domain), "import" (``domain`` imported
    at ``version``), "drop_node" / "drop_initializer" (the duplicate producer at ``index`` of
    graph number ``graph``, in :func:`graphs` order, removed). ``line`` is the report's."""

    kind: str
    line: str
    domain: str = ""
    version: int = 0
    graph: int = 0
    index: int = -1


def graphs(model: onnx.ModelProto):
    """The model's main graph and its subgraphs, depth first, in a fixed order: graph numbers
    of :class:`Repair` count in it (``Checker.graph`` visits them in this order)."""
    from onnxnorm.ops.functions import all_graphs

    return all_graphs(model.graph)


def apply_repairs(
    model: onnx.ModelProto, repairs: list[Repair], main_initializers: bool = True
) -> None:
    """Applies :func:`check_model`'s repairs to ``model`` in place: the model they were found
    in, or a copy with the same graphs. ``main_initializers`` False: the copy has none in its
    main graph (``_io.weightless_shell``), where the caller leaves out the dropped ones itself
    (:func:`dropped_initializers`)."""
    if any(r.kind == "alias" for r in repairs):
        version = next(o.version for o in model.opset_import if o.domain == DEFAULT_ALIAS)
        kept = [o for o in model.opset_import if o.domain not in ("", DEFAULT_ALIAS)]
        del model.opset_import[:]
        model.opset_import.extend([helper.make_opsetid("", version), *kept])
    for repair in repairs:
        if repair.kind == "import":
            model.opset_import.append(helper.make_opsetid(repair.domain, repair.version))
    everything = list(graphs(model))
    drop_nodes = {(r.graph, r.index) for r in repairs if r.kind == "drop_node"}
    drop_inits = {(r.graph, r.index) for r in repairs if r.kind == "drop_initializer"}
    for number, graph in enumerate(everything):
        if any(g == number for g, _ in drop_nodes):
            kept = [n for i, n in enumerate(graph.node) if (number, i) not in drop_nodes]
            del graph.node[:]
            graph.node.extend(kept)
        if (number or main_initializers) and any(g == number for g, _ in drop_inits):
            kept = [t for i, t in enumerate(graph.initializer) if (number, i) not in drop_inits]
            del graph.initializer[:]
            graph.initializer.extend(kept)
        for node in graph.node:
            if node.domain == DEFAULT_ALIAS:
                node.domain = ""
    for function in model.functions:
        for node in function.node:
            if node.domain == DEFAULT_ALIAS:
                node.domain = ""


def dropped_initializers(repairs: list[Repair]) -> set[int]:
    """Indices of the main graph's initializers that the repairs remove."""
    return {r.index for r in repairs if r.kind == "drop_initializer" and r.graph == 0}
