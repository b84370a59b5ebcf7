"""Triton Inference Server model repositories for its ONNX Runtime backend (``onnxnorm triton``).

For each model, ``REPO/NAME/`` holds

- ``config.pbtxt``: platform ``onnxruntime_onnx``; the inputs and outputs with the model's types
  and dims (-1 where free); ``max_batch_size`` and dynamic batching where the first dim of every
  input and output is a free batch dim; the instance group (CPU or GPU); and, for a model with
  onnxnorm nodes, ``model_operations.op_library_filename`` naming the onnxnorm library;
- ``1/model.onnx`` and its external data files, as they are;
- ``libonnxnorm_ops.so`` (and, for GPU instances, ``libonnxnorm_cuda_ops.so`` beside it: the
  CPU library registers the CUDA kernels when it finds that file next to itself).

Triton's backend passes ``op_library_filename`` to ONNX Runtime's RegisterCustomOpsLibrary as it
is: a relative path would be read from the server's working directory, so the config names the
library by the absolute path the server sees, the repository's path here unless told where the
server mounts it (``served_from``, e.g. ``/models`` in a container).

The backend bundles its own ONNX Runtime; the onnxnorm library asks it for the C API version of
the headers it was built against (:func:`onnxnorm.runtime.build_info`), so that ONNX Runtime
must be as new as those headers. Each config says which version that is and the first Triton
release whose backend bundles it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import shutil
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from onnxnorm.errors import OnnxNormError
from onnxnorm.serve.signature import Signature, TensorSpec, signature

#: (Triton release, the ONNX Runtime its onnxruntime backend bundles), oldest first: Triton's
#: own compatibility table, from 24.12
TRITON_ONNXRUNTIME = (
    ("24.12", "1.20.1"),
    ("25.03", "1.21.0"),
    ("25.05", "1.22.0"),
    ("25.08", "1.23.0"),
    ("26.02", "1.24.1"),
    ("26.07", "1.27.0"),
)
#: max_batch_size for a model with a free batch dim when none is given
DEFAULT_MAX_BATCH_SIZE = 8
MODEL_FILE = "model.onnx"
VERSION = "1"
MODEL_NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def first_triton_release(api_version: int) -> tuple[str, str] | None:
    """The first Triton release (and its ONNX Runtime) whose onnxruntime backend provides ONNX
    Runtime C API ``api_version`` (ONNX Runtime 1.X provides API X); None when newer than the
    releases known here."""
    for release, ort in TRITON_ONNXRUNTIME:
        if int(ort.split(".")[1]) >= api_version:
            return release, ort
    return None


def api_requirement() -> tuple[int | None, str]:
    """The ONNX Runtime C API version the onnxnorm library asks for, and one sentence saying
    what it needs of Triton."""
    from onnxnorm import runtime

    version = runtime.build_info().get("ort_api_version")
    if version is None:
        return None, (
            "the onnxnorm library's ONNX Runtime API version is not recorded "
            "(no build_info.json beside it)"
        )
    version = int(version)
    first = first_triton_release(version)
    triton = (
        f"Triton {first[0]} or newer ({first[0]} bundles ONNX Runtime {first[1]})"
        if first
        else "a Triton release newer than those onnxnorm knows"
    )
    return version, (
        f"the onnxnorm library asks ONNX Runtime for C API version {version}, so "
        "the ONNX Runtime bundled by Triton's onnxruntime backend must be "
        f"1.{version} or newer: {triton}"
    )


@dataclasses.dataclass
class ServedModel:
    """One model written into a repository."""

    name: str
    source: str
    folder: str
    max_batch_size: int
    why_not_batched: str
    instances: int
    kind: str
    libraries: list[str]
    inputs: list[dict]
    outputs: list[dict]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        batching = (
            f"max_batch_size {self.max_batch_size}, dynamic batching"
            if self.max_batch_size
            else f"no batching ({self.why_not_batched or 'max_batch_size 0'})"
        )
        kind = "GPU" if self.kind == "KIND_GPU" else "CPU"
        library = (
            f"onnxnorm library {', '.join(Path(p).name for p in self.libraries)}"
            if self.libraries
            else "no onnxnorm node: no library"
        )
        return (
            f"{self.name} ({self.source}): {self.folder}/config.pbtxt, {VERSION}/{MODEL_FILE}; "
            f"{batching}; {self.instances} {kind} instance(s); {library}"
        )


@dataclasses.dataclass
class RepositoryReport:
    repository: str
    models: list[ServedModel]
    api_version: int | None
    requirement: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "repository": self.repository,
            "ort_api_version": self.api_version,
            "requirement": self.requirement,
            "models": [m.to_dict() for m in self.models],
        }

    def __str__(self) -> str:
        lines = [str(m) for m in self.models]
        if any(m.libraries for m in self.models):
            lines.append(self.requirement[0].upper() + self.requirement[1:])
        lines.append(f"start: tritonserver --model-repository {self.repository}")
        return "\n".join(lines)


def _quote(text: str) -> str:
    """A protobuf text-format string literal."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _tensor(spec: TensorSpec, batched: bool) -> list[str]:
    dims = spec.dims[1:] if batched else spec.dims
    lines = ["  {", f"    name: {_quote(spec.name)}", f"    data_type: TYPE_{spec.triton_type}"]
    if dims:
        lines.append(f"    dims: [ {', '.join(str(d) for d in dims)} ]")
    else:  # a scalar (or, batched, one value per request): Triton wants one dim
        lines += ["    dims: [ 1 ]", "    reshape: { shape: [ ] }"]
    return lines + ["  }"]


