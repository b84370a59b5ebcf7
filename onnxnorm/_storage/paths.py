"""Paths and folders: where a model's external data is read from, refusing in one line the input
and output paths that cannot be read or written (before any work), and building an output
folder beside its place and renaming it in.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from onnxnorm.errors import OnnxNormError


def model_dir(path: str | os.PathLike) -> Path:
    """The folder a model file's external data is read from: the folder holding the path as
    given, not the target of a symbolic link (as onnx and ONNX Runtime read it). A Hugging Face
    cache snapshot links model.onnx and its data file into the repository's blobs folder, where
    the data file's name is not."""
    return Path(path).absolute().parent


def reference_location(file: Path, folder: Path, output: Path) -> str:
    """The location that a model written in ``folder`` (as ``output``) gives the data file
    ``file`` (an input's, named as the input reads it) to read it where it is: its path
    relative to ``folder``, in ``/`` form. Refused in one line where that path would leave the
    folder (``..``: onnx and ONNX Runtime read external data only from the model's folder and
    below) or would not lead to the same file."""
    for a, b in ((file, folder), (file.resolve(), folder.resolve())):
        relative = os.path.relpath(a, b)
        if relative != os.pardir and not relative.startswith(os.pardir + os.sep):
            break
    else:
        raise OnnxNormError(
            f"cannot write {output} with --data reference: the input's data file {file} is "
            f"not in the output's folder {folder} or below it, and a model reads external "
            "data only there; write the output beside it, or use --data link (the same file "
            "system) or --data copy"
        )
    if not os.path.samefile(folder / relative, file):
        raise OnnxNormError(
            f"cannot write {output} with --data reference: {folder / relative} is not the "
            f"input's data file {file}"
        )
    return Path(relative).as_posix()


def check_input(path: str | os.PathLike) -> Path:
    """Refuses, in one line, an input path that is not a readable regular file."""
    path = Path(path)
    if path.is_dir():
        raise OnnxNormError(f"{path}: is a directory, not an ONNX model file")
    if not path.exists():
        raise OnnxNormError(f"{path}: no such file")
    if not path.is_file():
        raise OnnxNormError(f"{path}: not a regular file")
    if not os.access(path, os.R_OK):
        raise OnnxNormError(f"{path}: not readable (permission denied)")
    return path


def check_output(path: str | os.PathLike, *, inputs: Iterable[str | os.PathLike] = ()) -> Path:
    """Refuses, in one line and before any work, an output path that cannot be written: a
    missing or unwritable folder, a directory, or one of ``inputs`` (or, for a model written with
    external data, its data file)."""
    path = Path(path)
    folder = path.parent
    if str(path) in ("", ".") or path.name in ("", ".", ".."):
        raise OnnxNormError(f"{path}: not a file name")
    if path.is_dir():
        raise OnnxNormError(f"cannot write {path}: it is a directory")
    if not folder.exists():
        raise OnnxNormError(f"cannot write {path}: folder {folder} does not exist")
    if not folder.is_dir():
        raise OnnxNormError(f"cannot write {path}: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OnnxNormError(f"cannot write {path}: folder {folder} is not writable")
    if path.exists() and not os.access(path, os.W_OK):
        raise OnnxNormError(f"cannot write {path}: the file exists and is not writable")
    target = path.resolve()
    for source in inputs:
        source = Path(source).resolve()
        if target in (source, Path(str(source) + ".data")):
            raise OnnxNormError(
                f"cannot write {path}: it is the input {source}; the input is "
                "never modified, choose another output"
            )
    return path


def check_output_folder(
    source: str | os.PathLike, output: str | os.PathLike, overwrite: bool = False
) -> Path:
    """Refuses, in one line and before any work, an output folder that is, holds or lies in the
    input folder ``source``, that exists (unless ``overwrite``; then it must be a folder), or
    whose parent is missing or not writable."""
    source, output = Path(source), Path(output)
    src, out = source.resolve(), output.resolve()
    if out == src or src in out.parents or out in src.parents:
        raise OnnxNormError(
            f"cannot write {output}: it is, holds or lies inside the input "
            f"folder {source}; the input is never modified, choose another output"
        )
    if output.exists() or output.is_symlink():
        if not overwrite:
            raise OnnxNormError(f"{output} exists; pass --overwrite to replace it")
        if not output.is_dir():
            raise OnnxNormError(f"cannot write {output}: it exists and is not a folder")
    parent = output.parent
    if not parent.is_dir():
        raise OnnxNormError(f"cannot write {output}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OnnxNormError(f"cannot write {output}: folder {parent} is not writable")
    return output


def copy_rest(source: Path, work: Path, skip: set[Path]) -> None:
    """Copies every file and folder below ``source`` into ``work`` but those whose resolved
    path is in ``skip`` and those ``work`` already holds."""
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source)
        if path.resolve() in skip or (work / relative).exists():
            continue
        if path.is_dir():
            (work / relative).mkdir(parents=True, exist_ok=True)
        else:
            (work / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, work / relative)


def write_folder(output: Path, build) -> bool:
    """Builds a folder with ``build(work)`` in a temporary folder beside ``output`` and renames
    it into place (replacing ``output``) when ``build`` returns True; removes it when ``build``
    returns False (then returns False) or raises."""
    work = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    try:
        if not build(work):
            shutil.rmtree(work)
            return False
        if output.exists():
            shutil.rmtree(output)
        os.replace(work, output)
        return True
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
