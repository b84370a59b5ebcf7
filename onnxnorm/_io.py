"""Reading and writing model files with one-line errors and atomic writes.

Large models. ``load_model(path, load_weights=False)`` leaves tensors stored as external data
where they are (only those under 1 KiB, which rules read as constants, are loaded), and the
inline weights become references into the file itself (``onnxnorm._storage.wire``).
``save_model`` writes a model whose external tensors still point into the input's data file by
copying them, one at a time, into the output's own data file; a model over 2 GB, or one that
came with external data, is written with external data (``<output>.data``), whose file starts
as the input's (``onnxnorm._storage.filesystem.start_as``) so that the unchanged tensors keep
their offsets. Files are written under temporary names in the output folder and renamed into
place (data first, the model last), so no half-written file ever carries the output's name; a
run killed while writing leaves only its temporary files (``.<output>.<pid>.*.tmp``), which the
next write of the same output removes.

The parts are in ``onnxnorm._storage`` (paths, external data, the protobuf wire format, the
file system's copies and temporary files); the names of theirs that callers use are importable
from here too.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Iterable
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto
from onnx.external_data_helper import uses_external_data

from onnxnorm._storage.external import (
    EXTERNAL_THRESHOLD,
    SMALL_TENSOR,
    external_files,
    external_length,
    external_location,
    external_tensors,
    has_external_data,
    read_external,
    set_external_location,
    tensor_header,
    weightless_shell,
)
from onnxnorm._storage.filesystem import (
    BLOCK,
    TempFiles,
    copy_range,
    remove_stale_temps,
    start_as,
)
from onnxnorm._storage.paths import (
    check_input,
    check_output,
    check_output_folder,
    copy_rest,
    model_dir,
    write_folder,
)
from onnxnorm._storage.wire import load_weights_as_references, write_referenced
from onnxnorm.errors import OnnxNormError, first_line

__all__ = [
    "EXTERNAL_THRESHOLD",
    "SMALL_TENSOR",
    "ModelFile",
    "OnnxNormError",
    "check_input",
    "check_output",
    "check_output_folder",
    "copy_rest",
    "external_files",
    "external_location",
    "external_tensors",
    "has_external_data",
    "load_model",
    "load_weights_as_references",
    "model_dir",
    "open_model",
    "save_model",
    "weightless_shell",
    "write_folder",
]

#: Protobuf cannot serialize a message over 2 GiB.
_PROTOBUF_LIMIT = 2**31 - 1


@dataclasses.dataclass
class ModelFile:
    """A model file opened at the door (:func:`open_model`): parsed, checked once, and what the
    check found to mend (``repairs``, ``onnxnorm._validate.Repair``) kept for the pass, so that
    nothing downstream parses or checks it again."""

    path: Path
    model: onnx.ModelProto
    repairs: list = dataclasses.field(default_factory=list)

    @property
    def folder(self) -> Path:
        """Where its external data is read from (:func:`model_dir`)."""
        return model_dir(self.path)

    def data_files(self) -> set[Path]:
        """The resolved paths of the external data files it reads."""
        return external_files(self.model, self.folder)


def open_model(path: str | os.PathLike, load_weights: bool = False) -> ModelFile:
    """Reads and checks a model file, once. With ``load_weights=False`` (the default here) no
    weight is read into memory: tensors in external data stay there (but those under
    ``SMALL_TENSOR`` bytes, which the rules read), and the raw data of initializers inside the
    file becomes an external-data reference into the file itself (see
    :func:`has_external_data` and :func:`save_model` with ``source=path``, which resolves
    them). A file that is not a model, or that the checks refuse (``onnxnorm._validate.check``:
    hostile external data, graphs that are not graphs), is one :class:`OnnxNormError`."""
    path = check_input(path)
    try:
        if load_weights or path.stat().st_size == 0:
            model = onnx.load(path, load_external_data=False)
        else:
            model = load_weights_as_references(path)
    except (DecodeError, RuntimeError, ValueError, OSError, IndexError) as error:
        raise OnnxNormError(f"{path}: not a readable ONNX model ({first_line(error)})") from None
    if not model.ir_version or not model.HasField("graph"):
        raise OnnxNormError(f"{path}: not an ONNX model (no IR version or graph)")
    from onnxnorm._validate import check

    # before any external data is read
    repairs = check(model, model_dir(path), own=path, where=str(path))
    try:
        for tensor in list(external_tensors(model)):
            if load_weights or external_length(tensor) < SMALL_TENSOR:
                read_external(tensor, model_dir(path))
                tensor.data_location = TensorProto.DEFAULT
                del tensor.external_data[:]
    except (OSError, ValueError) as error:
        raise OnnxNormError(
            f"{path}: cannot read its external data ({first_line(error)})"
        ) from None
    return ModelFile(path, model, repairs)


def load_model(path: str | os.PathLike, load_weights: bool = True) -> onnx.ModelProto:
    """The model of :func:`open_model` (here with its weights read unless
    ``load_weights=False``)."""
    return open_model(path, load_weights).model


def save_model(
    model: onnx.ModelProto,
    path: str | os.PathLike,
    *,
    source: str | os.PathLike | None = None,
    like: str | os.PathLike | None = None,
    external: bool | None = None,
    extra: Iterable[TensorProto] = (),
) -> Path:
    """Writes ``model`` to ``path`` atomically.

    ``source`` (or ``like``): the file the model was read from; external tensors of the model
    are read from its folder. ``extra``: more main-graph initializers, written after the
    model's own one at a time (so that a caller holding them need not copy them into
    ``model``). ``external``: write external data (default: when the model has external
    tensors or would pass 2 GB). ``model`` itself is not changed.
    """
    extra = list(extra)
    path = check_output(path)
    source = source or like
    source_dir = model_dir(source) if source else path.parent.resolve()
    if external is None:
        external = (
            has_external_data(model, source)
            or any(uses_external_data(t) for t in extra)
            or _inline_size(model, extra) > _PROTOBUF_LIMIT
        )
    remove_stale_temps(path.parent, path.name)
    with TempFiles(path) as temps:
        save = _Save(model, extra, path, source_dir, temps)
        try:
            if external:
                save.with_data_file()
            else:
                save.inline()
        except OnnxNormError:
            raise
        except OSError as error:
            raise OnnxNormError(f"cannot write {path}: {error.strerror or error}") from None
    return path


def _inline_size(model: onnx.ModelProto, extra: list[TensorProto]) -> int:
    """The size of the model written inline: referenced tensors counted at their length."""
    total = model.ByteSize() + sum(t.ByteSize() + 8 for t in extra)
    for tensor in itertools.chain(
        external_tensors(model), (t for t in extra if uses_external_data(t))
    ):
        total += external_length(tensor)
    return total


@dataclasses.dataclass
class _Save:
    """One call of :func:`save_model`: the model and ``extra`` tensors written to ``path``, the
    external tensors read from ``source_dir``, under temporary names from ``temps``."""

    model: onnx.ModelProto
    extra: list[TensorProto]
    path: Path
    source_dir: Path
    temps: TempFiles

    def inline(self) -> None:
        """Writes one file holding every tensor: the model without its referenced
        initializers, then each of them and of ``extra`` appended as a graph of its own
        (protobuf merges repeated occurrences of the graph field), so that one tensor at a time
        is in memory."""
        model = self.model
        if _inline_size(model, self.extra) > _PROTOBUF_LIMIT:
            raise OnnxNormError(f"cannot write {self.path}: over 2 GB without external data")
        fd, tmp = self.temps.new(".tmp")
        referenced = [t for t in model.graph.initializer if uses_external_data(t)]
        with os.fdopen(fd, "wb") as f:
            if referenced:
                main = weightless_shell(model)
                main.graph.initializer.extend(
                    t for t in model.graph.initializer if not uses_external_data(t)
                )
                f.write(main.SerializeToString())
                del main
            else:
                f.write(model.SerializeToString())
            for tensor in itertools.chain(referenced, self.extra):
                if uses_external_data(tensor):
                    write_referenced(f, tensor, self.source_dir)
                else:
                    patch = onnx.ModelProto()
                    patch.graph.initializer.add().CopyFrom(tensor)
                    f.write(patch.SerializeToString())
                    del patch
        os.replace(tmp, self.path)

    def with_data_file(self) -> None:
        """Writes the model and its data file ``<path>.data``, each under a temporary name,
        and puts them in place."""
        data_name = self.path.name + ".data"
        fd, tmp_data = self.temps.new(".data.tmp")
        out = weightless_shell(self.model)
        tensors = list(itertools.chain(self.model.graph.initializer, self.extra))
        with os.fdopen(fd, "wb") as data:
            _write_data(tensors, self.source_dir, data, data_name, out)
        fd, tmp_model = self.temps.new(".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(out.SerializeToString())
        _put_in_place(self.path, tmp_model, tmp_data, data_name, self.temps)


def _write_data(
    tensors: list[TensorProto], source_dir: Path, data, data_name: str, out: onnx.ModelProto
) -> None:
    """Writes the data of ``tensors`` to ``data`` (the file to be named ``data_name``) and adds
    each to ``out``'s main graph: a reference into ``data_name`` for the external ones and those
    of EXTERNAL_THRESHOLD bytes or more, the tensor itself for the rest. The unchanged tensors'
    data file is shared (or copied) whole where it can be: they keep their offsets."""
    base = _base_data(tensors, source_dir, data)
    offset = data.tell()
    for theirs in tensors:
        mine = out.graph.initializer.add()
        if uses_external_data(theirs):
            location, start, length = external_location(theirs)
            file = source_dir / location
            if base is not None and file.resolve() == base:
                if length is None:
                    length = os.path.getsize(file) - start
                _refer(mine, theirs, data_name, start, length)
                continue
            written = copy_range(file, start, length, data)
        elif theirs.HasField("raw_data") and theirs.ByteSize() >= EXTERNAL_THRESHOLD:
            data.write(theirs.raw_data)
            written = data.tell() - offset
        else:
            mine.CopyFrom(theirs)
            continue
        _refer(mine, theirs, data_name, offset, written)
        offset += written
        pad = -offset % (BLOCK if written >= BLOCK else 64)  # for mmap and clones
        data.write(b"\0" * pad)
        offset += pad


def _refer(mine: TensorProto, theirs: TensorProto, location: str, offset: int, length: int):
    """Makes ``mine`` the tensor ``theirs`` with its data at ``offset`` of ``location``."""
    mine.CopyFrom(tensor_header(theirs))
    set_external_location(mine, location, offset, length)


def _base_data(tensors: list[TensorProto], source_dir: Path, data) -> Path | None:
    """Starts the output's data file (``data``, empty) as the one file that the external
    ``tensors`` lie in, so that they keep their offsets (``files.start_as``: shared or copied,
    the ranges no tensor uses released). Returns the file (resolved), or None where the tensors
    lie in several files or fill too little of one: they are then copied one by one."""
    ranges: dict[Path, list[tuple[int, int]]] = {}
    for tensor in tensors:
        if uses_external_data(tensor):
            location, start, length = external_location(tensor)
            file = (source_dir / location).resolve()
            if length is None:
                length = os.path.getsize(file) - start
            ranges.setdefault(file, []).append((start, start + length))
    if len(ranges) != 1:
        return None
    ((file, used),) = ranges.items()
    return file if start_as(data, file, used) else None


def _put_in_place(
    path: Path, tmp_model: str, tmp_data: str, data_name: str, temps: TempFiles
) -> None:
    """Renames the written data file, then the model, into place. The old model steps aside
    first: a run killed before the new model is in place leaves no model, never the old model
    beside the new data; a failed rename of the data puts it back."""
    aside = None
    if path.exists():
        fd, aside = temps.new(".old.tmp")
        os.close(fd)
        os.replace(path, aside)
    try:
        os.replace(tmp_data, path.parent / data_name)
    except OSError:
        if aside is not None:
            os.replace(aside, path)
        raise
    os.replace(tmp_model, path)
