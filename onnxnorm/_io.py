"""Reading and writing model files with one-line errors and atomic writes.

Large models. ``load_model(path, load_weights=False)`` leaves tensors stored as external data
where they are (only those under 1 KiB, which rules read as constants, are loaded).
``save_model`` writes a model whose external tensors still point into the input's data file by
copying them, one at a time, into the output's own data file; a model over 2 GB, or one that
came with external data, is written with external data (``<output>.data``). Files are written
under temporary names in the output folder and renamed into place (data first, the model
last), so no half-written file ever carries the output's name.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from pathlib import Path
from typing import Iterable

import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto, external_data_helper

#: Protobuf cannot serialize a message over 2 GiB.
_PROTOBUF_LIMIT = 2**31 - 1
#: tensors at least this large go to the data file when a model is written with external data
EXTERNAL_THRESHOLD = 1024
#: tensors this small are loaded even when external: rules read them (epsilon, axes, exponents)
SMALL_TENSOR = 1024
_CHUNK = 1 << 24


class OnnxNormError(Exception):
    """An error for the user: the message says what is wrong and is printed as it is."""


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _external_tensors(model: onnx.ModelProto) -> Iterable[TensorProto]:
    return (t for t in external_data_helper._get_all_tensors(model)
            if external_data_helper.uses_external_data(t))


def _nbytes(tensor: TensorProto) -> int:
    for entry in tensor.external_data:
        if entry.key == "length":
            return int(entry.value)
    return 1 << 62


def load_model(path: str | os.PathLike, load_weights: bool = True) -> onnx.ModelProto:
    """Reads a model. With ``load_weights=False`` its external data stays on disk (the returned
    model's external tensors are resolved against ``path``'s folder when written by
    :func:`save_model` with ``source=path``)."""
    path = Path(path)
    if not path.is_file():
        raise OnnxNormError(f"{path}: no such file")
    try:
        model = onnx.load(path, load_external_data=False)
    except (DecodeError, RuntimeError, ValueError, OSError) as error:
        raise OnnxNormError(f"{path}: not a readable ONNX model ({_first_line(error)})") from None
    if not model.ir_version or not model.HasField("graph"):
        raise OnnxNormError(f"{path}: not an ONNX model (no IR version or graph)")
    try:
        for tensor in list(_external_tensors(model)):
            if load_weights or _nbytes(tensor) < SMALL_TENSOR:
                external_data_helper.load_external_data_for_tensor(tensor, str(path.parent))
                tensor.data_location = TensorProto.DEFAULT
                del tensor.external_data[:]
    except (OSError, ValueError) as error:
        raise OnnxNormError(f"{path}: cannot read its external data ({_first_line(error)})") from None
    return model


def has_external_data(model: onnx.ModelProto) -> bool:
    return any(True for _ in _external_tensors(model))


def _location(tensor: TensorProto) -> tuple[str, int, int | None]:
    info = {e.key: e.value for e in tensor.external_data}
    return info["location"], int(info.get("offset", 0)), (int(info["length"]) if "length" in info
                                                          else None)


def save_model(model: onnx.ModelProto, path: str | os.PathLike, *,
               source: str | os.PathLike | None = None, like: str | os.PathLike | None = None,
               external: bool | None = None, extra: Iterable[TensorProto] = ()) -> Path:
    """Writes ``model`` to ``path`` atomically.

    ``source`` (or ``like``): the file the model was read from; external tensors of the model
    are read from its folder. ``extra``: more main-graph initializers, written after the
    model's own one at a time (so that a caller holding them need not copy them into
    ``model``). ``external``: write external data (default: when the model has external
    tensors or would pass 2 GB). ``model`` itself is not changed.
    """
    extra = list(extra)
    path = Path(path)
    folder = path.parent
    if not folder.is_dir():
        raise OnnxNormError(f"cannot write {path}: folder {folder} does not exist")
    if path.is_dir():
        raise OnnxNormError(f"cannot write {path}: it is a folder")
    source = source or like
    source_dir = Path(source).resolve().parent if source else folder.resolve()
    if external is None:
        external = (has_external_data(model) or any(external_data_helper.uses_external_data(t)
                                                     for t in extra)
                    or model.ByteSize() + sum(t.ByteSize() + 8 for t in extra) > _PROTOBUF_LIMIT)
    temps: list[str] = []

    def temp(suffix: str) -> tuple[int, str]:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=folder)
        temps.append(name)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(name, 0o666 & ~umask)
        return fd, name

    try:
        if not external:
            if model.ByteSize() + sum(t.ByteSize() + 8 for t in extra) > _PROTOBUF_LIMIT:
                raise OnnxNormError(f"cannot write {path}: over 2 GB without external data")
            fd, tmp = temp(".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(model.SerializeToString())
                # protobuf merges repeated occurrences of the graph field: each patch below
                # appends one initializer to the graph
                for tensor in extra:
                    patch = onnx.ModelProto()
                    patch.graph.initializer.add().CopyFrom(tensor)
                    f.write(patch.SerializeToString())
                    del patch
            os.replace(tmp, path)
            return path
        data_name = path.name + ".data"
        fd, tmp_data = temp(".data.tmp")
        out = _shell(model)
        offset = 0
        with os.fdopen(fd, "wb") as data:
            for theirs in itertools.chain(model.graph.initializer, extra):
                mine = out.graph.initializer.add()
                if external_data_helper.uses_external_data(theirs):
                    location, start, length = _location(theirs)
                    written = _copy_range(source_dir / location, start, length, data)
                elif theirs.HasField("raw_data") and theirs.ByteSize() >= EXTERNAL_THRESHOLD:
                    data.write(theirs.raw_data)
                    written = data.tell() - offset
                else:
                    mine.CopyFrom(theirs)
                    continue
                mine.name, mine.data_type = theirs.name, theirs.data_type
                mine.dims.extend(theirs.dims)
                if theirs.doc_string:
                    mine.doc_string = theirs.doc_string
                for key, value in (("location", data_name), ("offset", str(offset)),
                                   ("length", str(written))):
                    entry = mine.external_data.add()
                    entry.key, entry.value = key, value
                mine.data_location = TensorProto.EXTERNAL
                offset += written
                pad = -offset % 64  # aligned for memory mapping
                data.write(b"\0" * pad)
                offset += pad
        fd, tmp_model = temp(".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(out.SerializeToString())
        os.replace(tmp_data, folder / data_name)
        os.replace(tmp_model, path)
        return path
    except OnnxNormError:
        raise
    except OSError as error:
        raise OnnxNormError(f"cannot write {path}: {error.strerror or error}") from None
    finally:
        for name in temps:
            if os.path.exists(name):
                os.unlink(name)


def _shell(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` without its main graph's initializers (and so without its weights)."""
    out = onnx.ModelProto()
    for field, value in model.ListFields():
        if field.name != "graph":
            if field.is_repeated:
                getattr(out, field.name).extend(value)
            elif field.message_type is not None:
                getattr(out, field.name).CopyFrom(value)
            else:
                setattr(out, field.name, value)
    for field, value in model.graph.ListFields():
        if field.name == "initializer":
            continue
        if field.is_repeated:
            getattr(out.graph, field.name).extend(value)
        elif field.message_type is not None:
            getattr(out.graph, field.name).CopyFrom(value)
        else:
            setattr(out.graph, field.name, value)
    return out


def _copy_range(file: Path, start: int, length: int | None, out) -> int:
    """Copies ``length`` bytes at ``start`` of ``file`` into ``out`` in chunks."""
    with open(file, "rb") as f:
        f.seek(start)
        remaining = length if length is not None else os.path.getsize(file) - start
        total = 0
        while remaining > 0:
            chunk = f.read(min(_CHUNK, remaining))
            if not chunk:
                raise OSError(f"{file} ends before the tensor data it should hold")
            out.write(chunk)
            remaining -= len(chunk)
            total += len(chunk)
    return total
