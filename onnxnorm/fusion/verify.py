"""Running an original and a fused model side by side in ONNX Runtime on generated inputs.

Inputs follow the graph's declared types. Symbolic dimensions get small sizes (the same name,
the same size; a caller may fix some by name, e.g. a KV cache's head size or past length). A
dimension named ``a + b`` (the dynamo exporter's total sequence length) is the sum of those
sizes, and ``total_sequence_length`` is ``past_sequence_length + sequence_length`` where the
model has both (onnxruntime-genai and ORT's transformers tools name them so). Integer inputs
stay in range: an input used as the indices of a Gather on a constant table (token ids, position
ids, token type ids) is drawn below that table's first dimension; an attention mask is all ones;
other integers are 0 or 1.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from onnx import helper

from onnxnorm.errors import first_line
from onnxnorm.ops.functions import all_graphs

#: (rtol, atol) for whole models: a few norm-op tolerances, since errors add up through layers
TOLERANCE = {"float32": (1e-4, 1e-4), "float16": (2e-2, 2e-2), "bfloat16": (6e-2, 6e-2)}


@dataclasses.dataclass
class OutputCheck:
    name: str
    dtype: str
    max_abs: float
    max_rel: float
    ok: bool

    def __str__(self) -> str:
        return (
            f"{self.name} ({self.dtype}): max abs error {self.max_abs:.3g}, "
            f"max rel error {self.max_rel:.3g} {'ok' if self.ok else 'OVER TOLERANCE'}"
        )


def _dim_size(dim, sizes: dict[str, int]) -> int:
    if dim.HasField("dim_value"):
        return dim.dim_value
    name = dim.dim_param or f"_anon{len(sizes)}"
    if name not in sizes and "+" in name:
        sizes[name] = sum(_named_size(part.strip(), sizes) for part in name.split("+"))
    if name not in sizes and name == "total_sequence_length" and "past_sequence_length" in sizes:
        sizes[name] = sizes["past_sequence_length"] + _named_size("sequence_length", sizes)
    return _named_size(name, sizes)


def _named_size(name: str, sizes: dict[str, int]) -> int:
    if name.isdigit():
        return int(name)
    if name not in sizes:
        lowered = name.lower()
        sizes[name] = (
            2 if "batch" in lowered else 5 if ("seq" in lowered or "len" in lowered) else 3
        )
    return sizes[name]


def _index_bounds(model: onnx.ModelProto) -> dict[str, int]:
    """For graph inputs used as Gather indices into a constant table: the table's size."""
    tables = {}
    for graph in all_graphs(model.graph):
        for init in graph.initializer:
            if init.dims:
                tables[init.name] = init.dims[0]
        for node in graph.node:
            if node.op_type == "Constant":
                for attr in node.attribute:
                    if attr.name == "value" and attr.t.dims:
                        tables[node.output[0]] = attr.t.dims[0]
    inputs = {i.name for i in model.graph.input}
    producers = {o: n for g in all_graphs(model.graph) for n in g.node for o in n.output}
    bounds: dict[str, int] = {}
    for graph in all_graphs(model.graph):
        for node in graph.node:
            if node.op_type == "Gather" and len(node.input) > 1 and node.input[0] in tables:
                index = node.input[1]
                # follow casts and reshapes back to a graph input
                for _ in range(4):
                    if index in inputs or index not in producers:
                        break
                    p = producers[index]
                    if p.op_type not in ("Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten"):
                        break
                    index = p.input[0]
                if index in inputs:
                    size = tables[node.input[0]]
                    bounds[index] = min(bounds.get(index, size), size)
    return bounds


def generate_inputs(
    model: onnx.ModelProto, seed: int = 0, sizes: dict[str, int] | None = None
) -> dict[str, np.ndarray]:
    """Inputs for every graph input of ``model``; ``sizes`` fixes symbolic dims by name."""
    rng = np.random.default_rng(seed)
    initializers = {i.name for i in model.graph.initializer}
    bounds = _index_bounds(model)
    sizes = dict(sizes or {})
    inputs = [v for v in model.graph.input if v.name not in initializers]
    # the past length first: a total length is the past plus the new tokens
    inputs.sort(
        key=lambda v: not any(d.dim_param.startswith("past") for d in v.type.tensor_type.shape.dim)
    )
    feeds = {}
    for value in inputs:
        t = value.type.tensor_type
        shape = [_dim_size(d, sizes) for d in t.shape.dim]
        np_type = helper.tensor_dtype_to_np_dtype(t.elem_type)
        name = value.name.lower()
        if np.issubdtype(np_type, np.floating) or t.elem_type == onnx.TensorProto.BFLOAT16:
            data = rng.standard_normal(shape).astype(np.float32)
            feeds[value.name] = data.astype(np_type)
        elif np_type == np.bool_:
            feeds[value.name] = np.ones(shape, np.bool_)
        elif "mask" in name:
            feeds[value.name] = np.ones(shape, np_type)
        elif "position" in name and shape:
            feeds[value.name] = np.broadcast_to(np.arange(shape[-1]), shape).astype(np_type)
        else:
            high = bounds.get(value.name, 2)
            feeds[value.name] = rng.integers(0, high, shape).astype(np_type)
    return feeds


