"""Every graph is a graph: each value produced once (constants produced twice: one kept, as
ONNX Runtime does), nothing read that nothing provides, no cycle, every node's domain imported
(a domain ONNX Runtime knows: imported for it), tensors and norm attributes as declared;
functions' bodies alike. :func:`check_model` runs it."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import onnx
from onnx import AttributeProto, TensorProto, external_data_helper

from onnxnorm._validate.attributes import check_attributes, checks_attributes
from onnxnorm._validate.duplicates import duplicate
from onnxnorm._validate.repairs import DEFAULT_ALIAS, ModelProblem, Repair
from onnxnorm._validate.tensors import check_inline


@functools.lru_cache(maxsize=1)
def known_domains() -> dict[str, int]:
    """Domain -> the opset version ONNX Runtime assumes for a node of that domain when the
    model does not import it (the newest its registry has), onnxnorm's included, and the
    default domain's ("": ONNX Runtime's newest ONNX opset, where the model imports some other
    domain; a model that imports none it refuses)."""
    from onnxnorm.ops import catalogue

    known = {catalogue.DOMAIN: catalogue.VERSION}
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as state

        for schema in state.get_all_operator_schema():
            known[schema.domain] = max(known.get(schema.domain, 1), schema.since_version)
    except Exception:  # noqa: BLE001 - an ORT without the registry: the two it always has
        known.setdefault("com.microsoft", 1)
        known.setdefault("ai.onnx.ml", 1)
    return known


def label_of(node: onnx.NodeProto, index: int) -> str:
    name = repr(node.name) if node.name else f"#{index}"
    op = f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type
    return f"node {name} ({op})"


def _subgraphs(node: onnx.NodeProto):
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == AttributeProto.GRAPHS:
            yield from attr.graphs


def _free_names(graph: onnx.GraphProto) -> set[str]:
    """Names a subgraph reads from its enclosing scopes."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    free = set()
    for node in graph.node:
        for sub in _subgraphs(node):
            free |= _free_names(sub) - defined
        free |= {name for name in node.input if name and name not in defined}
        defined.update(node.output)
    free |= {o.name for o in graph.output if o.name not in defined}
    return free


class _Scope:
    """What :class:`Checker` learns of one graph while it walks it."""

    def __init__(self, graph: onnx.GraphProto, number: int, what: str):
        self.graph, self.number, self.what = graph, number, what
        self.inputs: set[str] = set()
        self.initializers: dict[str, TensorProto] = {}
        self.init_index: dict[str, int] = {}
        self.given: set[str] = set()  # the inputs and the initializers no node replaces
        self.producer: dict[str, int] = {}  # value -> the index of the node producing it
        self.dropped: set[int] = set()  # Constant nodes that give way to a later producer
        self.reads: list[list[str]] = []  # the values each node reads
        self.subgraphs: list[list[onnx.GraphProto]] = []  # each node's subgraphs
        self.ranks = {
            v.name: len(v.type.tensor_type.shape.dim)
            for v in (*graph.input, *graph.value_info, *graph.output)
            if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape")
        }
        self.ranks.update({t.name: len(t.dims) for t in graph.initializer})

    def label(self, index: int) -> str:  # for messages only
        return label_of(self.graph.node[index], index)