def config_text(
    name: str,
    sig: Signature,
    *,
    max_batch_size: int,
    instances: int = 1,
    gpu: bool = False,
    libraries: Sequence[str] = (),
    source: str = "",
) -> str:
    """The ``config.pbtxt`` of a model served by Triton's ONNX Runtime backend."""
    if max_batch_size and not sig.batch:
        raise OnnxNormError(
            f"{name}: max_batch_size {max_batch_size} needs a free batch dim "
            f"first in every input and output, but {sig.why_not}"
        )
    origin = f" from {source}" if source else ""
    lines = [
        f"# Triton model configuration written by onnxnorm triton{origin}.",
        "# platform onnxruntime_onnx: Triton's ONNX Runtime backend, which bundles its own",
        "# ONNX Runtime.",
    ]
    if libraries:
        _, requirement = api_requirement()
        lines += textwrap.wrap(
            requirement[0].upper() + requirement[1:] + ".",
            96,
            initial_indent="# ",
            subsequent_indent="# ",
        )
        lines.append(
            "# op_library_filename is the library's absolute path on the server "
            "(onnxnorm triton --served-from)."
        )
    lines += [
        f"name: {_quote(name)}",
        'platform: "onnxruntime_onnx"',
        f"max_batch_size: {max_batch_size}",
        "input [",
    ]
    for i, spec in enumerate(sig.inputs):
        lines += _tensor(spec, bool(max_batch_size))
        if i < len(sig.inputs) - 1:
            lines[-1] += ","
    lines += ["]", "output ["]
    for i, spec in enumerate(sig.outputs):
        lines += _tensor(spec, bool(max_batch_size))
        if i < len(sig.outputs) - 1:
            lines[-1] += ","
    lines.append("]")
    if max_batch_size:
        lines += [
            "# requests of the same shape are stacked along the first dim, up to max_batch_size",
            "dynamic_batching { }",
        ]
    lines += [
        "instance_group [",
        "  {",
        f"    count: {instances}",
        f"    kind: {'KIND_GPU' if gpu else 'KIND_CPU'}",
        "  }",
        "]",
    ]
    if libraries:
        lines += ["model_operations {"]
        lines += [f"  op_library_filename: {_quote(path)}" for path in libraries[:1]]
        lines += ["}"]
    return "\n".join(lines) + "\n"


def triton_model_name(path: Path) -> str:
    stem = path.stem
    if stem == "model" and path.parent.name:  # a folder's model.onnx: the folder's name
        stem = path.absolute().parent.name
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", stem).lstrip(".") or "model"
    return name


def _sources(source: Path, name: str | None) -> list[tuple[Path, str]]:
    if not source.exists():
        raise OnnxNormError(f"{source}: no such file or folder")
    if source.is_dir():
        files = sorted(p for p in source.glob("*.onnx") if p.is_file())
        if not files:
            raise OnnxNormError(f"{source}: no .onnx file in this folder")
        if name and len(files) > 1:
            raise OnnxNormError(
                f"--name names one model, but {source} holds {len(files)} "
                f"({', '.join(p.name for p in files)}); each is named after "
                "its file"
            )
    else:
        files = [source]
    found = [(f, name or triton_model_name(f)) for f in files]
    for _path, model_name in found:
        if not MODEL_NAME_PATTERN.fullmatch(model_name):
            raise OnnxNormError(
                f"model name {model_name!r}: use letters, digits, '_', '.' and '-' (not first)"
            )
    names = [n for _, n in found]
    if len(set(names)) != len(names):
        raise OnnxNormError(f"{source}: two models would have the same name ({names})")
    return found


def _copy_model(source: Path, version_dir: Path) -> None:
    """The model file as it is, as ``model.onnx``, and its external data files under the same
    relative names (the model names them so; :func:`onnxnorm._io.load_model` has checked that
    they lie in its folder)."""
    from onnxnorm._io import external_location, external_tensors, load_weights_as_references

    references = load_weights_as_references(source)  # no weight read
    version_dir.mkdir(parents=True)
    shutil.copyfile(source, version_dir / MODEL_FILE)
    for location in sorted({external_location(t)[0] for t in external_tensors(references)}):
        if (source.parent / location).resolve() == source.resolve():
            continue  # references to the file's own inline weights
        target = version_dir / location
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source.parent / location, target)


