"""Fusing a folder of ONNX models, as Optimum exports them (``optimum-cli export onnx``: a
decoder with its past keys and values in ``model.onnx``; encoder-decoders split into
``encoder_model.onnx``, ``decoder_model.onnx``, ``decoder_with_past_model.onnx`` and
``decoder_model_merged.onnx``, whose If node holds both decoders).

:func:`fuse_folder` writes a copy of the folder in which every ``.onnx`` file (in subfolders
too) is fused, with its external data written next to it as ``onnxnorm fuse`` writes it
(``<file>.data``; the input's data files are not copied), and every other file (config.json,
generation_config.json, the tokenizer) is copied as it is. Each fused file is run against its
original in ONNX Runtime (:mod:`onnxnorm.fusion.verify`) unless ``verify=False``; a file with
boolean inputs (a merged decoder's ``use_cache_branch``) is run with them all false and all
true, so that both branches are compared. The folder is built under a temporary name beside
the output and renamed into place only when every file passed; the input is never modified.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from onnxnorm._io import check_output_folder
from onnxnorm.errors import OnnxNormError
from onnxnorm.fusion import files
from onnxnorm.fusion.files import CannotVerify, FileResult, verify_file

__all__ = ["FileResult", "FolderReport", "fuse_folder", "onnx_files", "verify_file"]


@dataclasses.dataclass
class FolderReport:
    """What :func:`fuse_folder` did, file by file; ``written``: whether the output exists
    (False when a file failed its check)."""

    files: list[FileResult]
    written: bool = True

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.files)

    @property
    def norms(self) -> int:
        return sum(f.report.norms for f in self.files)

    @property
    def residual_adds(self) -> int:
        return sum(f.report.residual_adds for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        return {
            "norms": self.norms,
            "residual_adds": self.residual_adds,
            "ok": self.ok,
            "written": self.written,
            "files": [f.to_dict() for f in self.files],
        }

    def table(self) -> str:
        """One line per file: norms fused, residual adds absorbed, parity."""
        width = max([len(f.name) for f in self.files] + [4])
        lines = [f"{'file':<{width}}  norms  adds  parity"]
        lines += [
            f"{f.name:<{width}}  {f.report.norms:>5}  {f.report.residual_adds:>4}  {f.parity()}"
            for f in self.files
        ]
        return "\n".join(lines)

    def __str__(self) -> str:
        parts = []
        for f in self.files:
            parts.append(f"{f.name}:")
            parts += [f"  note: {note}" for note in f.notes]
            parts += [f"  {line}" for line in str(f.report).splitlines()]
        return "\n".join(parts + [self.table()])


def onnx_files(folder: str | os.PathLike) -> list[Path]:
    """The ``.onnx`` files of ``folder`` and its subfolders, relative to it, sorted; one-line
    errors for a path that is no folder or a folder without any."""
    folder = Path(folder)
    if not folder.exists():
        raise OnnxNormError(f"{folder}: no such file or folder")
    if not folder.is_dir():
        raise OnnxNormError(f"{folder}: not a folder")
    found = sorted(p.relative_to(folder) for p in folder.rglob("*.onnx") if p.is_file())
    if not found:
        raise OnnxNormError(f"{folder}: no .onnx file in this folder (nor in its subfolders)")
    return found


def fuse_folder(
    source: str | os.PathLike,
    output: str | os.PathLike,
    *,
    target: str = "function",
    runtime: str | None = None,
    verify: bool = True,
    overwrite: bool = False,
    strict_precision: bool = False,
    upgrade: bool = False,
    progress: Callable[[str], None] | None = None,
) -> FolderReport:
    """Writes to ``output`` a copy of the folder ``source`` with every ONNX file fused
    (``target``, ``runtime``, ``strict_precision``, ``upgrade``: see
    :func:`onnxnorm.fusion.fuse`) and the
    other files
    copied. ``verify``: run each fused file against its original (the default); when one is
    over tolerance, nothing is written and the report says which (``written`` False).
    ``output`` must not exist unless ``overwrite``; ``source`` is never modified."""
    from onnxnorm import targets
    from onnxnorm._io import copy_rest, write_folder

    targets.check(target)
    source, output = Path(source), Path(output)
    names = onnx_files(source)
    check_output_folder(source, output, overwrite)
    report = FolderReport([])

    def build(work: Path) -> bool:
        skip = set()
        for name in names:
            if progress:
                progress(f"fusing {name}" + (" and verifying it" if verify else ""))
            try:
                result = files.fuse_file(
                    source / name,
                    work / name,
                    target=target,
                    runtime=runtime,
                    strict_precision=strict_precision,
                    upgrade=upgrade,
                    verify=verify,
                    name=str(name),
                    make_folder=True,
                )
            except CannotVerify as error:
                raise OnnxNormError(
                    f"{name}: could not run it in onnxruntime to verify it: {error.reason}; "
                    f"{output} not written"
                ) from None
            skip |= result.data_files | {(source / name).resolve()}
            report.files.append(result)
        if not report.ok:
            return False
        copy_rest(source, work, skip)
        return True

    report.written = write_folder(output, build)
    return report


def fuse_file(
    source: Path,
    output: Path,
    *,
    target: str = "function",
    strict_precision: bool = False,
    upgrade: bool = False,
) -> tuple[Any, set[Path]]:
    """Deprecated: :func:`onnxnorm.fusion.fuse_file` (whose result names what this returned:
    ``result.report``, ``result.data_files``)."""
    import warnings

    warnings.warn(
        "onnxnorm.fusion.folder.fuse_file is deprecated; use onnxnorm.fusion.fuse_file",
        DeprecationWarning,
        stacklevel=2,
    )
    result = files.fuse_file(
        source,
        output,
        target=target,
        strict_precision=strict_precision,
        upgrade=upgrade,
        make_folder=True,
    )
    return result.report, result.data_files
