"""Refusing hostile or broken models in one line, before anything reads their weights.

:func:`check_external_data`: every external-data reference names a regular file inside the
model's folder (no absolute path, no ``..``, no symbolic link leading out, no FIFO or device),
and its offset and length lie inside that file and match the tensor's declared shape. Only
``stat`` is called on the file, so a refused file is never opened.

:func:`check_model`: tensors hold the data their shapes declare (a shape of 10^12 elements
over a few bytes is refused without allocating); every graph is a graph: no value produced
twice, no input read that nothing provides (a dangling input, a missing initializer), no cycle;
every node's domain is imported; the attributes of norm ops are in range (axis inside the input's
rank; onnxnorm ops by the catalogue's rules).

Both raise :class:`ModelProblem` with the problem in one line.

As lenient as ONNX Runtime, as strict as it for what is hostile. Where ONNX Runtime loads and
runs a sloppy model, :func:`check_model` does not refuse it but returns the :class:`Repair` that
mends it without changing what it computes, and :func:`apply_repairs` applies them to the pass's
own copy of the model (the report lists them):

- the default domain imported under its other name, ``ai.onnx`` (nodes may use either name):
  read as ``""``;
- a node of a domain ONNX Runtime knows (``com.microsoft``, ``ai.onnx.ml``, ``onnxnorm``, ...)
  that the model does not import: imported at the version ONNX Runtime assumes, its newest;
- a value produced twice by Constant nodes, or by a Constant and an initializer, or two
  initializers of one name, all holding the same value: one of them kept. (ONNX Runtime takes
  the last one it meets; holding different values, the model means two things and is refused.)

A norm attribute that ONNX Runtime accepts although no norm can use it (a negative or NaN
epsilon of ONNX's or ONNX Runtime's ops) is left to the fusion rules, which leave that norm as
it is and say why; an onnxnorm op's attributes are checked as the native library checks them.
tests/test_hostile.py runs ONNX Runtime's own loader on every refused and every mended case.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from pathlib import Path, PurePath

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, external_data_helper, helper


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
    of :class:`Repair` count in it (``_Checker.graph`` visits them in this order)."""
    from onnxnorm.ops.functions import all_graphs

    return all_graphs(model.graph)


@functools.lru_cache(maxsize=1)
def _known_domains() -> dict[str, int]:
    """Domain -> the opset version ONNX Runtime assumes for a node of that domain when the
    model does not import it (the newest its registry has), onnxnorm's included."""
    from onnxnorm.ops import catalogue

    known = {catalogue.DOMAIN: catalogue.VERSION}
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as state

        for schema in state.get_all_operator_schema():
            if schema.domain:
                known[schema.domain] = max(known.get(schema.domain, 1), schema.since_version)
    except Exception:  # noqa: BLE001 - an ORT without the registry: the two it always has
        known.setdefault("com.microsoft", 1)
        known.setdefault("ai.onnx.ml", 1)
    return known


_FOUR_BIT = {
    getattr(TensorProto, name)
    for name in ("INT4", "UINT4", "FLOAT4E2M1")
    if hasattr(TensorProto, name)
}
#: the typed field that holds a tensor's values when it has no raw_data
_TYPED_FIELD = {
    TensorProto.FLOAT: "float_data",
    TensorProto.DOUBLE: "double_data",
    TensorProto.INT64: "int64_data",
    TensorProto.UINT32: "uint64_data",
    TensorProto.UINT64: "uint64_data",
    **dict.fromkeys(
        (
            TensorProto.INT32,
            TensorProto.INT16,
            TensorProto.INT8,
            TensorProto.UINT16,
            TensorProto.UINT8,
            TensorProto.BOOL,
            TensorProto.FLOAT16,
            TensorProto.BFLOAT16,
        ),
        "int32_data",
    ),
}


def _elements(tensor: TensorProto) -> int:
    if any(d < 0 for d in tensor.dims):
        raise ModelProblem(f"tensor {tensor.name!r} has a negative dimension {list(tensor.dims)}")
    return math.prod(tensor.dims)


def _expected_bytes(tensor: TensorProto) -> int | None:
    """The bytes the raw data of ``tensor`` must have; None for strings and unknown types."""
    count = _elements(tensor)
    if tensor.data_type in _FOUR_BIT:
        return (count + 1) // 2
    if tensor.data_type in (TensorProto.STRING, TensorProto.UNDEFINED):
        return None
    try:
        return count * np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return None


