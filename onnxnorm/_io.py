"""Reading and writing model files with one-line errors and atomic writes.

Large models. ``load_model(path, load_weights=False)`` leaves tensors stored as external data
where they are (only those under 1 KiB, which rules read as constants, are loaded), and the
inline weights become references into the file itself (``onnxnorm._storage.wire``).
``save_model`` (``write_model``, which also says what it wrote) writes a model whose external
tensors still point into the input's data file; a model over 2 GB, or one that came with
external data, is written with external data. How the output gets the unchanged tensors of the
input's data file is its ``data`` mode (``DATA_MODES``, ``onnxnorm fuse --data``): ``copy``
(the default) gives it a data file of its own, ``<output>.data``, which starts as the input's
(``onnxnorm._storage.filesystem.start_as``: a clone where the file system shares extents, else
a copy made by the kernel) so that the unchanged tensors keep their offsets; ``reflink`` the
same, but only as a clone; ``link`` a hard link to the input's data file beside it
(``<output>.linked.data``); ``reference`` names the input's data file where it is (the output's
folder must hold it). In the last two only the new tensors are written, to ``<output>.data``.
Files are written under temporary names in the output folder and renamed into place (data
first, the model last), each to a name no file has (the old output's files step aside first);
no half-written file ever carries the output's name, and no file the input reads is written,
replaced or removed. A run killed while writing leaves only its temporary files
(``.<output>.<pid>.*.tmp``), which the next write of the same output removes. Nothing is
fsynced: a write is atomic for the processes that read the files, its durability across a
power loss is the file system's.

The parts are in ``onnxnorm._storage`` (paths, external data, the protobuf wire format, the
file system's copies, links and temporary files); the names of theirs that callers use are
importable from here too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import itertools
import os
from collections.abc import Iterable, Iterator
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
    DATA_MODES,
    CannotClone,
    CopyInBackground,
    TempFiles,
    clone_problem,
    copy_range,
    finish_start,
    remove_stale_temps,
    start_as,
    worth_copying_whole,
)
from onnxnorm._storage.paths import (
    check_input,
    check_output,
    check_output_folder,
    copy_rest,
    model_dir,
    reference_location,
    write_folder,
)
from onnxnorm._storage.wire import load_weights_as_references, write_referenced
from onnxnorm.errors import OnnxNormError, first_line

__all__ = [
    "DATA_MODES",
    "EXTERNAL_THRESHOLD",
    "SMALL_TENSOR",
    "ModelFile",
    "OnnxNormError",
    "check_data",
    "check_input",
    "check_output",
    "check_output_folder",
    "copy_rest",
    "data_path",
    "data_started",
    "external_files",
    "external_location",
    "external_tensors",
    "has_external_data",
    "load_model",
    "load_weights_as_references",
    "model_dir",
    "open_model",
    "own_names",
    "save_model",
    "weightless_shell",
    "write_folder",
    "write_model",
    "Written",
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
    data: str = "copy",
) -> Path:
    """Writes ``model`` to ``path`` atomically (:func:`write_model`, which says what it
    wrote)."""
    return write_model(
        model, path, source=source, like=like, external=external, extra=extra, data=data
    ).path


@dataclasses.dataclass
class Written:
    """What :func:`write_model` wrote: the model at ``path`` and the files it reads."""

    path: Path
    #: how the output got the input's unchanged external data (``DATA_MODES``)
    data: str = "copy"
    #: the output's own data file (``<path>.data``), where one was written
    own_data: Path | None = None
    #: how ``own_data`` started (copy, reflink): ``"cloned"`` (its extents shared with the
    #: input's file), ``"copied"`` (the input's file copied whole), ``""`` (tensor by tensor)
    how: str = ""
    #: the input data file that ``own_data`` started as (copy, reflink)
    base: Path | None = None
    #: hard links beside the output (link): each link and the input file it is
    links: dict[Path, Path] = dataclasses.field(default_factory=dict)
    #: the input's data files it reads where they are (reference): the location it names each
    #: by (relative to its folder) and the file as the input names it
    referenced: dict[str, Path] = dataclasses.field(default_factory=dict)

    def files(self) -> list[Path]:
        """The files this output consists of (the input's, referenced, are not its own)."""
        own = [self.own_data] if self.own_data is not None else []
        return [self.path, *own, *self.links]

    def describe(self) -> str:
        """Where the output's weights are, in one line (empty where they are all inside it)."""
        own = self.own_data.name if self.own_data is not None else None
        new = f"; the new tensors in {own}" if own else ""
        if self.referenced:
            names = ", ".join(
                f"{location} (the input's {file})" for location, file in self.referenced.items()
            )
            return (
                f"the unchanged weights are read from {names} where they are: deleting or "
                f"rewriting it breaks {self.path.name}{new}"
            )
        if self.links:
            names = ", ".join(
                f"{link.name}, a hard link to the input's {file}"
                for link, file in self.links.items()
            )
            return (
                f"the unchanged weights are in {names} (the same file under two names: "
                "writing either in place changes both; onnx.load refuses a data file with "
                f"several links, the input's too, ONNX Runtime reads them){new}"
            )
        if own is None:
            return ""
        if self.how == "cloned":
            return (
                f"{own}, a clone of the input's data file (extents shared, copy on write: no "
                "byte of the unchanged weights copied)"
            )
        if self.how == "copied":
            return (
                f"{own}, a copy of the input's data file (this file system shares no extents "
                "between files; --data link or --data reference copy nothing)"
            )
        return f"{own} holds every weight, copied tensor by tensor"


def write_model(
    model: onnx.ModelProto,
    path: str | os.PathLike,
    *,
    source: str | os.PathLike | None = None,
    like: str | os.PathLike | None = None,
    external: bool | None = None,
    extra: Iterable[TensorProto] = (),
    data: str = "copy",
    started: CopyInBackground | None = None,
) -> Written:
    """Writes ``model`` to ``path`` atomically; returns what it wrote.

    ``source`` (or ``like``): the file the model was read from; external tensors of the model
    are read from its folder. ``extra``: more main-graph initializers, written after the
    model's own one at a time (so that a caller holding them need not copy them into
    ``model``). ``external``: write external data (default: when the model has external
    tensors or would pass 2 GB). ``data``: how the output gets the unchanged tensors of the
    input's external data files (``DATA_MODES``: copy, reflink, link, reference; see
    :func:`check_data`). ``started``: the output's data file begun by :func:`data_started`,
    used where the output's unchanged tensors lie in the file it copies. ``model`` itself is not
    changed, and no file the input reads is written, replaced or removed.
    """
    if data not in DATA_MODES:
        raise ValueError(f"data={data!r}: choose one of {', '.join(DATA_MODES)}")
    source = source or like
    if data in ("link", "reference") and source is None:
        raise ValueError(f"data={data!r} needs the source model file, whose data files it keeps")
    extra = list(extra)
    path = check_output(path)
    source_dir = model_dir(source) if source else path.parent.resolve()
    if external is None:
        external = (
            has_external_data(model, source)
            or any(uses_external_data(t) for t in extra)
            or _inline_size(model, extra) > _PROTOBUF_LIMIT
        )
    _check_not_read(path, model, extra, source, source_dir)
    remove_stale_temps(path.parent, path.name)
    with TempFiles(path) as temps:
        save = _Save(model, extra, path, source_dir, temps, data, source, started)
        try:
            if external:
                return save.with_data_file()
            save.inline()
            return Written(path, data)
        except OnnxNormError:
            raise
        except CannotClone as error:
            raise OnnxNormError(
                f"cannot write {path} with --data reflink: the file system cannot clone "
                f"{error.file} ({error.strerror}); use --data copy, link or reference"
            ) from None
        except OSError as error:
            raise OnnxNormError(f"cannot write {path}: {error.strerror or error}") from None


def data_path(path: str | os.PathLike) -> Path:
    """The output's own data file: ``<path>.data``."""
    path = Path(path)
    return path.with_name(path.name + ".data")


def own_names(path: str | os.PathLike) -> list[Path]:
    """The files beside ``path`` that belong to it as an output (its data file and the hard
    links of ``--data link``: ``<path>.linked.data``, ``<path>.linked-<n>.data``) and exist:
    replaced or removed when ``path`` is written again."""
    path = Path(path)
    links = path.parent.glob(glob.escape(path.name) + ".linked*.data")
    return [p for p in [data_path(path), *sorted(links)] if os.path.lexists(p)]


def check_data(
    model: onnx.ModelProto,
    output: str | os.PathLike,
    data: str,
    source: str | os.PathLike | None,
    extra: Iterable[TensorProto] = (),
) -> None:
    """Refuses, in one line and before any work, to write ``output`` for the model read from
    ``source`` where the write would replace or remove a file the input reads (the output's
    data file or links named as one of them), or where the ``data`` mode cannot do it:
    ``reference`` where a data file of the input lies outside the output's folder (a model
    reads external data only from its folder and below); ``link`` and ``reflink`` where it
    lies on another file system than the output's folder (a hard link or a clone cannot cross
    file systems), ``reflink`` where that file system cannot clone. ``copy`` always can."""
    if data not in DATA_MODES:
        raise OnnxNormError(f"--data {data}: choose one of {', '.join(DATA_MODES)}")
    output = Path(output)
    extra = list(extra)
    if source is not None:
        _check_not_read(output, model, extra, source, model_dir(source))
    if data == "copy" or source is None:
        return
    folder = model_dir(output)
    files = _data_files(model, extra, source).values()
    for file in files:
        if data == "reference":
            reference_location(file, folder, output)
        elif os.stat(file).st_dev != os.stat(folder).st_dev:
            what = "hard link" if data == "link" else "clone"
            raise OnnxNormError(
                f"cannot write {output} with --data {data}: the input's data file {file} is on "
                f"another file system than {folder}, and a {what} cannot cross file systems; "
                "write the output on the input's file system, or use --data copy"
            )
    if data == "reflink" and files and (problem := clone_problem(output)):
        raise OnnxNormError(
            f"cannot write {output} with --data reflink: the file system of {folder} cannot "
            f"clone files ({problem}); use --data copy, link or reference"
        )


def _data_files(
    model: onnx.ModelProto, extra: list[TensorProto], source: str | os.PathLike
) -> dict[Path, Path]:
    """The input's external data files (the model file itself, which holds its inline weights,
    left out) that the model's tensors (subgraphs' and attributes' included) and ``extra``
    read: each resolved, and as the input names it (its folder joined with the location)."""
    folder, own = model_dir(source), Path(os.path.realpath(source))
    files: dict[Path, Path] = {}
    for tensor in itertools.chain(external_tensors(model), extra):
        if uses_external_data(tensor):
            file = folder / external_location(tensor)[0]
            resolved = Path(os.path.realpath(file))
            if resolved != own:
                files.setdefault(resolved, file)
    return files


def _check_not_read(
    path: Path,
    model: onnx.ModelProto,
    extra: list[TensorProto],
    source: str | os.PathLike | None,
    source_dir: Path,
) -> None:
    """Refuses an output whose own files (the model, its data file, its links: each replaced or
    removed by the write) would be one of the files the input reads."""
    reads = {Path(os.path.realpath(source))} if source else set()
    for tensor in itertools.chain(
        external_tensors(model), (t for t in extra if uses_external_data(t))
    ):
        reads.add(Path(os.path.realpath(source_dir / external_location(tensor)[0])))
    for name in (
        path,
        data_path(path),
        path.with_name(path.name + ".linked.data"),
        *own_names(path),
    ):
        if Path(os.path.realpath(name)) in reads:
            raise OnnxNormError(
                f"cannot write {path}: {name} is a file the input reads; the input is never "
                "modified, choose another output"
            )


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
    """One call of :func:`write_model`: the model and ``extra`` tensors written to ``path``, the
    external tensors read from ``source_dir``, under temporary names from ``temps``."""

    model: onnx.ModelProto
    extra: list[TensorProto]
    path: Path
    source_dir: Path
    temps: TempFiles
    data: str = "copy"
    source: str | os.PathLike | None = None
    started: CopyInBackground | None = None

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
            main = weightless_shell(model)
            nested = list(external_tensors(main))  # of subgraphs and attributes
            if referenced or nested:
                for tensor in nested:
                    _load_into(tensor, self.source_dir)
                main.graph.initializer.extend(
                    t for t in model.graph.initializer if not uses_external_data(t)
                )
                f.write(main.SerializeToString())
            else:
                f.write(model.SerializeToString())
            del main
            for tensor in itertools.chain(referenced, self.extra):
                if uses_external_data(tensor):
                    write_referenced(f, tensor, self.source_dir)
                else:
                    patch = onnx.ModelProto()
                    patch.graph.initializer.add().CopyFrom(tensor)
                    f.write(patch.SerializeToString())
                    del patch
        _put_in_place(self.path, tmp, {}, self.temps, companions=False)

    def with_data_file(self) -> Written:
        """Writes the model and its data file ``<path>.data`` (in ``link`` and ``reference``
        modes: of the new tensors alone, where there are any; with the hard links beside it
        in ``link``), each under a temporary name, and puts them in place."""
        written = Written(self.path, self.data)
        own = data_path(self.path)
        out = weightless_shell(self.model)
        tensors = list(itertools.chain(self.model.graph.initializer, self.extra))
        # the external tensors of subgraphs and attributes, in ``out`` itself: written like the
        # main graph's, each updated where it lies
        nested = list(external_tensors(out))
        placed: dict[Path, str] = {}
        started = self._started(tensors + nested)
        if started is not None:
            fd, tmp_data = started
        else:
            fd, tmp_data = self.temps.new(".data.tmp")
        with os.fdopen(fd, "wb") as data:
            if self.data in ("link", "reference"):
                kept = self._kept(written, placed)
                # ONNX Runtime refuses a subgraph's tensor in a file of several hard links
                # (onnx's checker: "a potential hardlink attack"): in link mode those are copied
                linked = self.data == "link"
                _write_data(tensors, self.source_dir, data, own.name, out, kept=kept)
                _write_data([], self.source_dir, data, own.name, out, nested,
                            kept={} if linked else kept)  # fmt: skip
            elif started is not None:
                assert self.started is not None
                ((file, used),) = _ranges(tensors + nested, self.source_dir).items()
                finish_start(data, used, self.started.size)
                written.base, written.how = file, self.started.how
                _write_data(tensors, self.source_dir, data, own.name, out, nested, base=file)
            else:
                base = _base_data(tensors + nested, self.source_dir, data, self.data == "reflink")
                if base is not None:
                    written.base, written.how = base
                _write_data(
                    tensors, self.source_dir, data, own.name, out, nested, base=written.base
                )
            if data.tell() or self.data not in ("link", "reference"):
                placed[own] = tmp_data
                written.own_data = own
        fd, tmp_model = self.temps.new(".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(out.SerializeToString())
        _put_in_place(self.path, tmp_model, placed, self.temps)
        return written

    def _started(self, tensors: list[TensorProto]) -> tuple[int, str] | None:
        """The descriptor and temporary name of the data file that ``data_started`` began,
        where the external ``tensors`` all lie in the file it copied and it ended (its error
        raised); None where there is none or it is of no use (then it is stopped)."""
        started = self.started
        if started is None or self.data != "copy":
            return None
        ranges = _ranges(tensors, self.source_dir)
        if set(ranges) != {started.file}:
            started.cancel()
            return None
        if not started.result():
            return None
        self.temps.names.append(started.name)
        return started.take(), started.name

    def _kept(self, written: Written, placed: dict[Path, str]) -> dict[Path, str]:
        """The input's data files that the output reads, kept as they are (link, reference):
        each (resolved) and the location the output names it by, a hard link made for each
        under a temporary name in ``link`` (put in ``placed``, recorded in ``written``)."""
        assert self.source is not None  # write_model refuses link and reference without it
        files = _data_files(self.model, self.extra, self.source)
        kept: dict[Path, str] = {}
        folder = model_dir(self.path)
        for index, (resolved, file) in enumerate(sorted(files.items()), 1):
            if self.data == "reference":
                kept[resolved] = reference_location(file, folder, self.path)
                written.referenced[kept[resolved]] = file
                continue
            suffix = ".linked.data" if len(files) == 1 else f".linked-{index}.data"
            link = self.path.with_name(self.path.name + suffix)
            try:
                placed[link] = self.temps.link(resolved)
            except OSError as error:
                raise OnnxNormError(
                    f"cannot write {self.path} with --data link: cannot hard-link {file} "
                    f"into {folder} ({error.strerror or error}); use --data copy"
                ) from None
            kept[resolved] = link.name
            written.links[link] = file
        return kept


def _write_data(
    tensors: list[TensorProto],
    source_dir: Path,
    data,
    data_name: str,
    out: onnx.ModelProto,
    nested: Iterable[TensorProto] = (),
    *,
    base: Path | None = None,
    kept: dict[Path, str] | None = None,
) -> None:
    """Writes the data of ``tensors`` to ``data`` (the file to be named ``data_name``) and adds
    each to ``out``'s main graph: a reference into ``data_name`` for the external ones and those
    of EXTERNAL_THRESHOLD bytes or more, the tensor itself for the rest. The tensors that lie in
    ``base`` (the file ``data`` started as: ``_base_data``) keep their offsets in ``data``;
    those that lie in a file of ``kept`` (resolved) are not written: they keep their place in
    it, which the output names by ``kept``'s location. ``nested``: external tensors of
    ``out``'s subgraphs and attributes, written the same way and updated where they lie."""
    kept = kept or {}
    offset = data.tell()
    pairs = [(out.graph.initializer.add(), theirs) for theirs in tensors]
    for tensor in nested:
        theirs = TensorProto()
        theirs.CopyFrom(tensor)
        tensor.Clear()
        pairs.append((tensor, theirs))
    for mine, theirs in pairs:
        if uses_external_data(theirs):
            location, start, length = external_location(theirs)
            file = source_dir / location
            resolved = Path(os.path.realpath(file))
            if resolved == base or resolved in kept:
                if length is None:
                    length = os.path.getsize(file) - start
                _refer(mine, theirs, kept.get(resolved, data_name), start, length)
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


def _load_into(tensor: TensorProto, source_dir: Path) -> None:
    """Makes the external ``tensor`` hold its own bytes (read from ``source_dir``)."""
    location, start, length = external_location(tensor)
    with open(source_dir / location, "rb") as f:
        f.seek(start)
        tensor.raw_data = f.read() if length is None else f.read(length)
    del tensor.external_data[:]
    tensor.data_location = TensorProto.DEFAULT


def _refer(mine: TensorProto, theirs: TensorProto, location: str, offset: int, length: int):
    """Makes ``mine`` the tensor ``theirs`` with its data at ``offset`` of ``location``."""
    mine.CopyFrom(tensor_header(theirs))
    set_external_location(mine, location, offset, length)


def _ranges(tensors: Iterable[TensorProto], source_dir: Path) -> dict[Path, list[tuple[int, int]]]:
    """The byte ranges that the external ``tensors`` take, per file (resolved)."""
    ranges: dict[Path, list[tuple[int, int]]] = {}
    for tensor in tensors:
        if uses_external_data(tensor):
            location, start, length = external_location(tensor)
            file = Path(os.path.realpath(source_dir / location))
            if length is None:
                length = os.path.getsize(file) - start
            ranges.setdefault(file, []).append((start, start + length))
    return ranges


def _base_data(
    tensors: list[TensorProto], source_dir: Path, data, clone_only: bool = False
) -> tuple[Path, str] | None:
    """Starts the output's data file (``data``, empty) as the one file that the external
    ``tensors`` lie in, so that they keep their offsets (``filesystem.start_as``: shared or
    copied, the ranges no tensor uses released). Returns the file (resolved) and how it was
    started ("cloned" or "copied"), or None where the tensors lie in several files or fill too
    little of one: they are then copied one by one. ``clone_only``: shared or refused
    (``CannotClone``), never copied."""
    ranges = _ranges(tensors, source_dir)
    if len(ranges) > 1 and clone_only:
        raise OnnxNormError(
            f"--data reflink: the input's weights lie in {len(ranges)} files, and a clone "
            "shares one whole file; use --data copy, link or reference"
        )
    if len(ranges) != 1:
        return None
    ((file, used),) = ranges.items()
    how = start_as(data, file, used, clone_only=clone_only)
    return (file, how) if how else None


@contextlib.contextmanager
def data_started(
    model: onnx.ModelProto,
    output: str | os.PathLike,
    data: str,
    source: str | os.PathLike | None,
) -> Iterator[CopyInBackground | None]:
    """For ``data="copy"``, where the external tensors of ``model`` (read from ``source``) lie
    in one data file and fill most of it: the output's data file started as a copy of it on a
    thread, under a temporary name beside ``output``, while the caller runs the pass; hand it to
    :func:`write_model` (``started=``), which waits for it and writes after it. The copy then
    takes no time of its own where the pass takes longer, and never more than the pass where it
    is on another core; a clone (where the file system can) takes none anyway. Yields None where
    there is nothing to start; the copy is stopped and removed at the end unless it was
    written."""
    if data != "copy" or source is None:
        yield None
        return
    folder = model_dir(source)
    ranges = _ranges(external_tensors(model), folder)
    files = _data_files(model, [], source)
    if len(ranges) != 1 or set(ranges) != set(files):
        yield None
        return
    ((file, used),) = ranges.items()
    if not worth_copying_whole(os.path.getsize(file), used):
        yield None
        return
    output = Path(output)
    with TempFiles(output) as temps:
        started = CopyInBackground(file, temps)
        try:
            yield started
        finally:
            started.close()


def _put_in_place(
    path: Path,
    tmp_model: str,
    placed: dict[Path, str],
    temps: TempFiles,
    *,
    companions: bool = True,
) -> None:
    """Renames the written files (``placed``: each final path and its temporary name), then the
    model, into place. The old model and (``companions``) its own files (``own_names``) step
    aside first, so that each new file is renamed to a name no file has (see
    ``TempFiles.move_aside``): a run killed before the new model is in place leaves no model,
    never the old model beside the new data; a failed rename puts the old files back."""
    old = [path] if os.path.lexists(path) else []
    if companions:
        old += own_names(path)
    aside: dict[Path, str] = {}
    done: list[Path] = []
    try:
        for file in old:
            aside[file] = temps.move_aside(file)
        for final, tmp in placed.items():
            os.replace(tmp, final)
            done.append(final)
        os.replace(tmp_model, path)
    except OSError:
        for final in done:
            os.unlink(final)
        for file, name in aside.items():
            os.rename(name, file)
        raise
