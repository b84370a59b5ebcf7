"""External data: the tensors of a model whose bytes lie in a file beside it, where they lie, and
reading them in.

A tensor in external data names a file (``location``, relative to the model's folder), an
``offset`` and a ``length`` in its ``external_data`` entries. ``onnxnorm._io.load_model`` with
``load_weights=False`` also makes references into the model file itself for its inline weights
(``onnxnorm._storage.wire``); :func:`has_external_data` does not count those.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import onnx
from onnx import TensorProto, external_data_helper

#: tensors at least this large go to the data file when a model is written with external data
EXTERNAL_THRESHOLD = 1024
#: tensors this small are loaded even when external: rules read them (epsilon, axes, exponents)
SMALL_TENSOR = 1024


def external_tensors(model: onnx.ModelProto) -> Iterable[TensorProto]:
    """The tensors of ``model`` (subgraphs and attributes included) stored as external data."""
    return (
        t
        for t in external_data_helper._get_all_tensors(model)
        if external_data_helper.uses_external_data(t)
    )


def external_location(tensor: TensorProto) -> tuple[str, int, int | None]:
    """An external tensor's file, offset and length (None: to the end of the file)."""
    info = {e.key: e.value for e in tensor.external_data}
    return (
        info["location"],
        int(info.get("offset", 0)),
        (int(info["length"]) if "length" in info else None),
    )


def external_length(tensor: TensorProto) -> int:
    """The length an external tensor declares; huge where it declares none."""
    for entry in tensor.external_data:
        if entry.key == "length":
            return int(entry.value)
    return 1 << 62


def set_external_location(tensor: TensorProto, location: str, offset: int, length: int) -> None:
    """Makes ``tensor`` (without data of its own) an external tensor of those bytes."""
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    tensor.data_location = TensorProto.EXTERNAL


def tensor_header(tensor: TensorProto) -> TensorProto:
    """A copy of ``tensor`` without its data: name, element type, dims and doc string."""
    header = TensorProto()
    header.name, header.data_type = tensor.name, tensor.data_type
    header.dims.extend(tensor.dims)
    if tensor.doc_string:
        header.doc_string = tensor.doc_string
    return header


def external_files(model: onnx.ModelProto, folder: str | os.PathLike) -> set[Path]:
    """The resolved paths of the external data files ``model`` (read from ``folder``) names."""
    files = set()
    for tensor in external_tensors(model):
        for entry in tensor.external_data:
            if entry.key == "location":
                files.add((Path(folder) / entry.value).resolve())
    return files


def has_external_data(model: onnx.ModelProto, source: str | os.PathLike | None = None) -> bool:
    """Whether ``model`` has tensors in external data files (references into ``source`` itself,
    which ``onnxnorm._io.load_model`` makes for inline weights, do not count)."""
    own = Path(source).name if source else None
    return any(external_location(t)[0] != own for t in external_tensors(model))


def read_external(tensor: TensorProto, folder: Path) -> None:
    """Reads an external tensor's bytes into its raw data, from the file that
    :func:`onnxnorm._validate.check_external_data` let through (onnx's own reader refuses every
    symbolic link, a Hugging Face cache snapshot's among them)."""
    location, start, length = external_location(tensor)
    with open(folder / location, "rb") as f:
        f.seek(start)
        data = f.read() if length is None else f.read(length)
    if length is not None and len(data) != length:
        raise ValueError(f"tensor {tensor.name!r}: {location} ends before its data")
    tensor.raw_data = data


def weightless_shell(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` without its main graph's initializers (and so without its weights)."""
    out = onnx.ModelProto()
    _copy_fields(model, out, skip="graph")
    _copy_fields(model.graph, out.graph, skip="initializer")
    return out


def _copy_fields(source, target, skip: str) -> None:
    """Copies every field set in the message ``source`` into ``target`` but the one ``skip``."""
    for field, value in source.ListFields():
        if field.name == skip:
            continue
        if field.is_repeated:
            getattr(target, field.name).extend(value)
        elif field.message_type is not None:
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)
