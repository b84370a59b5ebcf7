#!/usr/bin/env python3
"""The runtimes step of tools/gpu_check.sh: the Llama-style decoder of ``onnxnorm export llama``
(float32 and float16, small), exported in --mode function and written for each GPU runtime
with ``lowering.lower(model, runtime=...)``, run on that runtime and compared with ONNX
Runtime's CPU provider with the onnxnorm library on the function form (the reference):

- ``--for ort-cuda``: ONNX Runtime's CUDA provider (``runtime.CUDA_PROVIDERS``) with the onnxnorm
  library; every onnxnorm node must run the library's CUDA kernel (none on the CPU, none
  inlined);
- ``--for tensorrt``: ONNX Runtime's TensorrtExecutionProvider, the TensorRT RTX plugin
  (onnxruntime-ep-nv-tensorrt-rtx) and the ``tensorrt`` package's ONNX parser (every node
  parsed, an engine built and run), whichever of them is here; the whole graph must go to
  TensorRT; one skipped row names them all where none is;
- ``--for webgpu``: the WebGPU plugin (onnxruntime-ep-webgpu) without CPU fallback;
- ``--for ort-cuda`` again on the CUDA devices of ONNX Runtime's plugin API
  (``get_ep_devices``): the bundled CUDA plugin where the build says ``cuda-plugin-ep``, else
  onnxruntime-gpu's CUDA provider library registered as an execution provider library (the row
  says which: there is no CUDA plugin package of its own).

A runtime that is not here gives a row saying why, skipped: neither a failure nor a pass.
``--stand-ins`` also runs each form on ONNX Runtime's CPU provider (what a machine without a
GPU can check: the export, the lowering, the table); ``--dry-run`` exports and lowers and runs
nothing. It prints a Markdown table (``--markdown``, ``--json`` also write it). Exit status: 0
when a runtime row ran and none failed, 1 when one failed, 3 when every runtime row was skipped
(nothing here to run on), 2 for bad arguments.
"""

import argparse
import collections
import contextlib
import dataclasses
import io
import json
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

DTYPES = ("float32", "float16")
#: how far from the reference a GPU run may be, times max(1, largest reference value): loose
#: enough for TF32 and float16 accumulation in another order over two layers, tight enough
#: for a wrong kernel (the kernels' own accuracy is the correctness step's)
TOLERANCE = {"float32": 1e-2, "float16": 3e-2}
NOTHING_RAN = 3
TRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
TRANSFERS = ("MemcpyFromHost", "MemcpyToHost")


@dataclasses.dataclass
class Row:
    runtime: str
    form: str
    dtype: str = "-"
    loads: bool | None = None
    runs: bool | None = None
    diff: float | None = None
    placement: str = ""
    outcome: str = "ok"
    #: a row of a GPU runtime (not a CPU stand-in)
    device: bool = True

    def fail(self, why: str) -> "Row":
        self.outcome = f"FAILED: {why}"
        return self

    def skip(self, why: str) -> "Row":
        self.outcome = f"skipped: {why}"
        return self

    def cells(self) -> list[str]:
        def yes(value: bool | None) -> str:
            return "-" if value is None else ("yes" if value else "no")

        diff = "-" if self.diff is None else f"{self.diff:.3g}"
        return [
            self.runtime,
            self.form,
            self.dtype,
            yes(self.loads),
            yes(self.runs),
            diff,
            self.placement or "-",
            self.outcome,
        ]


HEADER = ["runtime", "--for", "dtype", "loads", "runs", "max abs diff", "placement", "outcome"]


