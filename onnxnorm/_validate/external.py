"""External data that stays inside the model's folder and fits its file, checked with ``stat``
alone: a refused file is never opened."""

from __future__ import annotations

import os
from pathlib import Path, PurePath

import onnx
from onnx import external_data_helper

from onnxnorm._validate.repairs import ModelProblem
from onnxnorm._validate.tensors import expected_bytes, external_info


def _all_tensors(model: onnx.ModelProto):
    return external_data_helper._get_all_tensors(model)


def _hugging_face_blob(root: Path, location: str, resolved: Path) -> bool:
    """A file of a Hugging Face hub cache: the model's folder is a snapshot
    (``<repo>/snapshots/<revision>``), the reference names a link right in it, and the link
    leads to a regular file right in the same repository's ``blobs`` folder, itself a real
    folder. That is how the hub's downloads lay a repository out; the file stays inside the
    downloaded repository."""
    if root.parent.name != "snapshots" or len(PurePath(location).parts) != 1:
        return False
    blobs = root.parent.parent / "blobs"
    return (
        blobs.is_dir()
        and not blobs.is_symlink()
        and resolved.parent == blobs
        and (root / location).is_symlink()
    )


def check_external_data(
    model: onnx.ModelProto, folder: str | os.PathLike, own: str | os.PathLike | None = None
) -> None:
    """Refuses external-data references that leave ``folder`` or do not fit their file,
    before any of them is opened. ``own``: the model file itself, which references made by
    :func:`onnxnorm._io.load_model` name (it is the input, wherever a link to it leads)."""
    root = Path(folder).resolve()
    own = Path(own) if own is not None else None
    sizes: dict[str, int] = {}
    for tensor in _all_tensors(model):
        if not external_data_helper.uses_external_data(tensor):
            continue
        location, offset, length = external_info(tensor)
        where = f"tensor {tensor.name!r}: external data {location!r}"
        if not location:
            raise ModelProblem(f"tensor {tensor.name!r}: external data without a location")
        if os.path.isabs(location) or PurePath(location).anchor or location.startswith("\\"):
            raise ModelProblem(
                f"{where} is an absolute path; only files in the model's folder "
                "are read (refused, not read)"
            )
        if ".." in PurePath(location.replace("\\", "/")).parts:
            raise ModelProblem(f"{where} leaves the model's folder (refused, not read)")
        resolved = (root / location).resolve()
        if own is not None and location == own.name:
            resolved = own
        elif root not in resolved.parents and not _hugging_face_blob(root, location, resolved):
            raise ModelProblem(
                f"{where} is a symbolic link to {resolved}, outside the model's "
                "folder (refused, not read); to read a link you trust, copy "
                "the folder with `cp -rL`"
            )
        if location not in sizes:
            if not resolved.exists():
                raise ModelProblem(f"{where}: no such file in the model's folder")
            if not resolved.is_file():
                raise ModelProblem(f"{where} is not a regular file (refused, not read)")
            sizes[location] = resolved.stat().st_size
        size = sizes[location]
        expected = expected_bytes(tensor)
        if length is not None and expected is not None and length != expected:
            held = (
                "it holds"
                if own is not None and resolved == own
                else "its external data length says"
            )
            raise ModelProblem(
                f"tensor {tensor.name!r} of shape {list(tensor.dims)} needs "
                f"{expected} bytes, {held} {length}"
            )
        needed = length if length is not None else expected
        if offset > size or (needed is not None and offset + needed > size):
            raise ModelProblem(
                f"{where} holds {size} bytes, tensor {tensor.name!r} needs bytes "
                f"{offset} to {offset + (needed or 0)}"
            )
