"""One model on one runtime: open it, run it, say where its nodes ran.

    from onnxnorm.deploy import runners
    runner = runners.open_runner("openvino", "model.onnx")
    outputs = runner.run({"x": x})          # numpy arrays, in the graph's output order
    runner.placement                         # e.g. {"RMS": 5, "MVN": 0, ...} or per provider

The runners (:data:`RUNNERS`):

- ``ort``: ONNX Runtime's CPU provider with the onnxnorm library registered;
- ``ort-plain``: the same without the library (onnxnorm nodes run their function bodies);
- ``ort-openvino``: ONNX Runtime on the OpenVINO plugin execution provider
  (``onnxruntime-ep-openvino``), CPU fallback disabled: a model it does not take whole is
  refused, which is the check;
- ``openvino``: OpenVINO's own runtime (``openvino``), on its CPU device, with onnxnorm's
  frontend extension (:mod:`onnxnorm.deploy.openvino`) only when ``extension=True``.

Both OpenVINO runners compute in float32 (``precision="f32"``, the default here): on a CPU
with bfloat16 instructions OpenVINO's own default is to run a float32 model in bfloat16, whose
results are 1e-2 away from anyone's, its own float32 ones included (``precision=None`` keeps
OpenVINO's default).
- ``tract``: tract (its Python package);
- ``reference``: onnx's reference evaluator (slow: small models only).

:func:`unavailable` says why a runner cannot run on this machine (its package missing, no
device), so that a test can say so instead of passing.
"""

from __future__ import annotations

import collections
import importlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from onnxnorm.errors import OnnxNormError

#: runner -> (what it is, the Python package it needs)
RUNNERS = {
    "ort": ("ONNX Runtime, CPU provider, onnxnorm library registered", "onnxruntime"),
    "ort-plain": ("ONNX Runtime, CPU provider, without the onnxnorm library", "onnxruntime"),
    "ort-openvino": (
        "ONNX Runtime on the OpenVINO plugin execution provider, no CPU fallback",
        "onnxruntime_ep_openvino",
    ),
    "openvino": ("OpenVINO runtime, CPU device", "openvino"),
    "tract": ("tract", "tract"),
    "reference": ("onnx's reference evaluator", "onnx"),
}


@dataclass
class Runner:
    """A model opened on one runtime. ``run(feeds)`` gives the outputs in the graph's order;
    ``placement`` counts where the nodes ran: per execution provider (ONNX Runtime, after a
    first run), per layer type of the compiled model (OpenVINO)."""

    name: str
    output_names: list[str]
    _run: Callable[[Mapping[str, np.ndarray]], list[np.ndarray]]
    placement: collections.Counter[str] = field(default_factory=collections.Counter)
    _after_first: Callable[[], collections.Counter[str]] | None = None

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        outputs = self._run(feeds)
        if self._after_first is not None:
            self.placement = self._after_first()
            self._after_first = None
        return [np.asarray(o) for o in outputs]

    def time(self, feeds: Mapping[str, np.ndarray], repeat: int = 10, warmup: int = 2) -> float:
        """The median seconds of one run on ``feeds``."""
        for _ in range(warmup):
            self._run(feeds)
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            self._run(feeds)
            times.append(time.perf_counter() - start)
        return float(np.median(times))


def unavailable(name: str) -> str | None:
    """Why runner ``name`` cannot run here (None: it can)."""
    if name not in RUNNERS:
        raise OnnxNormError(f"unknown runner {name!r}; known: {', '.join(RUNNERS)}")
    package = RUNNERS[name][1]
    try:
        importlib.import_module(package)
    except ImportError:
        return f"{package} is not installed"
    if name == "ort-openvino":
        from onnxnorm import runtime

        try:
            runtime.plugin_devices(runtime.plugin("openvino"))
        except OnnxNormError as error:
            return str(error)
    return None