def table(rows: Sequence[Row]) -> str:
    """The rows as a Markdown table (``|`` in a cell escaped)."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for row in rows:
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in row.cells()) + " |")
    return "\n".join(lines)


def _one_line(error: BaseException) -> str:
    from onnxnorm.errors import first_line

    return first_line(error)


# -- the models ---------------------------------------------------------------------------


def export(work: Path, dtype: str, args: argparse.Namespace) -> Path:
    """``onnxnorm export llama --mode function`` of ``dtype`` into ``work``."""
    from onnxnorm import cli

    path = work / f"llama-{dtype}.onnx"
    argv = ["export", "llama", "-o", str(path), "--mode", "function", "--dtype", dtype]
    argv += ["--batch", str(args.batch), "--seq", str(args.seq)]
    argv += ["--hidden", str(args.hidden), "--layers", str(args.layers)]
    if not args.dynamic:
        argv.append("--static")
    status = cli.main(argv)
    if status != 0:
        raise SystemExit(f"gpu_runtimes: onnxnorm {' '.join(argv)} failed ({status})")
    return path


def lowered(model: onnx.ModelProto, runtime: str) -> onnx.ModelProto:
    from onnxnorm.fusion.lowering import lower

    return lower(model, runtime=runtime)


def form_summary(model: onnx.ModelProto) -> str:
    """What a form holds: its onnxnorm nodes, its norm ops of other domains."""
    from onnxnorm.ops import functions

    ours = collections.Counter(n.op_type for n in functions.onnxnorm_nodes(model))
    norms = collections.Counter(
        f"{n.domain + '.' if n.domain else ''}{n.op_type}"
        for n in model.graph.node
        if n.domain != "onnxnorm" and "Normalization" in n.op_type
    )
    parts = [f"{k} x{v}" for k, v in sorted(ours.items())] + [
        f"{k} x{v}" for k, v in sorted(norms.items())
    ]
    return ", ".join(parts) or "no norm op (plain ops)"


def form_problem(runtime: str, model: onnx.ModelProto) -> str | None:
    """Why ``model`` is not what ``runtime``'s form must be (None: it is)."""
    from onnxnorm.ops import functions

    ours = sum(1 for _ in functions.onnxnorm_nodes(model))
    if runtime == "ort-cuda" and not ours:
        return "the ort-cuda form has no onnxnorm node"
    if runtime != "ort-cuda" and ours:
        return f"the {runtime} form keeps {ours} onnxnorm node(s)"
    if runtime == "tensorrt":
        foreign = sorted({n.domain for n in model.graph.node if n.domain not in ("", "ai.onnx")})
        if foreign:
            return f"the tensorrt form has ops of domain(s) {', '.join(foreign)}"
    return None


def feeds_for(model: onnx.ModelProto, batch: int, seq: int) -> dict[str, np.ndarray]:
    """Random inputs for the graph's inputs (symbolic dims: batch, then sequence)."""
    rng = np.random.default_rng(0)
    weights = {i.name for i in model.graph.initializer}
    feeds = {}
    for value in model.graph.input:
        if value.name in weights:
            continue
        tensor = value.type.tensor_type
        dims = [
            d.dim_value if d.HasField("dim_value") else (batch, seq)[min(axis, 1)]
            for axis, d in enumerate(tensor.shape.dim)
        ]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        feeds[value.name] = rng.standard_normal(dims).astype(dtype)
    return feeds


def max_abs_diff(outputs: Sequence[Any], reference: Sequence[np.ndarray]) -> float:
    """The largest absolute difference over all outputs (NaN where a value is NaN in one and
    not the other, or shapes differ)."""
    worst = 0.0
    for out, ref in zip(outputs, reference, strict=True):
        a, b = np.asarray(out, np.float64), np.asarray(ref, np.float64)
        if a.shape != b.shape:
            return float("nan")
        both = np.isnan(a) & np.isnan(b)
        if (np.isnan(a) ^ np.isnan(b)).any():
            return float("nan")
        diff = np.where(both, 0.0, np.abs(a - b))
        worst = max(worst, float(diff.max(initial=0.0)))
    return worst


@dataclasses.dataclass
class Case:
    """One dtype: the function form and the CPU reference, and each runtime's form."""

    dtype: str
    function: onnx.ModelProto
    forms: dict[str, onnx.ModelProto]
    feeds: dict[str, np.ndarray]
    reference: list[np.ndarray] | None = None

    def tolerance(self) -> float:
        assert self.reference is not None
        largest = max(float(np.nanmax(np.abs(r.astype(np.float64)))) for r in self.reference)
        return TOLERANCE[self.dtype] * max(1.0, largest)


# -- running on ONNX Runtime, with where each node ran ---------------------------------------


def profiled_options(folder: Path) -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(folder / "profile")
    return options


def kernels(session: Any) -> list[tuple[str, str]]:
    """(op, provider) of every kernel the profiled session ran."""
    with open(session.end_profiling()) as f:
        events = json.load(f)
    return [
        (e["args"].get("op_name", "?"), e["args"].get("provider", "?"))
        for e in events
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")
    ]