def _all_tensors(model: onnx.ModelProto):
    return external_data_helper._get_all_tensors(model)


def _external_info(tensor: TensorProto) -> tuple[str, int, int | None]:
    info = {entry.key: entry.value for entry in tensor.external_data}
    location = info.get("location", "")
    try:
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else None
    except ValueError:
        raise ModelProblem(
            f"tensor {tensor.name!r}: external data offset/length are not "
            f"integers ({info.get('offset')!r}, {info.get('length')!r})"
        ) from None
    if offset < 0 or (length is not None and length < 0):
        raise ModelProblem(f"tensor {tensor.name!r}: negative external data offset or length")
    return location, offset, length


def _hugging_face_blob(root: Path, location: str, resolved: Path) -> bool:
    """A file of a Hugging Face hub cache: the model's folder is a snapshot
    (``<repo>/snapshots/<revision>``), the reference names a link right in it, and the link
    leads to a regular file right in the same repository's ``blobs`` folder, itself a real
    folder. That is how the hub's downloads lay a repository out; the file stays inside the
    downloaded repository."""
    if root.parent.name != "snapshots" or len(PurePath(location).parts) != 1:
        return False
    blobs = root.parent.parent / "blobs"
    return (
        blobs.is_dir()
        and not blobs.is_symlink()
        and resolved.parent == blobs
        and (root / location).is_symlink()
    )


def check_external_data(
    model: onnx.ModelProto, folder: str | os.PathLike, own: str | os.PathLike | None = None
) -> None:
    """Refuses external-data references that leave ``folder`` or do not fit their file,
    before any of them is opened. ``own``: the model file itself, which references made by
    :func:`onnxnorm._io.load_model` name (it is the input, wherever a link to it leads)."""
    root = Path(folder).resolve()
    own = Path(own) if own is not None else None
    sizes: dict[str, int] = {}
    for tensor in _all_tensors(model):
        if not external_data_helper.uses_external_data(tensor):
            continue
        location, offset, length = _external_info(tensor)
        where = f"tensor {tensor.name!r}: external data {location!r}"
        if not location:
            raise ModelProblem(f"tensor {tensor.name!r}: external data without a location")
        if os.path.isabs(location) or PurePath(location).anchor or location.startswith("\\"):
            raise ModelProblem(
                f"{where} is an absolute path; only files in the model's folder "
                "are read (refused, not read)"
            )
        if ".." in PurePath(location.replace("\\", "/")).parts:
            raise ModelProblem(f"{where} leaves the model's folder (refused, not read)")
        resolved = (root / location).resolve()
        if own is not None and location == own.name:
            resolved = own
        elif root not in resolved.parents and not _hugging_face_blob(root, location, resolved):
            raise ModelProblem(
                f"{where} is a symbolic link to {resolved}, outside the model's "
                "folder (refused, not read); to read a link you trust, copy "
                "the folder with `cp -rL`"
            )
        if location not in sizes:
            if not resolved.exists():
                raise ModelProblem(f"{where}: no such file in the model's folder")
            if not resolved.is_file():
                raise ModelProblem(f"{where} is not a regular file (refused, not read)")
            sizes[location] = resolved.stat().st_size
        size = sizes[location]
        expected = _expected_bytes(tensor)
        if length is not None and expected is not None and length != expected:
            held = (
                "it holds"
                if own is not None and resolved == own
                else "its external data length says"
            )
            raise ModelProblem(
                f"tensor {tensor.name!r} of shape {list(tensor.dims)} needs "
                f"{expected} bytes, {held} {length}"
            )
        needed = length if length is not None else expected
        if offset > size or (needed is not None and offset + needed > size):
            raise ModelProblem(
                f"{where} holds {size} bytes, tensor {tensor.name!r} needs bytes "
                f"{offset} to {offset + (needed or 0)}"
            )


