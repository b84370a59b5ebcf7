"""Where the onnxnorm custom-op library is, and registering it into ONNX Runtime sessions.

    import onnxnorm.runtime as rt
    session = rt.session("model.onnx")                 # CPU, with the onnxnorm kernels
    options = rt.register(onnxruntime.SessionOptions())  # or into your own options
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

import onnx

import onnxnorm
from onnxnorm._io import OnnxNormError

_LIBRARY_NAMES = {"linux": "libonnxnorm_ops.so", "darwin": "libonnxnorm_ops.dylib",
                  "win32": "onnxnorm_ops.dll"}
#: names the library file explicitly (a build of your own, say)
ENV_LIBRARY = "ONNXNORM_LIBRARY"


def _library_name() -> str:
    return _LIBRARY_NAMES.get(sys.platform, "libonnxnorm_ops.so")


def _candidates() -> list[Path]:
    found = [Path(folder) / "lib" / _library_name() for folder in onnxnorm.__path__]
    # an editable install keeps the built library in site-packages, away from the sources
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        found.append(Path(distribution("onnxnorm").locate_file(f"onnxnorm/lib/{_library_name()}")))
    except PackageNotFoundError:
        pass
    return found


def library_path() -> Path:
    """The path of the built onnxnorm CPU custom-op library."""
    override = os.environ.get(ENV_LIBRARY)
    if override:
        if not Path(override).is_file():
            raise OnnxNormError(f"{ENV_LIBRARY}={override}: no such file")
        return Path(override)
    for candidate in _candidates():
        if candidate.is_file():
            return candidate
    looked = ", ".join(str(c) for c in _candidates())
    raise OnnxNormError(f"the onnxnorm native library is not built (looked for {looked}); "
                        "install the package with `make install` or `pip install .`, or set "
                        f"{ENV_LIBRARY}")


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
            f"upgrade onnxruntime to >= 1.{built} or rebuild onnxnorm against older headers")


def register(options: Any = None) -> Any:
    """Registers the onnxnorm library into an ``onnxruntime.SessionOptions`` (a new one when
    none is given) and returns it."""
    import onnxruntime

    check_compatible()
    if options is None:
        options = onnxruntime.SessionOptions()
    options.register_custom_ops_library(str(library_path()))
    return options


def session(model: str | os.PathLike | bytes | onnx.ModelProto, options: Any = None,
            providers: Sequence[Any] | None = None, *, with_library: bool = True,
            **kwargs: Any) -> Any:
    """Opens an ``onnxruntime.InferenceSession`` on ``model`` (a path, bytes or a ModelProto)
    with the onnxnorm library registered (``with_library=False`` opens a plain session, where
    onnxnorm nodes run their function bodies). Providers default to the CPU."""
    import onnxruntime

    if options is None:
        options = onnxruntime.SessionOptions()
    if with_library:
        register(options)
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    elif not isinstance(model, bytes):
        model = os.fspath(model)
    return onnxruntime.InferenceSession(model, options,
                                        providers=list(providers or ["CPUExecutionProvider"]),
                                        **kwargs)


def executed_ops(model: str | os.PathLike | bytes | onnx.ModelProto, feeds: dict[str, Any], *,
                 with_library: bool = True, providers: Sequence[Any] | None = None
                 ) -> "collections.Counter[str]":
    """Runs ``model`` once on ``feeds`` with ORT's profiler on and counts the op types of the
    kernels that actually ran: shows whether an onnxnorm node ran the library's kernel
    (op ``RMSNorm``) or its inlined function body (the body's standard ops)."""
    import collections
    import tempfile

    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as folder:
        options.profile_file_prefix = os.path.join(folder, "onnxnorm_profile")
        sess = session(model, options, providers, with_library=with_library)
        sess.run(None, feeds)
        with open(sess.end_profiling()) as f:
            events = json.load(f)
    return collections.Counter(
        event["args"]["op_name"] for event in events
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"))


# ---------------------------------------------------------------------------------------------
# CUDA: libonnxnorm_cuda_ops.so, built next to the CPU library when nvcc was found. It holds the
# CUDA kernels and, at registration, also registers the CPU library's kernels into the same
# "onnxnorm" domain (one session can hold only one domain of that name), so register it INSTEAD
# of the CPU library: sessions then run onnxnorm nodes on the CUDA execution provider and on the
# CPU. Nothing here loads a CUDA library until register_cuda is called.
# ---------------------------------------------------------------------------------------------
_CUDA_LIBRARY_NAMES = {"linux": "libonnxnorm_cuda_ops.so", "darwin": "libonnxnorm_cuda_ops.dylib",
                       "win32": "onnxnorm_cuda_ops.dll"}
#: names the CUDA library file explicitly
ENV_CUDA_LIBRARY = "ONNXNORM_CUDA_LIBRARY"
CUDA_PROVIDER = "CUDAExecutionProvider"


def cuda_library_path() -> Path:
    """The path of the built onnxnorm CUDA library (not loaded)."""
    override = os.environ.get(ENV_CUDA_LIBRARY)
    if override:
        if not Path(override).is_file():
            raise OnnxNormError(f"{ENV_CUDA_LIBRARY}={override}: no such file")
        return Path(override)
    name = _CUDA_LIBRARY_NAMES.get(sys.platform, "libonnxnorm_cuda_ops.so")
    candidates = [c.parent / name for c in _candidates()]
    override_cpu = os.environ.get(ENV_LIBRARY)
    if override_cpu:
        candidates.insert(0, Path(override_cpu).parent / name)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise OnnxNormError("the onnxnorm CUDA library is not built (looked for "
                        f"{', '.join(str(c) for c in candidates)}); it is built when nvcc is found "
                        f"(ONNXNORM_CUDA=AUTO|ON), or set {ENV_CUDA_LIBRARY}")


def cuda_available() -> bool:
    """True when the CUDA library is built and onnxruntime offers the CUDA execution provider."""
    try:
        cuda_library_path()
    except OnnxNormError:
        return False
    import onnxruntime

    return CUDA_PROVIDER in onnxruntime.get_available_providers()


def register_cuda(options: Any = None) -> Any:
    """Registers the onnxnorm CUDA library (CUDA and CPU kernels) into an
    ``onnxruntime.SessionOptions`` (a new one when none is given) and returns it. Do not also
    call :func:`register` on the same options."""
    import onnxruntime

    check_compatible()
    if options is None:
        options = onnxruntime.SessionOptions()
    path = cuda_library_path()
    # the CUDA library loads the CPU library from its own folder, else from $ONNXNORM_LIBRARY
    if not (path.parent / _library_name()).is_file() and not os.environ.get(ENV_LIBRARY):
        os.environ[ENV_LIBRARY] = str(library_path())
    options.register_custom_ops_library(str(path))
    return options


def cuda_session(model: str | os.PathLike | bytes | onnx.ModelProto, options: Any = None,
                 providers: Sequence[Any] | None = None, **kwargs: Any) -> Any:
    """Like :func:`session`, with the CUDA library registered and the providers defaulting to
    CUDA then CPU."""
    import onnxruntime

    if options is None:
        options = onnxruntime.SessionOptions()
    register_cuda(options)
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    elif not isinstance(model, bytes):
        model = os.fspath(model)
    return onnxruntime.InferenceSession(
        model, options, providers=list(providers or [CUDA_PROVIDER, "CPUExecutionProvider"]),
        **kwargs)