def _short(provider: str) -> str:
    return provider.removesuffix("ExecutionProvider") or provider


def placement_problem(
    ran: list[tuple[str, str]], model: onnx.ModelProto, provider: str, check: str
) -> tuple[str, str | None]:
    """The placement summary, and what is wrong with it: ``check`` "library" (every onnxnorm
    node ran the library's kernel on ``provider``, none elsewhere) or "whole" (every kernel
    ran on ``provider``)."""
    from onnxnorm.ops import functions

    per_provider = collections.Counter(p for _, p in ran)
    summary = ", ".join(f"{_short(p)} {n}" for p, n in per_provider.most_common())
    if check == "whole":
        # (the copies ONNX Runtime adds between the host and a device are no model node)
        model_nodes = [(op, p) for op, p in ran if op not in TRANSFERS]
        others = collections.Counter(p for _, p in model_nodes if p != provider)
        if not model_nodes:
            return summary, "no kernel ran"
        if others:
            where = ", ".join(f"{n} on {_short(p)}" for p, n in others.items())
            return summary, f"not all on {_short(provider)}: {where}"
        return summary, None
    nodes = collections.Counter(n.op_type for n in functions.onnxnorm_nodes(model))
    ours = [(op, p) for op, p in ran if op in nodes]
    on = sum(1 for _, p in ours if p == provider)
    summary += f"; onnxnorm {on}/{sum(nodes.values())} on {_short(provider)}"
    elsewhere = collections.Counter(p for _, p in ours if p != provider)
    if elsewhere:
        where = ", ".join(f"{n} on {_short(p)}" for p, n in elsewhere.items())
        return summary, f"onnxnorm nodes off {_short(provider)}: {where}"
    if on != sum(nodes.values()):
        return summary, "onnxnorm nodes did not run the library's kernel (inlined bodies?)"
    return summary, None


def ort_row(
    row: Row,
    case: Case,
    model: onnx.ModelProto,
    open_session: Callable[[Any], Any],
    provider: str,
    check: str,
    work: Path,
) -> Row:
    """Opens ``model`` (``open_session(options)``), runs it once on the case's feeds with the
    profiler on and fills the row: loads, runs, the difference, the placement."""
    row.dtype = case.dtype
    with tempfile.TemporaryDirectory(dir=work) as folder:
        try:
            session = open_session(profiled_options(Path(folder)))
        except Exception as error:  # noqa: BLE001 - the row says why
            row.loads = False
            return row.fail(f"load: {_one_line(error)}")
        row.loads = True
        try:
            outputs = session.run(None, case.feeds)
        except Exception as error:  # noqa: BLE001 - the row says why
            row.runs = False
            return row.fail(f"run: {_one_line(error)}")
        row.runs = True
        ran = kernels(session)
    return judge(row, case, outputs, *placement_problem(ran, model, provider, check))


def judge(row: Row, case: Case, outputs: Sequence[Any], summary: str, problem: str | None) -> Row:
    assert case.reference is not None
    row.diff = max_abs_diff(outputs, case.reference)
    row.placement = summary
    tolerance = case.tolerance()
    if not row.diff <= tolerance:
        return row.fail(f"max abs diff {row.diff:.3g} above {tolerance:.3g}")
    if problem:
        return row.fail(problem)
    return row


# -- the runtimes -------------------------------------------------------------------------


def _probe_model() -> bytes:
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe", [x], [y])
    opsets = [helper.make_opsetid("", 17)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8).SerializeToString()


def provider_starts(provider: str) -> str | None:
    """Why ONNX Runtime's ``provider`` does not start here (None: it does): a probe session must
    get it (ONNX Runtime falls back quietly, or after printing an "EP Error", where its
    libraries do not load)."""
    import onnxruntime

    if provider not in onnxruntime.get_available_providers():
        return f"onnxruntime {onnxruntime.__version__} has no {provider}"
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            session = onnxruntime.InferenceSession(_probe_model(), providers=[provider, CPU])
    except Exception as error:  # noqa: BLE001 - the reason
        return f"{provider} does not start: {_one_line(error)}"
    if session.get_providers()[0] != provider:
        said = [line for line in printed.getvalue().splitlines() if "EP Error" in line]
        why = said[0].strip() if said else f"session providers {session.get_providers()}"
        return f"{provider} did not start ({why[:300]})"
    return None


