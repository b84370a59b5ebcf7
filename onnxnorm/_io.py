"""Reading and writing model files with one-line errors and atomic writes."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

#: Protobuf cannot serialize a message over 2 GiB.
_PROTOBUF_LIMIT = 2**31 - 1


class OnnxNormError(Exception):
    """An error for the user: the message says what is wrong and is printed as it is."""


def load_model(path: str | os.PathLike) -> onnx.ModelProto:
    path = Path(path)
    if not path.is_file():
        raise OnnxNormError(f"{path}: no such file")
    try:
        model = onnx.load(path)
    except (DecodeError, RuntimeError, ValueError, OSError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise OnnxNormError(f"{path}: not a readable ONNX model ({reason})") from None
    if not model.ir_version or not model.HasField("graph"):
        raise OnnxNormError(f"{path}: not an ONNX model (no IR version or graph)")
    return model


def save_model(model: onnx.ModelProto, path: str | os.PathLike) -> Path:
    """Writes ``model`` to ``path`` through a temporary file in the same folder and a rename,
    so that ``path`` is never left half-written."""
    path = Path(path)
    folder = path.parent
    if not folder.is_dir():
        raise OnnxNormError(f"cannot write {path}: folder {folder} does not exist")
    if path.is_dir():
        raise OnnxNormError(f"cannot write {path}: it is a folder")
    if model.ByteSize() > _PROTOBUF_LIMIT:
        raise OnnxNormError(f"cannot write {path}: models over 2 GB (external data) are not "
                            "supported yet")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as error:
        raise OnnxNormError(f"cannot write {path}: {error.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(model.SerializeToString())
        os.replace(tmp, path)
    except OSError as error:
        raise OnnxNormError(f"cannot write {path}: {error.strerror or error}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path