def _check_inline(tensor: TensorProto) -> None:
    """Inline data of the size the shape declares (checked on counts, nothing allocated)."""
    expected = _expected_bytes(tensor)
    count = _elements(tensor)
    if tensor.HasField("raw_data"):
        if expected is not None and len(tensor.raw_data) != expected:
            raise ModelProblem(
                f"tensor {tensor.name!r} of shape {list(tensor.dims)} needs "
                f"{expected} bytes, it holds {len(tensor.raw_data)}"
            )
        return
    field = _TYPED_FIELD.get(tensor.data_type)
    if field is not None and tensor.data_type not in _FOUR_BIT:
        held = len(getattr(tensor, field))
        if held != count:
            raise ModelProblem(
                f"tensor {tensor.name!r} of shape {list(tensor.dims)} declares "
                f"{count} elements, it holds {held}"
            )


def _label(node: onnx.NodeProto, index: int) -> str:
    name = repr(node.name) if node.name else f"#{index}"
    op = f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type
    return f"node {name} ({op})"


_EPSILON = {
    ("", op)
    for op in (
        "LayerNormalization",
        "RMSNormalization",
        "BatchNormalization",
        "InstanceNormalization",
        "GroupNormalization",
    )
} | {
    ("com.microsoft", op)
    for op in (
        "LayerNormalization",
        "SimplifiedLayerNormalization",
        "SkipLayerNormalization",
        "SkipSimplifiedLayerNormalization",
    )
}
_AXIS = {
    ("", "LayerNormalization"),
    ("", "RMSNormalization"),
    ("com.microsoft", "LayerNormalization"),
    ("com.microsoft", "SimplifiedLayerNormalization"),
}
_KIND = {"int": AttributeProto.INT, "float": AttributeProto.FLOAT}
_ONNXNORM = "onnxnorm"  # catalogue.DOMAIN, without importing the catalogue for every model


def _check_attributes(node: onnx.NodeProto, domain: str, label: str, ranks: dict[str, int]) -> None:
    from onnxnorm.ops import catalogue

    attrs = {a.name: a for a in node.attribute}
    if domain == catalogue.DOMAIN:
        if node.op_type not in catalogue.OPS:
            raise ModelProblem(
                f"{label}: not an op of the onnxnorm domain ({', '.join(catalogue.OPS)})"
            )
        specs = catalogue.get(node.op_type).attributes
        checks = [(spec, spec.validate) for spec in specs]
    else:
        # ONNX Runtime takes any float epsilon (a negative or NaN one gives NaN rows): the
        # fusion rules leave such a norm as it is, with the reason; the kind is checked
        checks = []
        if (domain, node.op_type) in _EPSILON:
            checks.append((catalogue.EPSILON, None))
        if (domain, node.op_type) in _AXIS:
            checks.append((catalogue.AXIS, None))
    for spec, validate in checks:
        attr = attrs.get(spec.name)
        if attr is None:
            continue
        if attr.ref_attr_name:  # a function's attribute, known when called
            continue
        if attr.type != _KIND[spec.kind]:
            kind = "an int" if spec.kind == "int" else "a float"
            raise ModelProblem(
                f"{label}: attribute {spec.name} must be {kind}, got "
                f"{AttributeProto.AttributeType.Name(attr.type)}"
            )
        value = attr.f if spec.kind == "float" else attr.i
        problem = validate(value) if validate else None
        if problem:
            raise ModelProblem(f"{label}: attribute {spec.name} {problem}")
        if spec.name == "axis" and node.input and node.input[0] in ranks:
            rank = ranks[node.input[0]]
            if not -rank <= value < rank:
                raise ModelProblem(
                    f"{label}: attribute axis {value} is out of range for its input of rank {rank}"
                )


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


def _tensor_bytes(tensor: TensorProto, folder: Path | None) -> tuple | None:
    """(type, dims, bytes) of a tensor, to compare two producers of one name; None when its
    bytes are not at hand (external data without a folder, or over 64 MiB)."""
    if external_data_helper.uses_external_data(tensor):
        if folder is None:
            return None
        location, offset, length = _external_info(tensor)
        expected = _expected_bytes(tensor)
        length = length if length is not None else expected
        if length is None or length > 1 << 26:
            return None
        try:
            with open(Path(folder) / location, "rb") as f:
                f.seek(offset)
                data = f.read(length)
        except OSError:
            return None
        return tensor.data_type, tuple(tensor.dims), data
    from onnx import numpy_helper

    try:
        array = numpy_helper.to_array(tensor)
    except Exception:  # noqa: BLE001 - a tensor numpy cannot take: compare its fields
        copy = TensorProto()
        copy.CopyFrom(tensor)
        copy.name = ""
        return tensor.data_type, tuple(tensor.dims), copy.SerializeToString()
    return tensor.data_type, tuple(tensor.dims), array.tobytes()


