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
from onnxnorm.errors import OnnxNormError, first_line


@dataclasses.dataclass
class FileResult:
    """One ONNX file of the folder: its path in the folder, fusion report and checks."""

    name: str
    report: Any  # onnxnorm.fusion.FusionReport
    checks: list | None = None  # onnxnorm.fusion.verify.OutputCheck, None when not verified

    @property
    def ok(self) -> bool:
        return self.checks is None or all(c.ok for c in self.checks)

    def parity(self) -> str:
        if self.checks is None:
            return "not verified"
        worst = max((c.max_abs for c in self.checks), default=0.0)
        return f"{'ok' if self.ok else 'OVER TOLERANCE'} (max abs error {worst:.1e})"


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
            "files": [
                {
                    "file": f.name,
                    "report": f.report.to_dict(),
                    "verify": None if f.checks is None else [vars(c) for c in f.checks],
                }
                for f in self.files
            ],
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


def verify_file(original: Path, fused: Path) -> list:
    """The checks of one file; with boolean inputs, one run with them all false and one with
    them all true (each branch of a merged decoder), their checks named after the run."""
    import numpy as np
    import onnx

    from onnxnorm.fusion.verify import generate_inputs, verify

    graph = onnx.load(original, load_external_data=False)
    flags = [
        i.name for i in graph.graph.input if i.type.tensor_type.elem_type == onnx.TensorProto.BOOL
    ]
    if not flags:
        return verify(original, fused)
    checks = []
    for value in (False, True):
        feeds = generate_inputs(graph)
        for name in flags:
            feeds[name] = np.full_like(feeds[name], value)
        for check in verify(original, fused, feeds=feeds):
            check.name = f"{check.name} [{'/'.join(flags)}={str(value).lower()}]"
            checks.append(check)
    return checks


def fuse_file(
    source: Path,
    output: Path,
    *,
    target: str = "function",
    strict_precision: bool = False,
    upgrade: bool = False,
) -> tuple[Any, set[Path]]:
    """Fuses the model file ``source`` into ``output`` (its folder made where missing), as
    ``onnxnorm fuse`` does; returns the fusion report and the resolved paths of the input's
    external data files (not to be copied beside the output)."""
    from onnxnorm._io import external_files, load_model, save_model
    from onnxnorm.fusion.pipeline import fuse_detached

    model = load_model(source, load_weights=False)
    data = external_files(model, source.parent)
    fused, weights, report = fuse_detached(
        model,
        target=target,
        base_dir=str(source.parent),
        strict_precision=strict_precision,
        upgrade=upgrade,
    )
    del model
    output.parent.mkdir(parents=True, exist_ok=True)
    save_model(fused, output, source=source, extra=weights)
    return report, data


def fuse_folder(
    source: str | os.PathLike,
    output: str | os.PathLike,
    *,
    target: str = "function",
    verify: bool = True,
    overwrite: bool = False,
    strict_precision: bool = False,
    upgrade: bool = False,
    progress: Callable[[str], None] | None = None,
) -> FolderReport:
    """Writes to ``output`` a copy of the folder ``source`` with every ONNX file fused
    (``target``, ``strict_precision``, ``upgrade``: see :func:`onnxnorm.fusion.fuse`) and the
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
                progress(f"fusing {name}")
            fused, data = fuse_file(
                source / name,
                work / name,
                target=target,
                strict_precision=strict_precision,
                upgrade=upgrade,
            )
            skip |= data | {(source / name).resolve()}
            result = FileResult(str(name), fused)
            report.files.append(result)
            if not verify:
                continue
            if progress:
                progress(f"verifying {name}")
            try:
                result.checks = verify_file(source / name, work / name)
            except Exception as error:  # noqa: BLE001 - ORT's own message says what failed
                raise OnnxNormError(
                    f"{name}: could not run it in onnxruntime to verify it: "
                    f"{first_line(error)}; {output} not written"
                ) from None
        if not report.ok:
            return False
        copy_rest(source, work, skip)
        return True

    report.written = write_folder(output, build)
    return report