def open_runner(
    name: str,
    model: str | os.PathLike | onnx.ModelProto,
    *,
    extension: bool = False,
    threads: int | None = None,
    precision: str | None = "f32",
) -> Runner:
    """``model`` (a path, or a ModelProto) opened on runner ``name`` (:data:`RUNNERS`).
    ``extension``: OpenVINO reads onnxnorm's ops through onnxnorm's extension. ``threads``:
    the runtime's intra-op threads, where it takes a number. ``precision``: OpenVINO's
    inference precision ("f32", "bf16", "f16"; None: OpenVINO's default)."""
    why = unavailable(name)
    if why:
        raise OnnxNormError(f"runner {name}: {why}")
    if name in ("ort", "ort-plain", "ort-openvino"):
        return _ort(name, model, threads, precision)
    if name == "openvino":
        return _openvino(model, extension, threads, precision)
    if name == "tract":
        return _tract(model)
    return _reference(model)


def _path_or_bytes(model: str | os.PathLike | onnx.ModelProto) -> str | bytes:
    return model.SerializeToString() if isinstance(model, onnx.ModelProto) else os.fspath(model)


def _proto(model: str | os.PathLike | onnx.ModelProto) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    return onnx.load(os.fspath(model))


def _ort(name: str, model, threads: int | None, precision: str | None) -> Runner:
    import onnxruntime

    from onnxnorm import runtime

    def options() -> Any:
        opts = onnxruntime.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
        return opts

    kwargs: dict[str, Any] = {"with_library": name == "ort"}
    if name == "ort-openvino":
        provider = {}
        if precision:  # the provider takes OpenVINO's own properties as JSON
            hint = {"CPU": {"INFERENCE_PRECISION_HINT": precision}}
            provider["load_config"] = json.dumps(hint)
        kwargs = {"plugin": runtime.plugin("openvino", options=provider), "cpu_fallback": False}
    source = _path_or_bytes(model)
    session = runtime.session(source, options(), **kwargs)
    names = [o.name for o in session.get_outputs()]
    state: dict[str, Any] = {}

    def run(feeds):
        state.setdefault("feeds", dict(feeds))
        return session.run(None, dict(feeds))

    def placement() -> collections.Counter[str]:
        return runtime.placement(source, state["feeds"], **kwargs)

    return Runner(name, names, run, _after_first=placement)


def _openvino(model, extension: bool, threads: int | None, precision: str | None) -> Runner:
    import openvino as ov

    core = ov.Core()
    if extension:
        from onnxnorm.deploy import openvino as onnxnorm_openvino

        onnxnorm_openvino.add_to(core)
    source = _path_or_bytes(model)
    ov_model = core.read_model(source) if isinstance(source, str) else core.read_model(source, b"")
    config: dict[str, Any] = {"INFERENCE_NUM_THREADS": threads} if threads else {}
    if precision:
        config["INFERENCE_PRECISION_HINT"] = precision
    compiled = core.compile_model(ov_model, "CPU", config)
    request = compiled.create_infer_request()
    names = [o.get_any_name() for o in compiled.outputs]
    layers = collections.Counter(
        str(op.get_rt_info()["layerType"].astype(str))
        for op in compiled.get_runtime_model().get_ops()
    )

    def run(feeds):
        result = request.infer(dict(feeds))
        return [result[o] for o in compiled.outputs]

    return Runner("openvino", names, run, placement=layers)


def _tract(model) -> Runner:
    import tract

    proto = _proto(model)
    inputs = [i.name for i in proto.graph.input if i.name not in _initializers(proto)]
    names = [o.name for o in proto.graph.output]
    loaded = tract.onnx().load(os.fspath(model)) if not isinstance(model, onnx.ModelProto) else None
    if loaded is None:
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "model.onnx")
            onnx.save(proto, path)
            loaded = tract.onnx().load(path)
    runnable = loaded.into_model().into_runnable()

    def run(feeds):
        return [t.to_numpy() for t in runnable.run([feeds[n] for n in inputs])]

    return Runner("tract", names, run)


def _reference(model) -> Runner:
    from onnx.reference import ReferenceEvaluator

    proto = _proto(model)
    evaluator = ReferenceEvaluator(proto)
    names = [o.name for o in proto.graph.output]

    def run(feeds):
        return list(evaluator.run(None, dict(feeds)))

    return Runner("reference", names, run)


def _initializers(proto: onnx.ModelProto) -> set[str]:
    return {t.name for t in proto.graph.initializer}


def runners_here(names: Sequence[str] = tuple(RUNNERS)) -> dict[str, str | None]:
    """Each runner of ``names`` and why it cannot run here (None: it can)."""
    return {name: unavailable(name) for name in names}
