"""Where the onnxnorm custom-op libraries are, and registering them into ONNX Runtime sessions.

    import onnxnorm.runtime as rt
    session = rt.session("model.onnx")                   # CPU, with the onnxnorm kernels
    session = rt.session("model.onnx", providers=rt.CUDA_PROVIDERS)   # CUDA, then CPU
    options = rt.register(onnxruntime.SessionOptions())  # or into your own options
    session = rt.session("model.onnx", plugin=rt.plugin("openvino"), cpu_fallback=False)

One library is registered for every session, ``libonnxnorm_ops.so``: it holds the ORT glue and
the CPU kernels, and, when the CUDA library ``libonnxnorm_cuda_ops.so`` was built next to it,
also registers the CUDA kernels, which load that library only when ORT places an onnxnorm node
on the CUDA execution provider. Nothing here loads a CUDA library.

Plugin execution providers (how ONNX Runtime ships OpenVINO, WebGPU, TensorRT RTX and others as
packages of their own) are registered once per process from their library (:class:`Plugin`,
:func:`plugin` for the packages onnxnorm knows); a session on one runs every node it takes,
and registers the onnxnorm library only where the model has an onnxnorm node without a
function body, since a provider that does not take onnxnorm's ops would otherwise leave each
of them to the CPU and cut the graph into pieces.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx

import onnxnorm
from onnxnorm.errors import OnnxNormError

_LIBRARY_NAMES = {
    "cpu": {
        "linux": "libonnxnorm_ops.so",
        "darwin": "libonnxnorm_ops.dylib",
        "win32": "onnxnorm_ops.dll",
    },
    "cuda": {
        "linux": "libonnxnorm_cuda_ops.so",
        "darwin": "libonnxnorm_cuda_ops.dylib",
        "win32": "onnxnorm_cuda_ops.dll",
    },
}
#: names the (CPU) library file explicitly, a build of your own say; the CUDA library is the one
#: next to it
ENV_LIBRARY = "ONNXNORM_LIBRARY"
CUDA_PROVIDER = "CUDAExecutionProvider"
#: providers for a session on the GPU: CUDA, and the CPU for what CUDA does not run
CUDA_PROVIDERS = (CUDA_PROVIDER, "CPUExecutionProvider")


def _library_name(kind: str) -> str:
    if kind not in _LIBRARY_NAMES:
        raise ValueError(f"library kind must be one of {sorted(_LIBRARY_NAMES)}, got {kind!r}")
    names = _LIBRARY_NAMES[kind]
    return names.get(sys.platform, names["linux"])


def _candidates() -> list[Path]:
    """Where the CPU library may be: the package's lib/ folder; in an editable install, the one
    in site-packages, away from the sources."""
    name = _library_name("cpu")
    found = [Path(folder) / "lib" / name for folder in onnxnorm.__path__]
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        found.append(Path(str(distribution("onnxnorm").locate_file(f"onnxnorm/lib/{name}"))))
    except PackageNotFoundError:
        pass
    return found


def library_path(kind: str = "cpu") -> Path:
    """The path of a built onnxnorm library, not loaded: ``"cpu"``, the library to register (the
    ORT glue and the CPU kernels; $ONNXNORM_LIBRARY when set), or ``"cuda"``, the CUDA kernels
    next to it, which the CPU library loads itself when a CUDA session needs them."""
    name = _library_name(kind)
    override = os.environ.get(ENV_LIBRARY)
    if override:
        if not Path(override).is_file():
            raise OnnxNormError(f"{ENV_LIBRARY}={override}: no such file")
        candidates = [Path(override)]
    else:
        candidates = _candidates()
    if kind == "cuda":
        candidates = [c.parent / name for c in candidates]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    looked = ", ".join(str(c) for c in candidates)
    if kind == "cuda":
        raise OnnxNormError(
            f"the onnxnorm CUDA library is not built (looked for {looked}); it is "
            "built next to the CPU library when nvcc is found (ONNXNORM_CUDA=AUTO|ON)"
        )
    raise OnnxNormError(
        f"the onnxnorm native library is not built (looked for {looked}); "
        "install the package with `make install` or `pip install .`, or set "
        f"{ENV_LIBRARY}"
    )


def build_info() -> dict[str, Any]:
    """Facts the native build recorded: the ORT C API version of its headers, CUDA or not."""
    info = library_path().parent / "build_info.json"
    return json.loads(info.read_text()) if info.is_file() else {}


def runtime_api_version(version: str | None = None) -> int:
    """The C API version an onnxruntime release provides (1.X.Y provides API X)."""
    if version is None:
        import onnxruntime

        version = onnxruntime.__version__
    major, minor = (int(part) for part in version.split(".")[:2])
    return minor if major == 1 else 10**6


def check_compatible(runtime_version: str | None = None) -> None:
    """Raises OnnxNormError when onnxruntime is older than the headers the library was built
    against (the library would be refused at registration)."""
    import onnxruntime

    runtime_version = runtime_version or onnxruntime.__version__
    built = build_info().get("ort_api_version")
    if built is not None and runtime_api_version(runtime_version) < int(built):
        raise OnnxNormError(
            f"onnxruntime {runtime_version} provides C API version "
            f"{runtime_api_version(runtime_version)}, older than the API version {built} "
            f"(ONNX Runtime 1.{built} headers) that the onnxnorm library was built against: "
            f"upgrade onnxruntime to >= 1.{built} or rebuild onnxnorm against older headers"
        )


def register(options: Any = None) -> Any:
    """Registers the onnxnorm library into an ``onnxruntime.SessionOptions`` (a new one when
    none is given) and returns it: the CPU kernels, and the CUDA kernels when the CUDA library is
    built (they run where the session's providers place onnxnorm nodes on CUDA). Register it once
    per options: ONNX Runtime holds one custom-op domain named ``onnxnorm`` per session."""
    import onnxruntime

    check_compatible()
    if options is None:
        options = onnxruntime.SessionOptions()
    options.register_custom_ops_library(str(library_path()))
    return options


@dataclasses.dataclass(frozen=True)
class Plugin:
    """A plugin execution provider: its name, its library, the kinds of device to run on
    ("CPU", "GPU", "NPU": the devices ONNX Runtime lists for it of these kinds) and its
    provider options."""

    name: str
    library: str
    device_types: tuple[str, ...] = ("CPU",)
    options: Mapping[str, str] = dataclasses.field(default_factory=dict)


#: the plugin packages onnxnorm knows: short name -> (Python package, default device kinds)
PLUGIN_PACKAGES = {
    "openvino": ("onnxruntime_ep_openvino", ("CPU",)),
    "webgpu": ("onnxruntime_ep_webgpu", ("GPU",)),
    "tensorrt-rtx": ("onnxruntime_ep_nv_tensorrt_rtx", ("GPU",)),
}


def plugin(
    name: str,
    device_types: Sequence[str] | None = None,
    options: Mapping[str, str] | None = None,
) -> Plugin:
    """The :class:`Plugin` of an installed plugin package (a name of :data:`PLUGIN_PACKAGES`:
    ``pip install onnxruntime-ep-openvino`` for "openvino"), its library and provider name
    read from the package itself."""
    if name not in PLUGIN_PACKAGES:
        raise OnnxNormError(
            f"unknown plugin execution provider {name!r}; known: {', '.join(PLUGIN_PACKAGES)} "
            "(or give a Plugin(name, library) of your own)"
        )
    package, kinds = PLUGIN_PACKAGES[name]
    try:
        module = importlib.import_module(package)
    except ImportError:
        raise OnnxNormError(
            f"the {name} plugin execution provider is not installed: "
            f"pip install {package.replace('_', '-')}"
        ) from None
    return Plugin(
        module.get_ep_name(),
        str(module.get_library_path()),
        tuple(device_types or kinds),
        dict(options or {}),
    )


_registered: dict[str, str] = {}


def plugin_devices(plugin: Plugin) -> list[Any]:
    """Registers ``plugin``'s library into ONNX Runtime (once per process) and returns the
    devices it offers of ``plugin.device_types``; OnnxNormError when there are none."""
    import onnxruntime

    if _registered.get(plugin.name) not in (None, plugin.library):
        raise OnnxNormError(
            f"{plugin.name} is registered from {_registered[plugin.name]} in this process, "
            f"not from {plugin.library}"
        )
    if plugin.name not in _registered:
        onnxruntime.register_execution_provider_library(plugin.name, plugin.library)
        _registered[plugin.name] = plugin.library
    kinds = {k.upper() for k in plugin.device_types}
    devices = [
        d
        for d in onnxruntime.get_ep_devices()
        if d.ep_name == plugin.name and d.device.type.name in kinds
    ]
    if not devices:
        everyone = onnxruntime.get_ep_devices()
        offered = sorted(d.device.type.name for d in everyone if d.ep_name == plugin.name)
        # (what ONNX Runtime found: a plugin may take one vendor's hardware only, as OpenVINO's
        # takes Intel's)
        seen = sorted({f"{d.device.type.name} by {d.device.vendor}" for d in everyone})
        raise OnnxNormError(
            f"{plugin.name} offers no device of kind {', '.join(sorted(kinds))} on this "
            f"machine (it offers: {', '.join(offered) or 'none'}; ONNX Runtime found: "
            f"{', '.join(seen) or 'nothing'})"
        )
    return devices


def _needs_library(model: onnx.ModelProto) -> bool:
    """Whether an onnxnorm node of ``model`` has no function body (it runs with the library
    only)."""
    from onnxnorm.ops import catalogue, functions

    bodies = {(f.domain, f.name, f.overload) for f in model.functions}
    return any(
        (catalogue.DOMAIN, node.op_type, node.overload) not in bodies
        for node in functions.onnxnorm_nodes(model)
    )


def session(
    model: str | os.PathLike | bytes | onnx.ModelProto,
    options: Any = None,
    providers: Sequence[Any] | None = None,
    *,
    with_library: bool | None = None,
    plugin: Plugin | None = None,
    cpu_fallback: bool = True,
    **kwargs: Any,
) -> Any:
    """Opens an ``onnxruntime.InferenceSession`` on ``model`` (a path, bytes or a ModelProto)
    with the onnxnorm library registered (``with_library=False`` opens a plain session, where
    onnxnorm nodes run their function bodies). Providers default to the CPU;
    ``providers=CUDA_PROVIDERS`` runs on the GPU (onnxruntime-gpu).

    ``plugin``: run on a plugin execution provider (:func:`plugin`), in place of
    ``providers``; the library is then registered only where the model needs it (an onnxnorm
    node without a body), unless ``with_library`` says otherwise. ``cpu_fallback=False``: the
    session is refused when a node would fall back to the CPU provider
    (``session.disable_cpu_ep_fallback``), the check that a provider takes the model whole."""
    import onnxruntime

    if options is None:
        options = onnxruntime.SessionOptions()
    if plugin is not None and providers:
        raise OnnxNormError("give a plugin or providers, not both")
    path = None
    if isinstance(model, onnx.ModelProto):
        proto = model
        model = model.SerializeToString()
    elif not isinstance(model, bytes):
        model = path = os.fspath(model)
        _check_external_data(model)
    if with_library is None:
        with_library = True
        if plugin is not None:
            if path is not None:
                proto = onnx.load(path, load_external_data=False)
            elif isinstance(model, bytes):
                proto = onnx.load_from_string(model)
            with_library = _needs_library(proto)
    if with_library:
        register(options)
    if not cpu_fallback:
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    if plugin is not None:
        options.add_provider_for_devices(plugin_devices(plugin), dict(plugin.options))
        return onnxruntime.InferenceSession(model, options, **kwargs)
    return onnxruntime.InferenceSession(
        model, options, providers=list(providers or ["CPUExecutionProvider"]), **kwargs
    )


def _check_external_data(path: str) -> None:
    """Refuses a model file whose external data would be read from outside its folder or does
    not fit its file, before ORT opens anything (ONNX Runtime 1.21 follows ``..``, absolute
    paths and symbolic links). A file that does not parse is left to ORT, which says so."""
    from onnxnorm._io import load_weights_as_references
    from onnxnorm._validate import ModelProblem, check_external_data

    if not Path(path).is_file():
        return
    try:
        model = load_weights_as_references(Path(path))
    except Exception:  # noqa: BLE001 - not a model: ORT's own error names the problem
        return
    try:
        check_external_data(model, Path(path).parent, own=path)
    except ModelProblem as problem:
        raise OnnxNormError(f"{path}: {problem}") from None


def _kernel_events(
    model: str | os.PathLike | bytes | onnx.ModelProto, feeds: dict[str, Any], **kwargs: Any
) -> list[dict]:
    """Runs ``model`` once on ``feeds`` (a :func:`session` of ``kwargs``) with ORT's profiler
    on; returns the events of the kernels that ran."""
    import tempfile

    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as folder:
        options.profile_file_prefix = os.path.join(folder, "onnxnorm_profile")
        sess = session(model, options, **kwargs)
        sess.run(None, feeds)
        with open(sess.end_profiling()) as f:
            events = json.load(f)
    return [
        event
        for event in events
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time")
    ]


def executed_ops(
    model: str | os.PathLike | bytes | onnx.ModelProto,
    feeds: dict[str, Any],
    *,
    with_library: bool | None = True,
    providers: Sequence[Any] | None = None,
    **kwargs: Any,
) -> collections.Counter[str]:
    """Runs ``model`` once on ``feeds`` with ORT's profiler on and counts the op types of the
    kernels that actually ran: shows whether an onnxnorm node ran the library's kernel
    (op ``RMSNorm``) or its inlined function body (the body's standard ops). ``kwargs``:
    :func:`session`'s (``plugin``, ``cpu_fallback``)."""
    events = _kernel_events(model, feeds, providers=providers, with_library=with_library, **kwargs)
    return collections.Counter(event["args"]["op_name"] for event in events)


def placement(
    model: str | os.PathLike | bytes | onnx.ModelProto, feeds: dict[str, Any], **kwargs: Any
) -> collections.Counter[str]:
    """Runs ``model`` once on ``feeds`` (a :func:`session` of ``kwargs``) and counts the nodes
    each execution provider ran. A provider that compiles what it takes (OpenVINO, TensorRT)
    runs one node per partition, so a graph it takes whole shows as one node of it and none
    of the CPU provider's."""
    events = _kernel_events(model, feeds, **kwargs)
    return collections.Counter(event["args"].get("provider", "?") for event in events)


def cuda_available() -> bool:
    """True when the CUDA library is built and onnxruntime offers the CUDA execution provider."""
    try:
        library_path("cuda")
    except OnnxNormError:
        return False
    import onnxruntime

    return CUDA_PROVIDER in onnxruntime.get_available_providers()