@dataclasses.dataclass
class Target:
    """One runtime a form is run on: why it cannot run here, and its row of a case."""

    title: str
    form: str
    unavailable: Callable[[], str | None]
    run: Callable[[Row, Case, Path], Row]
    #: the TensorRT paths: one row names them all where none is here
    group: str = ""
    note: str = ""


def _cuda_unavailable() -> str | None:
    from onnxnorm import runtime
    from onnxnorm.errors import OnnxNormError

    why = provider_starts(CUDA)
    if why:
        return why
    try:
        runtime.library_path("cuda")
    except OnnxNormError as error:
        return str(error)
    return None


def _run_cuda(row: Row, case: Case, work: Path) -> Row:
    from onnxnorm import runtime

    model = case.forms["ort-cuda"]
    return ort_row(
        row,
        case,
        model,
        lambda options: runtime.session(model, options, providers=runtime.CUDA_PROVIDERS),
        CUDA,
        "library",
        work,
    )


class CudaPlugin:
    """The CUDA devices of ONNX Runtime's plugin API: onnxruntime-gpu registers its bundled
    CUDA plugin itself where its build info says ``cuda-plugin-ep``; otherwise its CUDA provider
    library (a provider bridge that exports ``CreateEpFactories``, as onnxruntime-gpu 1.31.1's
    does) is registered here as an execution provider library. No package of its own ships a
    CUDA plugin (the TensorRT RTX, WebGPU and OpenVINO plugins have theirs)."""

    def __init__(self, provider: str = CUDA) -> None:
        self.provider = provider
        self.devices: list[Any] = []
        self.kind = ""

    def unavailable(self) -> str | None:
        import onnxruntime

        from onnxnorm import runtime
        from onnxnorm.errors import OnnxNormError

        try:
            runtime.library_path("cuda")
        except OnnxNormError as error:
            return str(error)
        if not hasattr(onnxruntime, "get_ep_devices"):
            return f"onnxruntime {onnxruntime.__version__} has no plugin API (get_ep_devices)"
        version = onnxruntime.__version__
        library = Path(onnxruntime.__file__).parent / "capi" / "libonnxruntime_providers_cuda.so"
        if "cuda-plugin-ep=" in onnxruntime.get_build_info():
            self.kind = f"onnxruntime {version}'s bundled CUDA plugin (build info: cuda-plugin-ep)"
        elif self._listed():
            self.kind = (
                f"onnxruntime {version} lists its CUDA provider's devices itself: no CUDA "
                "plugin package (its build info has no cuda-plugin-ep)"
            )
        else:
            self.kind = (
                f"onnxruntime {version}'s CUDA provider library registered as an EP library: "
                "no CUDA plugin package (its build info has no cuda-plugin-ep)"
            )
        if not self._listed():
            if not library.is_file():
                return (
                    f"onnxruntime {version} has no CUDA provider library ({library.name}) and "
                    "no CUDA plugin package is installed"
                )
            try:
                onnxruntime.register_execution_provider_library(CUDA, str(library))
            except Exception as error:  # noqa: BLE001 - the reason
                if "already registered" not in str(error).lower():
                    return f"registering {library.name} failed: {_one_line(error)}"
        self.devices = self._listed()
        if not self.devices:
            offered = sorted({d.ep_name for d in onnxruntime.get_ep_devices()})
            return f"no {CUDA} GPU device in get_ep_devices() (devices of: {', '.join(offered)})"
        return None

    def _listed(self) -> list[Any]:
        import onnxruntime

        return [
            d
            for d in onnxruntime.get_ep_devices()
            if d.ep_name == CUDA and d.device.type.name == "GPU"
        ]

    def run(self, row: Row, case: Case, work: Path) -> Row:
        import onnxruntime

        from onnxnorm import runtime

        model = case.forms["ort-cuda"]

        def open_session(options: Any) -> Any:
            runtime.register(options)
            options.add_provider_for_devices(self.devices, {})
            return onnxruntime.InferenceSession(model.SerializeToString(), options)

        row = ort_row(row, case, model, open_session, self.provider, "library", work)
        if row.outcome == "ok":
            row.outcome = f"ok ({self.kind})"
        else:
            row.outcome += f" ({self.kind})"
        return row