def _session(model, with_library: bool):
    """A CPU session for a ModelProto, a model file (files keep their external data) or a
    file opened at the door (``_io.ModelFile``: already checked, not read again)."""
    import os

    import onnxruntime as ort

    from onnxnorm import runtime
    from onnxnorm._io import ModelFile

    options = ort.SessionOptions()
    options.log_severity_level = 3
    # each session runs once: packing the MatMul weights for later runs only takes time
    # (a session on a 2.25 GiB model opened and run once: 11.7 s with packing, 2.1 s without)
    options.add_session_config_entry("session.disable_prepacking", "1")
    if isinstance(model, ModelFile):
        if with_library:
            runtime.register(options)
        return ort.InferenceSession(
            os.fspath(model.path), options, providers=["CPUExecutionProvider"]
        )
    if with_library:
        return runtime.session(model, options, with_library=True)
    data = os.fspath(model) if isinstance(model, (str, os.PathLike)) else model.SerializeToString()
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def _run(session, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import ml_dtypes
    import onnxruntime as ort

    values = {}
    for name, array in feeds.items():
        if array.dtype == ml_dtypes.bfloat16:
            values[name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                array.view(np.uint16), onnx.TensorProto.BFLOAT16
            )
        else:
            values[name] = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array))
    outputs = []
    for value in session.run_with_ort_values(None, values):
        if value.data_type() == "tensor(bfloat16)":
            raise RuntimeError(
                "bfloat16 graph outputs cannot be read back through ORT's Python API"
            )
        outputs.append(value.numpy())
    return outputs


_HALF: dict[int, str] = {onnx.TensorProto.FLOAT16: "float16", onnx.TensorProto.BFLOAT16: "bfloat16"}


def _computed_in(model: onnx.ModelProto) -> str:
    """The tolerance kind for a model's float32 outputs: "float16" or "bfloat16" where the
    model computes in that type inside (a float16 conversion that kept float32 inputs and
    outputs casts to it), else "float32"."""
    found: set[int] = set()
    for graph in all_graphs(model.graph):
        found.update(t.data_type for t in graph.initializer)
        for node in graph.node:
            if node.op_type == "Cast":
                found.update(a.i for a in node.attribute if a.name == "to")
    for elem in (onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT16):
        if elem in found:
            return _HALF[elem]
    return "float32"


def uses_onnxnorm(model: onnx.ModelProto) -> bool:
    """Whether any graph of ``model`` (subgraphs included) has a node of the onnxnorm domain."""
    from onnxnorm.ops import catalogue

    return any(
        node.domain == catalogue.DOMAIN for graph in all_graphs(model.graph) for node in graph.node
    )


def _structure(model) -> onnx.ModelProto:
    """The model itself, or the graph of a model file without its external data."""
    import os

    from onnxnorm._io import ModelFile

    if isinstance(model, ModelFile):
        return model.model
    if isinstance(model, (str, os.PathLike)):
        from onnxnorm._io import load_model

        # checked and parsed as `onnxnorm fuse` does: a bad file is one OnnxNormError
        return load_model(model, load_weights=False)
    return model


def _float8_check(name: str, want: np.ndarray, have: np.ndarray) -> OutputCheck:
    """A float8 e4m3fn output (a quantized Y), held exact like the integer outputs: every value
    the same, NaN where NaN (either sign); the errors are reported in float8's values."""
    import ml_dtypes

    w = np.asarray(want).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    h = np.asarray(have).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    if w.shape != h.shape:
        return OutputCheck(name, "float8e4m3fn", np.inf, np.inf, False)
    same = bool(np.array_equal(w, h, equal_nan=True))
    with np.errstate(invalid="ignore"):
        diff = np.where(np.isnan(w) & np.isnan(h), 0.0, np.abs(w - h))
    diff = np.where(np.isnan(diff), np.inf, diff)  # NaN on one side only
    max_abs = float(diff.max()) if diff.size else 0.0
    max_rel = float((diff / np.maximum(np.abs(np.nan_to_num(w)), 1e-6)).max()) if diff.size else 0.0
    return OutputCheck(name, "float8e4m3fn", max_abs, max_rel, same)