def write_repository(
    source: str | os.PathLike,
    repository: str | os.PathLike,
    *,
    name: str | None = None,
    max_batch_size: int | None = None,
    instances: int = 1,
    gpu: bool = False,
    served_from: str | os.PathLike | None = None,
    overwrite: bool = False,
) -> RepositoryReport:
    """Writes a Triton model repository for the ONNX Runtime backend: one model for the ONNX
    file ``source``, or one per ``.onnx`` file of the folder ``source`` (named after the file,
    a ``model.onnx`` after its folder; ``name`` for a single model). ``max_batch_size``: None
    batches up to 8 where the model has a free batch dim, 0 never. ``repository`` is created
    where missing and may hold other models; ``repository/NAME`` must not exist unless
    ``overwrite``. ``served_from``: the repository's path on the server (default: its absolute
    path here)."""
    from onnxnorm import runtime
    from onnxnorm._io import load_model, write_folder
    from onnxnorm.fusion.verify import uses_onnxnorm

    source, repository = Path(source), Path(repository)
    if instances < 1:
        raise OnnxNormError(f"--instances must be 1 or more, got {instances}")
    if max_batch_size is not None and max_batch_size < 0:
        raise OnnxNormError(f"--max-batch-size must be 0 or more, got {max_batch_size}")
    if name is not None and not MODEL_NAME_PATTERN.fullmatch(name):
        raise OnnxNormError(f"--name {name!r}: use letters, digits, '_', '.' and '-' (not first)")
    found = _sources(source, name)
    if repository.exists() and not repository.is_dir():
        raise OnnxNormError(f"cannot write {repository}: it exists and is not a folder")
    if not repository.exists() and not repository.parent.is_dir():
        raise OnnxNormError(f"cannot write {repository}: folder {repository.parent} does not exist")
    for path, model_name in found:
        if (repository / model_name).exists() and not overwrite:
            raise OnnxNormError(f"{repository / model_name} exists; pass --overwrite to replace it")
        if repository.exists() and path.resolve().is_relative_to(
            (repository / model_name).resolve()
        ):
            raise OnnxNormError(
                f"cannot write {repository / model_name}: it holds the input "
                f"{path}; the input is never modified, choose another output"
            )
    served = Path(served_from) if served_from is not None else repository.absolute()
    if not served.is_absolute():
        raise OnnxNormError(
            f"--served-from {served_from}: give the absolute path at which the "
            "server sees the repository"
        )

    loaded = []
    for path, model_name in found:
        model = load_model(path, load_weights=False)
        sig = signature_or_error(model, path)
        batch = max_batch_size
        if batch is None:
            batch = DEFAULT_MAX_BATCH_SIZE if sig.batch else 0
        elif batch and not sig.batch:
            raise OnnxNormError(
                f"{path}: --max-batch-size {batch} needs a free batch dim first "
                f"in every input and output, but {sig.why_not}; pass "
                "--max-batch-size 0"
            )
        loaded.append((path, model_name, sig, batch, uses_onnxnorm(model)))
    files = [runtime.library_path("cpu")] if any(item[-1] for item in loaded) else []
    if files and gpu:
        try:
            files.append(runtime.library_path("cuda"))
        except OnnxNormError:
            raise OnnxNormError(
                "--gpu needs the onnxnorm CUDA library, which is not built (it "
                "is built next to the CPU library where nvcc is found)"
            ) from None
    api_version, requirement = api_requirement()

    repository.mkdir(exist_ok=True)
    models = []
    for path, model_name, sig, batch, needs_library in loaded:
        libraries = [str(served / model_name / f.name) for f in files] if needs_library else []
        text = config_text(
            model_name,
            sig,
            max_batch_size=batch,
            instances=instances,
            gpu=gpu,
            libraries=libraries,
            source=path.name,
        )
        write_folder(
            repository / model_name,
            functools.partial(_build_model, path, files if needs_library else [], text),
        )
        models.append(
            ServedModel(
                model_name,
                str(path),
                str(repository / model_name),
                batch,
                sig.why_not,
                instances,
                "KIND_GPU" if gpu else "KIND_CPU",
                libraries,
                [_describe(s, bool(batch)) for s in sig.inputs],
                [_describe(s, bool(batch)) for s in sig.outputs],
            )
        )
    return RepositoryReport(str(repository.absolute()), models, api_version, requirement)


def _build_model(source: Path, libraries: list[Path], config: str, work: Path) -> bool:
    """Fills a model's folder (``write_folder`` renames it into place)."""
    _copy_model(source, work / VERSION)
    for file in libraries:
        shutil.copy2(file, work / file.name)
    (work / "config.pbtxt").write_text(config)
    return True


def _describe(spec: TensorSpec, batched: bool) -> dict:
    return {
        "name": spec.name,
        "data_type": f"TYPE_{spec.triton_type}",
        "dims": list(spec.dims[1:] if batched else spec.dims),
    }


def signature_or_error(model, path: Path) -> Signature:
    try:
        return signature(model)
    except OnnxNormError as error:
        raise OnnxNormError(f"{path}: {error}") from None