def _run_ort_tensorrt(row: Row, case: Case, work: Path) -> Row:
    import onnxruntime

    from onnxnorm import runtime

    model = case.forms["tensorrt"]
    providers = [TRT] + [p for p in (CUDA, CPU) if p in onnxruntime.get_available_providers()]
    return ort_row(
        row,
        case,
        model,
        lambda options: runtime.session(model, options, providers, with_library=False),
        TRT,
        "whole",
        work,
    )


def _plugin_unavailable(name: str) -> Callable[[], str | None]:
    def why() -> str | None:
        from onnxnorm import runtime
        from onnxnorm.errors import OnnxNormError

        try:
            runtime.plugin_devices(runtime.plugin(name))
        except OnnxNormError as error:
            return str(error)
        return None

    return why


def _run_plugin(name: str, form: str) -> Callable[[Row, Case, Path], Row]:
    def run(row: Row, case: Case, work: Path) -> Row:
        from onnxnorm import runtime

        plugin = runtime.plugin(name)
        model = case.forms[form]
        return ort_row(
            row,
            case,
            model,
            lambda options: runtime.session(model, options, plugin=plugin, cpu_fallback=False),
            plugin.name,
            "whole",
            work,
        )

    return run


def _tensorrt_unavailable() -> str | None:
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return "the tensorrt package is not installed"
    except Exception as error:  # noqa: BLE001 - installed, but its libraries do not load
        return f"the tensorrt package does not load: {_one_line(error)}"
    try:
        import torch
    except ImportError:
        return "torch (which holds the engine's buffers on the GPU) is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return None


def _run_tensorrt(row: Row, case: Case, work: Path) -> Row:
    """The tensorrt package's ONNX parser: every node parsed, an engine built (strongly typed:
    the model's own types) and run on torch's CUDA buffers."""
    import tensorrt as trt
    import torch

    row.dtype = case.dtype
    model = case.forms["tensorrt"]
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    creation = trt.NetworkDefinitionCreationFlag
    if hasattr(creation, "STRONGLY_TYPED"):
        flags |= 1 << int(creation.STRONGLY_TYPED)
    if int(trt.__version__.split(".")[0]) < 10:
        flags |= 1 << int(creation.EXPLICIT_BATCH)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(model.SerializeToString()):
        row.loads = False
        errors = [parser.get_error(i) for i in range(parser.num_errors)]
        said = "; ".join(f"{e.node_name()} ({e.node_operator()}): {e.desc()}" for e in errors[:3])
        return row.fail(f"parse: {said or 'failed'}")
    config = builder.create_builder_config()
    shapes = {name: tuple(value.shape) for name, value in case.feeds.items()}
    inputs = [network.get_input(i) for i in range(network.num_inputs)]
    if any(-1 in tuple(t.shape) for t in inputs):
        profile = builder.create_optimization_profile()
        for t in inputs:
            profile.set_shape(t.name, shapes[t.name], shapes[t.name], shapes[t.name])
        config.add_optimization_profile(profile)
    layers = network.num_layers
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        row.loads = False
        return row.fail("the engine did not build")
    engine_runtime = trt.Runtime(logger)  # (kept while its engine lives)
    engine = engine_runtime.deserialize_cuda_engine(serialized)
    row.loads = engine is not None
    if engine is None:
        return row.fail("the engine did not deserialize")
    types = {
        getattr(trt, name): getattr(torch, name)
        for name in ("float32", "float16", "int64", "int32", "bool")
        if hasattr(trt, name)
    }
    context = engine.create_execution_context()
    buffers = {}
    try:
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
                buffers[name] = torch.from_numpy(case.feeds[name]).cuda()
                context.set_input_shape(name, shapes[name])
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            if engine.get_tensor_mode(name) != trt.TensorIOMode.INPUT:
                shape = tuple(context.get_tensor_shape(name))
                dtype = types[engine.get_tensor_dtype(name)]
                buffers[name] = torch.empty(shape, dtype=dtype, device="cuda")
        for name, buffer in buffers.items():
            context.set_tensor_address(name, buffer.data_ptr())
        stream = torch.cuda.current_stream()
        if not context.execute_async_v3(stream.cuda_stream):
            raise RuntimeError("execute_async_v3 returned False")
        stream.synchronize()
        outputs = [buffers[o.name].cpu().numpy() for o in model.graph.output]
    except Exception as error:  # noqa: BLE001 - the row says why
        row.runs = False
        return row.fail(f"run: {_one_line(error)}")
    row.runs = True
    summary = f"every node parsed: {len(model.graph.node)} nodes, {layers} layers"
    return judge(row, case, outputs, summary, None)


