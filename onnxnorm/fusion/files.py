"""Fusing one model file: the file-level API that ``onnxnorm fuse FILE``, a folder
(:mod:`onnxnorm.fusion.folder`) and an onnxruntime-genai folder (:mod:`onnxnorm.genai`) all
call, so that each does the same and reports the same.

:func:`fuse_file` opens the input once at the door (``onnxnorm._io.open_model``: parsed with
its weights left where they are, checked once, the repairs kept), notes what is odd about it,
fuses it with those repairs (:func:`onnxnorm.fusion.pipeline.fuse_detached`, which checks
nothing again), writes the output atomically with the input's weights copied beside it, and,
when asked, runs the original and the output in ONNX Runtime on the same generated inputs (a
model with boolean inputs, a merged decoder's ``use_cache_branch``, once with them all false
and once all true, so that both branches are compared). An output over tolerance is removed.
What it did comes back as one :class:`FileResult`.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import onnx

from onnxnorm._io import (
    ModelFile,
    Written,
    check_data,
    check_output,
    data_started,
    open_model,
    own_names,
    write_model,
)
from onnxnorm.errors import OnnxNormError, first_line


class CannotVerify(OnnxNormError):
    """ONNX Runtime could not run the original or the fused model to compare them (``reason``:
    its own words); the output is removed."""

    def __init__(self, reason: str, output: Path):
        super().__init__(f"could not run the models in onnxruntime: {reason}; {output} not kept")
        self.reason = reason
        self.output = output


@dataclasses.dataclass
class FileResult:
    """What :func:`fuse_file` did to one file."""

    name: str  # the input, as the caller named it (a folder's files: relative to it)
    output: Path
    report: Any  # onnxnorm.fusion.report.FusionReport
    #: what is odd about the input (fails onnx's checker, ops of unknown domains): fused anyway
    notes: list[str] = dataclasses.field(default_factory=list)
    #: the output's checks against the input (onnxnorm.fusion.verify.OutputCheck); None when
    #: not verified
    checks: list | None = None
    #: the resolved paths of the input's external data files (not to be copied beside it)
    data_files: set[Path] = dataclasses.field(default_factory=set)
    #: whether the output holds onnxnorm nodes (it runs fused where the library is registered)
    uses_onnxnorm: bool = False
    #: what was written (the output's files, where its weights are: ``onnxnorm._io.Written``)
    written: Written | None = None

    @property
    def ok(self) -> bool:
        """Verified within tolerance, or not verified."""
        return self.checks is None or all(c.ok for c in self.checks)

    @property
    def kept(self) -> bool:
        """Whether the output exists (an output over tolerance is removed)."""
        return self.ok

    def parity(self) -> str:
        if self.checks is None:
            return "not verified"
        worst = max((c.max_abs for c in self.checks), default=0.0)
        return f"{'ok' if self.ok else 'OVER TOLERANCE'} (max abs error {worst:.1e})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.name,
            "report": self.report.to_dict(),
            "input_notes": list(self.notes),
            "verify": None if self.checks is None else [vars(c) for c in self.checks],
        }


def input_notes(model: onnx.ModelProto, folder: str | os.PathLike) -> list[str]:
    """What is odd about an input, for the report (fusion goes on regardless): onnx's own
    checker fails on it, or it has ops of domains neither onnx nor ONNX Runtime knows. The
    checker runs in the model's ``folder``, where its external data files are."""
    import contextlib

    from onnxnorm.ops import catalogue
    from onnxnorm.ops.functions import all_graphs

    notes = []
    try:
        with contextlib.chdir(folder):
            onnx.checker.check_model(model)
    except Exception as error:  # noqa: BLE001 - any checker failure is reported, not raised
        notes.append(f"the input fails onnx.checker: {first_line(error)}")
    known = {"", "ai.onnx", "ai.onnx.ml", "com.microsoft", catalogue.DOMAIN}
    local = {(f.domain, f.name) for f in model.functions}
    unknown = sorted(
        {
            f"{n.domain}::{n.op_type}"
            for g in all_graphs(model.graph)
            for n in g.node
            if n.domain not in known and (n.domain, n.op_type) not in local
        }
    )
    if unknown:
        notes.append(f"ops of unknown domains, left as they are: {', '.join(unknown)}")
    return notes


def genai_sizes(opened: ModelFile) -> dict[str, int] | None:
    """For a model in an onnxruntime-genai folder, the sizes of the KV cache's dims from its
    genai_config.json (generated inputs cannot guess the head size); None elsewhere."""
    from onnxnorm._genai_config import CONFIG, dim_sizes, read_config

    if not (opened.folder / CONFIG).is_file():
        return None
    try:
        return dim_sizes(read_config(opened.folder), opened.model)
    except Exception:  # noqa: BLE001 - a config it cannot read: generated sizes as for any model
        return None


