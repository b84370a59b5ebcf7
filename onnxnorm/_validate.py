"""Refusing hostile or broken models in one line, before anything reads their weights.

:func:`check_external_data`: every external-data reference names a regular file inside the
model's folder (no absolute path, no ``..``, no symbolic link leading out, no FIFO or device),
and its offset and length lie inside that file and match the tensor's declared shape. Only
``stat`` is called on the file, so a refused file is never opened.

:func:`check_model`: tensors hold the data their shapes declare (a shape of 10^12 elements
over a few bytes is refused without allocating); every graph is a graph: no value produced
twice, no input read that nothing provides (a dangling input, a missing initializer), no cycle;
every node's domain is imported; the attributes of norm ops are in range (epsilon finite and
>= 0, axis inside the input's rank, onnxnorm ops by the catalogue's rules).

Both raise :class:`~onnxnorm._io.OnnxNormError` with the problem in one line.
"""

from __future__ import annotations

import math
import os
from pathlib import Path, PurePath

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, external_data_helper, helper


class ModelProblem(ValueError):
    """What is wrong with a model, in one line (callers prefix the file name)."""


_FOUR_BIT = {getattr(TensorProto, name) for name in ("INT4", "UINT4", "FLOAT4E2M1")
             if hasattr(TensorProto, name)}
#: the typed field that holds a tensor's values when it has no raw_data
_TYPED_FIELD = {TensorProto.FLOAT: "float_data", TensorProto.DOUBLE: "double_data",
                TensorProto.INT64: "int64_data", TensorProto.UINT32: "uint64_data",
                TensorProto.UINT64: "uint64_data",
                **{t: "int32_data" for t in (TensorProto.INT32, TensorProto.INT16, TensorProto.INT8,
                                             TensorProto.UINT16, TensorProto.UINT8, TensorProto.BOOL,
                                             TensorProto.FLOAT16, TensorProto.BFLOAT16)}}


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
        raise ModelProblem(f"tensor {tensor.name!r}: external data offset/length are not "
                           f"integers ({info.get('offset')!r}, {info.get('length')!r})") from None
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
    return (blobs.is_dir() and not blobs.is_symlink() and resolved.parent == blobs
            and (root / location).is_symlink())


def check_external_data(model: onnx.ModelProto, folder: str | os.PathLike,
                        own: str | os.PathLike | None = None) -> None:
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
            raise ModelProblem(f"{where} is an absolute path; only files in the model's folder "
                               "are read (refused, not read)")
        if ".." in PurePath(location.replace("\\", "/")).parts:
            raise ModelProblem(f"{where} leaves the model's folder (refused, not read)")
        resolved = (root / location).resolve()
        if own is not None and location == own.name:
            resolved = own
        elif root not in resolved.parents and not _hugging_face_blob(root, location, resolved):
            raise ModelProblem(f"{where} is a symbolic link to {resolved}, outside the model's "
                               "folder (refused, not read); to read a link you trust, copy "
                               "the folder with `cp -rL`")
        if location not in sizes:
            if not resolved.exists():
                raise ModelProblem(f"{where}: no such file in the model's folder")
            if not resolved.is_file():
                raise ModelProblem(f"{where} is not a regular file (refused, not read)")
            sizes[location] = resolved.stat().st_size
        size = sizes[location]
        expected = _expected_bytes(tensor)
        if length is not None and expected is not None and length != expected:
            held = ("it holds" if own is not None and resolved == own
                    else "its external data length says")
            raise ModelProblem(f"tensor {tensor.name!r} of shape {list(tensor.dims)} needs "
                               f"{expected} bytes, {held} {length}")
        needed = length if length is not None else expected
        if offset > size or (needed is not None and offset + needed > size):
            raise ModelProblem(f"{where} holds {size} bytes, tensor {tensor.name!r} needs bytes "
                               f"{offset} to {offset + (needed or 0)}")


def _check_inline(tensor: TensorProto) -> None:
    """Inline data of the size the shape declares (checked on counts, nothing allocated)."""
    expected = _expected_bytes(tensor)
    count = _elements(tensor)
    if tensor.HasField("raw_data"):
        if expected is not None and len(tensor.raw_data) != expected:
            raise ModelProblem(f"tensor {tensor.name!r} of shape {list(tensor.dims)} needs "
                               f"{expected} bytes, it holds {len(tensor.raw_data)}")
        return
    field = _TYPED_FIELD.get(tensor.data_type)
    if field is not None and tensor.data_type not in _FOUR_BIT:
        held = len(getattr(tensor, field))
        if held != count:
            raise ModelProblem(f"tensor {tensor.name!r} of shape {list(tensor.dims)} declares "
                               f"{count} elements, it holds {held}")


def _label(node: onnx.NodeProto, index: int) -> str:
    name = repr(node.name) if node.name else f"#{index}"
    op = f"{node.domain}::{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type
    return f"node {name} ({op})"


_EPSILON = {("", op) for op in ("LayerNormalization", "RMSNormalization", "BatchNormalization",
                                "InstanceNormalization", "GroupNormalization")} | {
    ("com.microsoft", op) for op in ("LayerNormalization", "SimplifiedLayerNormalization",
                                     "SkipLayerNormalization", "SkipSimplifiedLayerNormalization")}
_AXIS = {("", "LayerNormalization"), ("", "RMSNormalization"),
         ("com.microsoft", "LayerNormalization"), ("com.microsoft", "SimplifiedLayerNormalization")}
_KIND = {"int": AttributeProto.INT, "float": AttributeProto.FLOAT}
_ONNXNORM = "onnxnorm"  # catalogue.DOMAIN, without importing the catalogue for every model