def _produced_value(producer, folder: Path | None):
    """What a producer (an initializer, or a Constant node) holds, comparable with ``==``;
    None where it cannot be known here (any other node)."""
    if isinstance(producer, TensorProto):
        return _tensor_bytes(producer, folder)
    if (
        producer.op_type != "Constant"
        or producer.domain not in ("", DEFAULT_ALIAS)
        or len(producer.attribute) != 1
    ):
        return None
    attr = producer.attribute[0]
    if attr.ref_attr_name:
        return None
    if attr.type == AttributeProto.TENSOR:
        return _tensor_bytes(attr.t, folder)
    copy = AttributeProto()
    copy.CopyFrom(attr)
    return attr.name, copy.SerializeToString()


def _duplicate(first, second, folder: Path | None, label: str) -> str:
    """For two producers of one name, the report's words on keeping the second (the one ONNX
    Runtime uses: it takes the last it meets, initializers before Constant nodes); raises
    unless both are constants (an initializer or a Constant node)."""
    a, b = _produced_value(first, folder), _produced_value(second, folder)
    if _is_constant(first) and _is_constant(second):
        if a is not None and a == b:
            return "both hold the same value: one kept"
        return (
            "they hold different values: the last one kept, the value ONNX Runtime uses "
            "(other runtimes may take the first)"
        )
    raise ModelProblem(label)


def _is_constant(producer) -> bool:
    return isinstance(producer, TensorProto) or (
        producer.op_type == "Constant" and producer.domain in ("", DEFAULT_ALIAS)
    )