class Checker:
    """The graph checks, graph by graph in :func:`graphs` order, collecting repairs."""

    def __init__(self, domains: set[str], folder: Path | None, known: dict[str, int]):
        self.domains, self.folder, self.known = domains, folder, known
        self.repairs: list[Repair] = []
        self.count = 0  # graphs seen, the number of the next one

    def domain(self, node_domain: str, what: str, label: str) -> None:
        domain = "" if node_domain == DEFAULT_ALIAS else node_domain
        if domain in self.domains:
            return
        if not self.domains:
            raise ModelProblem(
                f"{what}: {label}: the model imports no opset at all (opset_import is empty); "
                "ONNX Runtime refuses it too"
            )
        if domain not in self.known:
            raise ModelProblem(
                f"{what}: {label}: domain {node_domain!r} is not imported by the "
                "model (opset_import)"
            )
        version = self.known[domain]
        self.domains.add(domain)
        name = "the default ONNX domain" if domain == "" else f"domain {domain!r}"
        self.repairs.append(
            Repair(
                "import",
                f"{name} is used by {label} but not imported: imported at "
                f"version {version}, as ONNX Runtime assumes",
                domain=domain,
                version=version,
            )
        )

    def drop_node(self, graph: int, index: int, line: str) -> None:
        self.repairs.append(Repair("drop_node", line, graph=graph, index=index))

    def graph(self, graph: onnx.GraphProto, outer: set[str], what: str) -> None:
        """Checks ``graph`` (whose enclosing scopes define ``outer``) and its subgraphs;
        ``what`` names it in messages."""
        scope = _Scope(graph, self.count, what)
        self.count += 1
        self.declared(scope)
        for index, node in enumerate(graph.node):
            self.node(scope, index, node)
        visible = outer | scope.given | set(scope.producer)
        depends: list[set[int]] = []
        for index in scope.dropped:  # a Constant that gives way: nothing reads it
            scope.reads[index], scope.subgraphs[index] = [], []
        for index, reads in enumerate(scope.reads):
            for sub in scope.subgraphs[index]:
                self.graph(sub, visible, f"{what}, subgraph {sub.name!r} of {scope.label(index)}")
                reads += sorted(_free_names(sub))
            for name in reads:
                if name not in visible:
                    raise ModelProblem(
                        f"{what}: {scope.label(index)} reads {name!r}, which no node, "
                        "graph input or initializer provides"
                    )
            depends.append({scope.producer[name] for name in reads if name in scope.producer})
        for value in graph.output:
            if value.name not in visible:
                raise ModelProblem(
                    f"{what}: output {value.name!r} is produced by no node, graph "
                    "input or initializer"
                )
        _check_acyclic(graph, depends, what)

    def declared(self, scope: _Scope) -> None:
        """The graph's inputs (each once) and initializers (inline data as declared; two of one
        name: the earlier one dropped where both are constants)."""
        graph, what = scope.graph, scope.what
        for value in graph.input:
            if value.name in scope.inputs:
                raise ModelProblem(f"{what}: input {value.name!r} is declared twice")
            scope.inputs.add(value.name)
        for index, tensor in enumerate(graph.initializer):
            if not external_data_helper.uses_external_data(tensor):
                check_inline(tensor)
            if tensor.name in scope.initializers:
                earlier = scope.initializers[tensor.name]
                how = duplicate(earlier, tensor, self.folder, "")
                self.repairs.append(
                    Repair(
                        "drop_initializer",
                        f"{what}: two initializers are named {tensor.name!r}; {how}",
                        graph=scope.number,
                        index=scope.init_index[tensor.name],
                    )
                )
            scope.initializers[tensor.name] = tensor
            scope.init_index[tensor.name] = index
        scope.given = scope.inputs | set(scope.initializers)

    def node(self, scope: _Scope, index: int, node: onnx.NodeProto) -> None:
        """One node: its domain imported, each output produced once (or twice by constants of
        which one is dropped), its tensors and norm attributes as declared."""
        domain = "" if node.domain == DEFAULT_ALIAS else node.domain
        self.domain(node.domain, scope.what, scope.label(index))
        for name in node.output:
            if name:
                self.output(scope, index, name)
                scope.producer[name] = index
        subgraphs = []
        if node.attribute:
            for attr in node.attribute:
                if attr.type == AttributeProto.TENSOR and not (
                    external_data_helper.uses_external_data(attr.t)
                ):
                    check_inline(attr.t)
            subgraphs = list(_subgraphs(node))
        if checks_attributes(domain, node.op_type):
            check_attributes(node, domain, scope.label(index), scope.ranks)
        scope.reads.append([name for name in node.input if name])
        scope.subgraphs.append(subgraphs)

    def output(self, scope: _Scope, index: int, name: str) -> None:
        """``name``, produced by node ``index``: refused when a graph input or another node
        already gives it, unless both are constants (then the earlier one is dropped)."""
        what, label = scope.what, scope.label
        if name in scope.producer:
            earlier = scope.producer[name]
            how = duplicate(
                scope.graph.node[earlier],
                scope.graph.node[index],
                self.folder,
                f"{what}: value {name!r} is produced twice, by {label(earlier)} and {label(index)}",
            )
            self.drop_node(
                scope.number,
                earlier,
                f"{what}: value {name!r} is produced by "
                f"{label(earlier)} and again by {label(index)}; {how}",
            )
            scope.dropped.add(earlier)
        elif name in scope.given:
            if name in scope.inputs or name not in scope.initializers:
                raise ModelProblem(
                    f"{what}: value {name!r} is a graph input or "
                    f"initializer and also produced by {label(index)}"
                )
            how = duplicate(
                scope.initializers[name],
                scope.graph.node[index],
                self.folder,
                f"{what}: value {name!r} is an initializer and also produced by {label(index)}",
            )
            self.repairs.append(
                Repair(
                    "drop_initializer",
                    f"{what}: value {name!r} is an initializer and "
                    f"also produced by {label(index)}; {how}",
                    graph=scope.number,
                    index=scope.init_index[name],
                )
            )
            scope.given = scope.given - {name}