def verify(
    original,
    fused,
    *,
    with_library: bool | None = None,
    seed: int = 0,
    tolerance: dict | None = None,
    sizes: dict[str, int] | None = None,
    feeds: dict[str, np.ndarray] | None = None,
) -> list[OutputCheck]:
    """Runs both models (ModelProtos, files, or files opened by ``onnxnorm._io.open_model``,
    which are not opened again) on the same generated inputs; one check per
    graph output. Both run with the onnxnorm library registered when either holds onnxnorm
    nodes (``with_library=None``, the default), else both without it; ``True`` / ``False``
    decide for both. ``sizes`` fixes symbolic dims by name (:func:`generate_inputs`);
    ``feeds`` gives the inputs instead."""
    tolerance = {**TOLERANCE, **(tolerance or {})}
    graph = _structure(original)
    if with_library is None:
        with_library = uses_onnxnorm(graph) or uses_onnxnorm(_structure(fused))
    if feeds is None:
        feeds = generate_inputs(graph, seed, sizes)
    expected = _run(_session(original, with_library), feeds)
    got = _run(_session(fused, with_library), feeds)
    checks = []
    computed = _computed_in(graph)
    for info, want, have in zip(graph.graph.output, expected, got):
        elem = info.type.tensor_type.elem_type
        kind = _HALF.get(elem, computed)
        if elem == onnx.TensorProto.FLOAT8E4M3FN:  # (ORT gives its bits as uint8)
            checks.append(_float8_check(info.name, want, have))
            continue
        if not np.issubdtype(np.asarray(want).dtype, np.floating):
            same = np.array_equal(want, have)
            checks.append(
                OutputCheck(
                    info.name,
                    str(np.asarray(want).dtype),
                    0.0 if same else np.inf,
                    0.0 if same else np.inf,
                    same,
                )
            )
            continue
        w, h = np.asarray(want, np.float64), np.asarray(have, np.float64)
        if w.shape != h.shape:
            checks.append(OutputCheck(info.name, kind, np.inf, np.inf, False))
            continue
        # NaN where the original has NaN, and the same infinities, are equal
        same = (w == h) | (np.isnan(w) & np.isnan(h))
        with np.errstate(invalid="ignore"):
            diff = np.where(same, 0.0, np.abs(w - h))
        max_abs = float(diff.max()) if diff.size else 0.0
        max_rel = float((diff / np.maximum(np.abs(w), 1e-6)).max()) if diff.size else 0.0
        rtol, atol = tolerance[kind]
        with np.errstate(invalid="ignore"):
            ok = bool(np.all(same | (diff <= atol + rtol * np.abs(w))))
        checks.append(OutputCheck(info.name, kind, max_abs, max_rel, ok))
    return checks


def _weightless(model: onnx.ModelProto, weights=()) -> bytes:
    """``model`` for ONNX Runtime's loader without its weights: initializers of 1 KiB or more
    (those the pass keeps apart, ``SMALL_TENSOR``), stored inline or as external data, and
    ``weights`` (kept apart from the model) become graph inputs of their type and shape, so
    that nothing is read and the graph, its types, opsets and kernels are still checked."""
    from onnx import external_data_helper

    from onnxnorm._io import SMALL_TENSOR, weightless_shell

    shell = weightless_shell(model)
    declared = {i.name for i in shell.graph.input}
    for tensor in [*model.graph.initializer, *weights]:
        if tensor.ByteSize() < SMALL_TENSOR and not external_data_helper.uses_external_data(tensor):
            shell.graph.initializer.add().CopyFrom(tensor)
        elif tensor.name not in declared:
            shell.graph.input.append(
                helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))
            )
            declared.add(tensor.name)
    return shell.SerializeToString()


def load_problem(model: onnx.ModelProto, weights=()) -> str | None:
    """Why ONNX Runtime cannot create a session for ``model`` (CPU, the onnxnorm library
    registered, no graph optimization), None where it can; checked on the model without its
    weights (:func:`_weightless`), so no weight is read."""
    import onnxruntime as ort

    from onnxnorm import runtime

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    runtime.register(options)
    try:
        ort.InferenceSession(
            _weightless(model, weights), options, providers=["CPUExecutionProvider"]
        )
    except Exception as error:  # noqa: BLE001 - ORT's own words are the answer
        return first_line(error)
    return None