class _Checker:
    """The graph checks, graph by graph in :func:`graphs` order, collecting repairs."""

    def __init__(self, domains: set[str], folder: Path | None, known: dict[str, int]):
        self.domains, self.folder, self.known = domains, folder, known
        self.repairs: list[Repair] = []
        self.count = 0  # graphs seen, the number of the next one

    def domain(self, node_domain: str, what: str, label: str) -> None:
        domain = "" if node_domain == DEFAULT_ALIAS else node_domain
        if domain in self.domains:
            return
        if domain == "":
            raise ModelProblem(
                f"{what}: {label}: the model imports no version of the default "
                "ONNX domain (opset_import); ONNX Runtime refuses it too"
            )
        if domain not in self.known:
            raise ModelProblem(
                f"{what}: {label}: domain {node_domain!r} is not imported by the "
                "model (opset_import)"
            )
        version = self.known[domain]
        self.domains.add(domain)
        self.repairs.append(
            Repair(
                "import",
                f"domain {domain!r} is used by {label} but not imported: imported at "
                f"version {version}, as ONNX Runtime assumes",
                domain=domain,
                version=version,
            )
        )

    def drop_node(self, graph: int, index: int, line: str) -> None:
        self.repairs.append(Repair("drop_node", line, graph=graph, index=index))

    def graph(self, graph: onnx.GraphProto, outer: set[str], what: str) -> None:
        number = self.count
        self.count += 1
        inputs: set[str] = set()
        for value in graph.input:
            if value.name in inputs:
                raise ModelProblem(f"{what}: input {value.name!r} is declared twice")
            inputs.add(value.name)
        initializers: dict[str, TensorProto] = {}
        init_index: dict[str, int] = {}
        for index, tensor in enumerate(graph.initializer):
            if not external_data_helper.uses_external_data(tensor):
                _check_inline(tensor)
            if tensor.name in initializers:
                earlier = initializers[tensor.name]
                how = _duplicate(earlier, tensor, self.folder, "")
                self.repairs.append(
                    Repair(
                        "drop_initializer",
                        f"{what}: two initializers are named {tensor.name!r}; {how}",
                        graph=number,
                        index=init_index[tensor.name],
                    )
                )
            initializers[tensor.name] = tensor
            init_index[tensor.name] = index
        given = inputs | set(initializers)
        ranks = {
            v.name: len(v.type.tensor_type.shape.dim)
            for v in (*graph.input, *graph.value_info, *graph.output)
            if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape")
        }
        ranks.update({t.name: len(t.dims) for t in graph.initializer})

        def label(i: int) -> str:  # for messages only
            return _label(graph.node[i], i)

        producer: dict[str, int] = {}
        nodes = []  # (reads, subgraphs) of each node
        dropped: set[int] = set()
        for index, node in enumerate(graph.node):
            domain = "" if node.domain == DEFAULT_ALIAS else node.domain
            self.domain(node.domain, what, label(index))
            for name in node.output:
                if not name:
                    continue
                if name in producer:
                    earlier = producer[name]
                    how = _duplicate(
                        graph.node[earlier],
                        node,
                        self.folder,
                        f"{what}: value {name!r} is produced twice, by "
                        f"{label(earlier)} and {label(index)}",
                    )
                    self.drop_node(
                        number,
                        earlier,
                        f"{what}: value {name!r} is produced by "
                        f"{label(earlier)} and again by {label(index)}; {how}",
                    )
                    dropped.add(earlier)
                elif name in given:
                    if name in inputs or name not in initializers:
                        raise ModelProblem(
                            f"{what}: value {name!r} is a graph input or "
                            f"initializer and also produced by {label(index)}"
                        )
                    how = _duplicate(
                        initializers[name],
                        node,
                        self.folder,
                        f"{what}: value {name!r} is an initializer and also "
                        f"produced by {label(index)}",
                    )
                    self.repairs.append(
                        Repair(
                            "drop_initializer",
                            f"{what}: value {name!r} is an initializer and "
                            f"also produced by {label(index)}; {how}",
                            graph=number,
                            index=init_index[name],
                        )
                    )
                    given = given - {name}
                producer[name] = index
            subgraphs = []
            if node.attribute:
                for attr in node.attribute:
                    if (
                        attr.type == AttributeProto.TENSOR
                        and not external_data_helper.uses_external_data(attr.t)
                    ):
                        _check_inline(attr.t)
                subgraphs = list(_subgraphs(node))
                if (
                    (domain, node.op_type) in _EPSILON
                    or (domain, node.op_type) in _AXIS
                    or domain == _ONNXNORM
                ):
                    _check_attributes(node, domain, label(index), ranks)
            elif domain == _ONNXNORM:
                _check_attributes(node, domain, label(index), ranks)
            nodes.append(([name for name in node.input if name], subgraphs))
        visible = outer | given | set(producer)
        depends: list[set[int]] = []
        for index in dropped:  # a Constant that gives way: nothing reads it
            nodes[index] = ([], [])
        for index, (reads, subgraphs) in enumerate(nodes):
            for sub in subgraphs:
                self.graph(sub, visible, f"{what}, subgraph {sub.name!r} of {label(index)}")
                reads += sorted(_free_names(sub))
            for name in reads:
                if name not in visible:
                    raise ModelProblem(
                        f"{what}: {label(index)} reads {name!r}, which no node, "
                        "graph input or initializer provides"
                    )
            depends.append({producer[name] for name in reads if name in producer})
        for value in graph.output:
            if value.name not in visible:
                raise ModelProblem(
                    f"{what}: output {value.name!r} is produced by no node, graph "
                    "input or initializer"
                )
        _check_acyclic(graph, depends, what)


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
        path = " -> ".join(_label(graph.node[i], i) for i in cycle[:4])
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
    checker = _Checker(domains, Path(folder) if folder is not None else None, _known_domains())
    checker.graph(model.graph, set(), "graph")
    for function in model.functions:
        imported = checker.domains | _imports(function.opset_import)[0]
        body = onnx.GraphProto(node=function.node, name=function.name)
        body.input.extend(onnx.ValueInfoProto(name=n) for n in function.input)
        body.output.extend(onnx.ValueInfoProto(name=n) for n in function.output)
        inner = _Checker(imported, checker.folder, checker.known)
        inner.graph(body, set(), f"function {function.domain}::{function.name}")
        if inner.repairs:
            raise ModelProblem(
                f"function {function.domain}::{function.name}: "
                f"{inner.repairs[0].line}, inside a function body"
            )
    return repairs + checker.repairs


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