def _check_acyclic(graph: onnx.GraphProto, depends: list[set[int]], what: str) -> None:
    """Kahn's algorithm on the nodes; nodes left over lie on or after a cycle."""
    waiting = [len(d) for d in depends]
    users: list[list[int]] = [[] for _ in depends]
    for index, deps in enumerate(depends):
        for dep in deps:
            users[dep].append(index)
    ready = [i for i, count in enumerate(waiting) if count == 0]
    done = 0
    while ready:
        index = ready.pop()
        done += 1
        for user in users[index]:
            waiting[user] -= 1
            if waiting[user] == 0:
                ready.append(user)
    if done < len(depends):
        # walk back from a leftover node through leftover producers until one repeats
        index = next(i for i, count in enumerate(waiting) if count)
        seen: list[int] = []
        while index not in seen:
            seen.append(index)
            index = next(d for d in depends[index] if waiting[d])
        cycle = seen[seen.index(index) :][::-1]  # in the direction values flow
        first = cycle.index(min(cycle))
        cycle = cycle[first:] + cycle[:first]  # from the node that comes first in the file
        path = " -> ".join(label_of(graph.node[i], i) for i in cycle[:4])
        raise ModelProblem(
            f"{what}: the nodes form a cycle: {path}" + (" -> ..." if len(cycle) > 4 else "")
        )


def _imports(opsets) -> tuple[set[str], list[Repair]]:
    """The domains an opset_import list imports, ``ai.onnx`` read as the default domain."""
    names = [o.domain for o in opsets]
    repairs = []
    if DEFAULT_ALIAS in names:
        versions = {o.version for o in opsets if o.domain in ("", DEFAULT_ALIAS)}
        if len(versions) > 1:
            raise ModelProblem(
                f"the model imports the default domain twice, at versions "
                f"{sorted(versions)} (as '' and as {DEFAULT_ALIAS!r})"
            )
        repairs.append(
            Repair("alias", f"the default domain is imported as {DEFAULT_ALIAS!r}: read as ''")
        )
    return {"" if name == DEFAULT_ALIAS else name for name in names}, repairs


def check_model(model: onnx.ModelProto, folder: str | os.PathLike | None = None) -> list[Repair]:
    """Refuses, in one line, a model whose graphs are not graphs, whose tensors do not hold
    what they declare or whose norm ops have attributes out of range; returns the repairs that
    mend what ONNX Runtime tolerates (:func:`apply_repairs`). ``folder``: where its external
    data lies (to compare two producers of one name that hold external data)."""
    domains, repairs = _imports(model.opset_import)
    checker = Checker(domains, Path(folder) if folder is not None else None, known_domains())
    checker.graph(model.graph, set(), "graph")
    for function in model.functions:
        imported = checker.domains | _imports(function.opset_import)[0]
        body = onnx.GraphProto(node=function.node, name=function.name)
        body.input.extend(onnx.ValueInfoProto(name=n) for n in function.input)
        body.output.extend(onnx.ValueInfoProto(name=n) for n in function.output)
        inner = Checker(imported, checker.folder, checker.known)
        inner.graph(body, set(), f"function {function.domain}::{function.name}")
        if inner.repairs:
            raise ModelProblem(
                f"function {function.domain}::{function.name}: "
                f"{inner.repairs[0].line}, inside a function body"
            )
    return repairs + checker.repairs