def targets() -> list[Target]:
    plugin = CudaPlugin()
    return [
        Target("ONNX Runtime CUDA EP + onnxnorm library", "ort-cuda", _cuda_unavailable, _run_cuda),
        Target(
            "ONNX Runtime TensorrtExecutionProvider",
            "tensorrt",
            lambda: provider_starts(TRT),
            _run_ort_tensorrt,
            group="tensorrt",
            note=f"onnxruntime's {TRT}",
        ),
        Target(
            "ONNX Runtime TensorRT RTX plugin EP",
            "tensorrt",
            _plugin_unavailable("tensorrt-rtx"),
            _run_plugin("tensorrt-rtx", "tensorrt"),
            group="tensorrt",
            note="the TensorRT RTX plugin (onnxruntime-ep-nv-tensorrt-rtx)",
        ),
        Target(
            "TensorRT ONNX parser (tensorrt package)",
            "tensorrt",
            _tensorrt_unavailable,
            _run_tensorrt,
            group="tensorrt",
            note="the tensorrt package's ONNX parser",
        ),
        Target(
            "ONNX Runtime WebGPU plugin EP, no CPU fallback",
            "webgpu",
            _plugin_unavailable("webgpu"),
            _run_plugin("webgpu", "webgpu"),
        ),
        Target(
            "ONNX Runtime CUDA EP devices (plugin API) + onnxnorm library",
            "ort-cuda",
            plugin.unavailable,
            plugin.run,
        ),
    ]


# -- the CPU stand-ins --------------------------------------------------------------------


def stand_in(form: str, with_library: bool) -> Target:
    """``form`` on ONNX Runtime's CPU provider (the library registered where the form needs
    it): what a machine without the runtime checks of that form."""

    def run(row: Row, case: Case, work: Path) -> Row:
        from onnxnorm import runtime

        model = case.forms[form]
        return ort_row(
            row,
            case,
            model,
            lambda options: runtime.session(model, options, with_library=with_library),
            CPU,
            "library" if with_library else "whole",
            work,
        )

    title = "stand-in: ONNX Runtime CPU EP" + (" + onnxnorm library" if with_library else "")
    return Target(title, form, lambda: None, run)


STAND_INS = (("ort-cuda", True), ("tensorrt", False), ("webgpu", False))