def compare(original: ModelFile, fused: ModelFile) -> list:
    """The checks of ``fused`` against ``original`` (:func:`onnxnorm.fusion.verify.verify`);
    with boolean inputs, one run with them all false and one with them all true (each branch of
    a merged decoder), their checks named after the run."""
    import numpy as np

    from onnxnorm.fusion.verify import generate_inputs, uses_onnxnorm, verify

    with_library = uses_onnxnorm(original.model) or uses_onnxnorm(fused.model)
    sizes = genai_sizes(original)
    graph = original.model
    flags = [
        i.name for i in graph.graph.input if i.type.tensor_type.elem_type == onnx.TensorProto.BOOL
    ]
    if not flags:
        return verify(original, fused, with_library=with_library, sizes=sizes)
    checks = []
    for value in (False, True):
        feeds = generate_inputs(graph, sizes=sizes)
        for name in flags:
            feeds[name] = np.full_like(feeds[name], value)
        for check in verify(original, fused, with_library=with_library, feeds=feeds):
            check.name = f"{check.name} [{'/'.join(flags)}={str(value).lower()}]"
            checks.append(check)
    return checks


def verify_file(original: str | os.PathLike, fused: str | os.PathLike) -> list:
    """The checks of the model file ``fused`` against the model file ``original``
    (:func:`compare`), each opened and checked as an input is."""
    return compare(open_model(original), open_model(fused))


def fuse_file(
    source: str | os.PathLike,
    output: str | os.PathLike,
    *,
    target: str = "function",
    runtime: str | None = None,
    strict_precision: bool = False,
    upgrade: bool = False,
    verify: bool = False,
    name: str | None = None,
    make_folder: bool = False,
    data: str = "copy",
) -> FileResult:
    """Fuses the model file ``source`` into ``output`` (its folder made where missing;
    ``target``, ``runtime``, ``strict_precision``, ``upgrade``: see
    :func:`onnxnorm.fusion.fuse`), as
    ``onnxnorm fuse`` does. ``verify``: run both in ONNX Runtime and compare their outputs;
    an output over tolerance is removed (``result.kept`` False), and one ONNX Runtime cannot
    run raises :class:`CannotVerify` after removing it. ``name``: how the result names the
    input (default: ``source`` as given). ``make_folder``: make ``output``'s folder where it is
    missing (else that is refused, before any work, as are an output that cannot be written
    and an output that is the input). ``data``: how the output gets the input's unchanged
    external data (``onnxnorm._io.DATA_MODES``; a mode that cannot write ``output``, such as
    ``reference`` with the output outside the data file's folder, is refused before the pass).
    ``source`` is never modified."""
    from onnxnorm import targets
    from onnxnorm.fusion import pipeline
    from onnxnorm.fusion.verify import uses_onnxnorm

    targets.check(target)
    if runtime is not None:
        targets.check_runtime(runtime)
    if make_folder:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
    output = check_output(output, inputs=[source])  # before any work
    opened = open_model(source)
    check_data(opened.model, output, data, opened.path)
    # the output's data file is copied on a thread while the pass runs
    with data_started(opened.model, output, data, opened.path) as started:
        notes = input_notes(opened.model, opened.folder)
        fused, weights, report = pipeline.fuse_detached(
            opened.model,
            target=target,
            base_dir=str(opened.folder),
            strict_precision=strict_precision,
            upgrade=upgrade,
            repairs=opened.repairs,
            runtime=runtime,
        )
        written = write_model(
            fused, output, source=opened.path, extra=weights, data=data, started=started
        )
    del weights
    result = FileResult(
        name=os.fspath(source) if name is None else name,
        output=output,
        report=report,
        notes=notes,
        data_files=opened.data_files(),
        uses_onnxnorm=uses_onnxnorm(fused),
        written=written,
    )
    if verify:
        fused_file = ModelFile(output, fused, [])
        try:
            result.checks = compare(opened, fused_file)
        except Exception as error:  # noqa: BLE001 - ORT's own message says what failed
            remove_model(output)
            raise CannotVerify(first_line(error), output) from None
        if not result.ok:
            remove_model(output)
    return result


def remove_model(path: str | os.PathLike) -> None:
    """Removes a written model file and its own files (its data file, the hard links of
    ``--data link``: ``onnxnorm._io.own_names``), where they exist; never a file of the input
    that it reads where it is (``--data reference``)."""
    for name in (Path(path), *own_names(path)):
        if os.path.lexists(name):
            os.unlink(name)