def _check_attributes(node: onnx.NodeProto, domain: str, label: str,
                      ranks: dict[str, int]) -> None:
    from onnxnorm.ops import catalogue

    attrs = {a.name: a for a in node.attribute}
    if domain == catalogue.DOMAIN:
        if node.op_type not in catalogue.OPS:
            raise ModelProblem(f"{label}: not an op of the onnxnorm domain "
                               f"({', '.join(catalogue.OPS)})")
        specs = catalogue.get(node.op_type).attributes
        checks = [(spec, spec.validate) for spec in specs]
    else:
        checks = []
        if (domain, node.op_type) in _EPSILON:
            checks.append((catalogue.EPSILON, catalogue.EPSILON.validate))
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
            raise ModelProblem(f"{label}: attribute {spec.name} must be {kind}, got "
                               f"{AttributeProto.AttributeType.Name(attr.type)}")
        value = attr.f if spec.kind == "float" else attr.i
        problem = validate(value) if validate else None
        if problem:
            raise ModelProblem(f"{label}: attribute {spec.name} {problem}")
        if spec.name == "axis" and node.input and node.input[0] in ranks:
            rank = ranks[node.input[0]]
            if not -rank <= value < rank:
                raise ModelProblem(f"{label}: attribute axis {value} is out of range for its "
                                   f"input of rank {rank}")


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


def _check_graph(graph: onnx.GraphProto, outer: set[str], domains: set[str], what: str) -> None:
    inputs, initializers = set(), set()
    for value in graph.input:
        if value.name in inputs:
            raise ModelProblem(f"{what}: input {value.name!r} is declared twice")
        inputs.add(value.name)
    for tensor in graph.initializer:
        if tensor.name in initializers:
            raise ModelProblem(f"{what}: two initializers are named {tensor.name!r}")
        initializers.add(tensor.name)
        if not external_data_helper.uses_external_data(tensor):
            _check_inline(tensor)
    given = inputs | initializers
    ranks = {v.name: len(v.type.tensor_type.shape.dim)
             for v in (*graph.input, *graph.value_info, *graph.output)
             if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape")}
    ranks.update({t.name: len(t.dims) for t in graph.initializer})
    label = lambda i: _label(graph.node[i], i)  # noqa: E731 - messages only
    producer: dict[str, int] = {}
    nodes = []  # (reads, subgraphs) of each node
    for index, node in enumerate(graph.node):
        domain = node.domain
        if domain == "ai.onnx":
            domain = ""
        if domain not in domains:
            raise ModelProblem(f"{what}: {label(index)}: domain {node.domain!r} is not imported "
                               "by the model (opset_import)")
        for name in node.output:
            if not name:
                continue
            if name in producer:
                raise ModelProblem(f"{what}: value {name!r} is produced twice, by "
                                   f"{label(producer[name])} and {label(index)}")
            if name in given:
                raise ModelProblem(f"{what}: value {name!r} is a graph input or initializer "
                                   f"and also produced by {label(index)}")
            producer[name] = index
        subgraphs = []
        if node.attribute:
            for attr in node.attribute:
                if (attr.type == AttributeProto.TENSOR
                        and not external_data_helper.uses_external_data(attr.t)):
                    _check_inline(attr.t)
            subgraphs = list(_subgraphs(node))
            if (domain, node.op_type) in _EPSILON or (domain, node.op_type) in _AXIS \
                    or domain == _ONNXNORM:
                _check_attributes(node, domain, label(index), ranks)
        elif domain == _ONNXNORM:
            _check_attributes(node, domain, label(index), ranks)
        nodes.append(([name for name in node.input if name], subgraphs))
    visible = outer | given | set(producer)
    depends: list[set[int]] = []
    for index, (reads, subgraphs) in enumerate(nodes):
        for sub in subgraphs:
            _check_graph(sub, visible, domains, f"{what}, subgraph {sub.name!r} of {label(index)}")
            reads += sorted(_free_names(sub))
        for name in reads:
            if name not in visible:
                raise ModelProblem(f"{what}: {label(index)} reads {name!r}, which no node, graph "
                                   "input or initializer provides")
        depends.append({producer[name] for name in reads if name in producer})
    for value in graph.output:
        if value.name not in visible:
            raise ModelProblem(f"{what}: output {value.name!r} is produced by no node, graph "
                               "input or initializer")
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
        cycle = seen[seen.index(index):][::-1]  # in the direction values flow
        first = cycle.index(min(cycle))
        cycle = cycle[first:] + cycle[:first]  # from the node that comes first in the file
        path = " -> ".join(_label(graph.node[i], i) for i in cycle[:4])
        raise ModelProblem(f"{what}: the nodes form a cycle: {path}"
                           + (" -> ..." if len(cycle) > 4 else ""))


def check_model(model: onnx.ModelProto) -> None:
    """Refuses, in one line, a model whose graphs are not graphs, whose tensors do not hold
    what they declare or whose norm ops have attributes out of range."""
    domains = {"" if o.domain == "ai.onnx" else o.domain for o in model.opset_import} | {""}
    _check_graph(model.graph, set(), domains, "graph")
    for function in model.functions:
        imported = domains | {"" if o.domain == "ai.onnx" else o.domain
                              for o in function.opset_import}
        body = onnx.GraphProto(node=function.node, name=function.name)
        body.input.extend(onnx.ValueInfoProto(name=n) for n in function.input)
        body.output.extend(onnx.ValueInfoProto(name=n) for n in function.output)
        _check_graph(body, set(), imported, f"function {function.domain}::{function.name}")