# -- the step -----------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tools/gpu_runtimes.py",
        description="Run the --for forms of a small Llama-style decoder on the GPU runtimes "
        "here (ONNX Runtime's CUDA, TensorRT and WebGPU providers, TensorRT's parser) against "
        "ONNX Runtime's CPU provider with the onnxnorm library; a runtime not here is a "
        "skipped row.",
    )
    p.add_argument("--dtypes", default=",".join(DTYPES), help="default: %(default)s")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=8)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument(
        "--dynamic", action="store_true", help="dynamic batch and sequence (default: static)"
    )
    p.add_argument("--stand-ins", action="store_true", help="also run each form on the CPU")
    p.add_argument("--dry-run", action="store_true", help="export and lower, run nothing")
    p.add_argument("--work", type=Path, help="keep the models here (default: a temporary one)")
    p.add_argument("--markdown", type=Path, help="also write the table here")
    p.add_argument("--json", type=Path, help="also write the rows here as JSON")
    return p


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    for dtype in args.dtypes:
        if dtype not in DTYPES:
            p.error(f"--dtypes: {dtype} is not one of {', '.join(DTYPES)}")
    if not args.dtypes:
        p.error("--dtypes: none given")
    for name in ("batch", "seq", "hidden", "layers"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    return args


def cases(args: argparse.Namespace, work: Path) -> list[Case]:
    """The exported models, each lowered for every form, with their feeds."""
    found = []
    for dtype in args.dtypes:
        function = onnx.load(export(work, dtype, args))
        forms = {}
        for form in ("ort-cuda", "tensorrt", "webgpu"):
            model = lowered(function, form)
            problem = form_problem(form, model)
            if problem:
                raise SystemExit(f"gpu_runtimes: {dtype}: {problem}")
            onnx.save(model, work / f"llama-{dtype}-{form}.onnx")
            print(f"lowered: {dtype} --for {form}: {form_summary(model)}")
            forms[form] = model
        found.append(Case(dtype, function, forms, feeds_for(function, args.batch, args.seq)))
    return found


def environment() -> dict[str, Any]:
    import onnxruntime

    return {
        "onnxruntime": onnxruntime.__version__,
        "onnxruntime_file": onnxruntime.__file__,
        "providers": onnxruntime.get_available_providers(),
        "build_info": onnxruntime.get_build_info(),
    }


def rows_of(args: argparse.Namespace, found: list[Case], work: Path) -> list[Row]:
    rows: list[Row] = []
    if args.dry_run:
        for target in targets():
            for case in found:
                rows.append(Row(target.title, target.form, case.dtype, outcome="not run (dry run)"))
        return rows
    from onnxnorm import runtime

    for case in found:
        case.reference = runtime.session(case.function).run(None, case.feeds)
    done: list[tuple[Target, str | list[Row]]] = []  # each target: why not, or its rows
    for target in targets():
        try:
            why = target.unavailable()
        except Exception as error:  # noqa: BLE001 - a probe that breaks is a failed row
            done.append((target, [Row(target.title, target.form).fail(f"probe: {error!r}")]))
            continue
        if why:
            done.append((target, why))
            continue
        ran = []
        for case in found:
            print(f"running: {target.title}, --for {target.form}, {case.dtype}", flush=True)
            ran.append(run_row(target, Row(target.title, target.form), case, work))
        done.append((target, ran))
    groups = {t.group for t, outcome in done if t.group and not isinstance(outcome, str)}
    named: set[str] = set()
    for target, outcome in done:
        if not isinstance(outcome, str):
            rows.extend(outcome)
        elif not target.group:
            rows.append(Row(target.title, target.form).skip(outcome))
        elif target.group in groups:
            print(f"also looked for {target.note}: {outcome}")
        elif target.group not in named:  # one row names every path of the group
            named.add(target.group)
            looked = "; ".join(f"{t.note}: {why}" for t, why in done if t.group == target.group)
            rows.append(Row("TensorRT", target.form).skip(f"none here (looked for {looked})"))
    if args.stand_ins:
        for form, with_library in STAND_INS:
            target = stand_in(form, with_library)
            for case in found:
                row = Row(target.title, target.form, device=False)
                rows.append(run_row(target, row, case, work))
    return rows


def run_row(target: Target, row: Row, case: Case, work: Path) -> Row:
    """``target``'s row of ``case``, printed as it ends (the log keeps the rows done should a
    later runtime bring the process down); an error of this script is a failed row."""
    try:
        row = target.run(row, case, work)
    except Exception as error:  # noqa: BLE001 - the row says what broke
        row.dtype = case.dtype
        row.fail(f"error: {error!r}")
    print("row: " + table([row]).splitlines()[-1], flush=True)
    return row


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    with contextlib.ExitStack() as stack:
        if args.work is None:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpu_runtimes")))
        else:
            work = args.work
            work.mkdir(parents=True, exist_ok=True)
        found = cases(args, work)
        if not args.dry_run:
            env = environment()
            print(f"onnxruntime {env['onnxruntime']} ({env['onnxruntime_file']})")
            print(f"providers: {', '.join(env['providers'])}")
        rows = rows_of(args, found, work)
    text = table(rows)
    print()
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    if args.json:
        document = {
            "dry_run": args.dry_run,
            "environment": None if args.dry_run else environment(),
            "rows": [dataclasses.asdict(row) for row in rows],
        }
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    if args.dry_run:
        return 0
    if any(row.outcome.startswith("FAILED") for row in rows):
        return 1
    if not any(row.device and row.runs for row in rows):
        return NOTHING_RAN
    return 0


if __name__ == "__main__":
    sys.exit(main())
