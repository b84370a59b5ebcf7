"""Reading and writing model files with one-line errors and atomic writes.

Large models. ``load_model(path, load_weights=False)`` leaves tensors stored as external data
where they are (only those under 1 KiB, which rules read as constants, are loaded).
``save_model`` writes a model whose external tensors still point into the input's data file by
copying them, one at a time, into the output's own data file; a model over 2 GB, or one that
came with external data, is written with external data (``<output>.data``). Files are written
under temporary names in the output folder and renamed into place (data first, the model
last), so no half-written file ever carries the output's name; a run killed while writing
leaves only its temporary files (``.<output>.<pid>.*.tmp``), which the next write of the same
output removes.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto, external_data_helper

from onnxnorm.errors import OnnxNormError, first_line as _first_line

#: Protobuf cannot serialize a message over 2 GiB.
_PROTOBUF_LIMIT = 2**31 - 1
#: tensors at least this large go to the data file when a model is written with external data
EXTERNAL_THRESHOLD = 1024
#: tensors this small are loaded even when external: rules read them (epsilon, axes, exponents)
SMALL_TENSOR = 1024
_CHUNK = 1 << 24


def external_tensors(model: onnx.ModelProto) -> Iterable[TensorProto]:
    return (
        t
        for t in external_data_helper._get_all_tensors(model)
        if external_data_helper.uses_external_data(t)
    )


def _nbytes(tensor: TensorProto) -> int:
    for entry in tensor.external_data:
        if entry.key == "length":
            return int(entry.value)
    return 1 << 62


def _varint(buf, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(buf, start: int, end: int):
    """(field number, wire type, field start, payload start, payload end) of each field of the
    protobuf message in ``buf[start:end]``."""
    pos = start
    while pos < end:
        field_start = pos
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, payload_end = _varint(buf, pos)
        elif wire == 1:
            payload_end = pos + 8
        elif wire == 2:
            length, pos = _varint(buf, pos)
            payload_end = pos + length
        elif wire == 5:
            payload_end = pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if payload_end > end:
            raise ValueError("truncated protobuf message")
        yield number, wire, field_start, pos, payload_end
        pos = payload_end


# field numbers of onnx.proto3
_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_RAW_DATA = 7, 5, 9


def load_weights_as_references(path: Path) -> onnx.ModelProto:
    """Parses ``path`` without copying the raw data of its initializers: each initializer's
    raw data of 1 KiB or more becomes an external-data reference into ``path`` itself (its
    offset in the file), so that the weights are read from disk only when written out."""
    import mmap

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        rest, graph_rest = bytearray(), bytearray()
        tensors = []
        for number, wire, field_start, start, end in _fields(buf, 0, len(buf)):
            if number != _MODEL_GRAPH or wire != 2:
                rest += buf[field_start:end]
                continue
            for g_number, g_wire, g_field, g_start, g_end in _fields(buf, start, end):
                if g_number != _GRAPH_INITIALIZER or g_wire != 2:
                    graph_rest += buf[g_field:g_end]
                    continue
                meta, reference = bytearray(), None
                for t_number, t_wire, t_field, t_start, t_end in _fields(buf, g_start, g_end):
                    if (
                        t_number == _TENSOR_RAW_DATA
                        and t_wire == 2
                        and t_end - t_start >= SMALL_TENSOR
                    ):
                        reference = (t_start, t_end - t_start)
                    else:
                        meta += buf[t_field:t_end]
                tensor = TensorProto.FromString(bytes(meta))
                if reference is not None:
                    tensor.data_location = TensorProto.EXTERNAL
                    for key, value in (
                        ("location", path.name),
                        ("offset", str(reference[0])),
                        ("length", str(reference[1])),
                    ):
                        entry = tensor.external_data.add()
                        entry.key, entry.value = key, value
                tensors.append(tensor)
    model = onnx.ModelProto.FromString(bytes(rest))
    model.graph.ParseFromString(bytes(graph_rest))
    model.graph.initializer.extend(tensors)
    return model


def model_dir(path: str | os.PathLike) -> Path:
    """The folder a model file's external data is read from: the folder holding the path as
    given, not the target of a symbolic link (as onnx and ONNX Runtime read it). A Hugging Face
    cache snapshot links model.onnx and its data file into the repository's blobs folder, where
    the data file's name is not."""
    return Path(path).absolute().parent


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


def external_files(model: onnx.ModelProto, folder: str | os.PathLike) -> set[Path]:
    """The resolved paths of the external data files ``model`` (read from ``folder``) names."""
    files = set()
    for tensor in external_tensors(model):
        for entry in tensor.external_data:
            if entry.key == "location":
                files.add((Path(folder) / entry.value).resolve())
    return files


def copy_rest(source: Path, work: Path, skip: set[Path]) -> None:
    """Copies every file and folder below ``source`` into ``work`` but those whose resolved
    path is in ``skip`` and those ``work`` already holds."""
    import shutil

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
    import shutil

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


def load_model(path: str | os.PathLike, load_weights: bool = True) -> onnx.ModelProto:
    """Reads a model. With ``load_weights=False`` no weight is read into memory: tensors in
    external data stay there, and the raw data of initializers inside the file becomes an
    external-data reference into the file itself (see :func:`has_external_data` and
    :func:`save_model` with ``source=path``, which resolves them)."""
    path = check_input(path)
    try:
        if load_weights or path.stat().st_size == 0:
            model = onnx.load(path, load_external_data=False)
        else:
            model = load_weights_as_references(path)
    except (DecodeError, RuntimeError, ValueError, OSError, IndexError) as error:
        raise OnnxNormError(f"{path}: not a readable ONNX model ({_first_line(error)})") from None
    if not model.ir_version or not model.HasField("graph"):
        raise OnnxNormError(f"{path}: not an ONNX model (no IR version or graph)")
    from onnxnorm._validate import ModelProblem, check_external_data, check_model

    try:  # before any external data is read
        check_external_data(model, path.parent, own=path)
        check_model(model, path.parent)  # its repairs are the fuse pipeline's to make
    except ModelProblem as problem:
        raise OnnxNormError(f"{path}: {problem}") from None
    try:
        for tensor in list(external_tensors(model)):
            if load_weights or _nbytes(tensor) < SMALL_TENSOR:
                _read_external(tensor, path.parent)
                tensor.data_location = TensorProto.DEFAULT
                del tensor.external_data[:]
    except (OSError, ValueError) as error:
        raise OnnxNormError(
            f"{path}: cannot read its external data ({_first_line(error)})"
        ) from None
    return model


def has_external_data(model: onnx.ModelProto, source: str | os.PathLike | None = None) -> bool:
    """Whether ``model`` has tensors in external data files (references into ``source`` itself,
    which :func:`load_model` makes for inline weights, do not count)."""
    own = Path(source).name if source else None
    return any(external_location(t)[0] != own for t in external_tensors(model))


def _read_external(tensor: TensorProto, folder: Path) -> None:
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


def external_location(tensor: TensorProto) -> tuple[str, int, int | None]:
    info = {e.key: e.value for e in tensor.external_data}
    return (
        info["location"],
        int(info.get("offset", 0)),
        (int(info["length"]) if "length" in info else None),
    )


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
    folder = path.parent
    source = source or like
    source_dir = model_dir(source) if source else folder.resolve()
    if external is None:
        external = (
            has_external_data(model, source)
            or any(external_data_helper.uses_external_data(t) for t in extra)
            or _size(model, extra) > _PROTOBUF_LIMIT
        )
    temps: list[str] = []
    _remove_stale_temps(folder, path.name)

    def temp(suffix: str) -> tuple[int, str]:
        # named after this process, so that a later run can tell it was killed
        fd, name = tempfile.mkstemp(
            prefix=f".{path.name}.{os.getpid()}.", suffix=suffix, dir=folder
        )
        temps.append(name)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(name, 0o666 & ~umask)
        return fd, name

    try:
        if not external:
            if _size(model, extra) > _PROTOBUF_LIMIT:
                raise OnnxNormError(f"cannot write {path}: over 2 GB without external data")
            fd, tmp = temp(".tmp")
            referenced = [
                t for t in model.graph.initializer if external_data_helper.uses_external_data(t)
            ]
            with os.fdopen(fd, "wb") as f:
                if referenced:
                    main = weightless_shell(model)
                    main.graph.initializer.extend(
                        t
                        for t in model.graph.initializer
                        if not external_data_helper.uses_external_data(t)
                    )
                    f.write(main.SerializeToString())
                    del main
                else:
                    f.write(model.SerializeToString())
                # protobuf merges repeated occurrences of the graph field: each patch below
                # appends one initializer to the graph, so one tensor at a time is in memory
                for tensor in itertools.chain(referenced, extra):
                    if external_data_helper.uses_external_data(tensor):
                        _write_referenced(f, tensor, source_dir)
                    else:
                        patch = onnx.ModelProto()
                        patch.graph.initializer.add().CopyFrom(tensor)
                        f.write(patch.SerializeToString())
                        del patch
            os.replace(tmp, path)
            return path
        data_name = path.name + ".data"
        fd, tmp_data = temp(".data.tmp")
        out = weightless_shell(model)
        tensors = list(itertools.chain(model.graph.initializer, extra))
        with os.fdopen(fd, "wb") as data:
            # the unchanged tensors' data file shared (or copied) whole: they keep their offsets
            base = _base_data(tensors, source_dir, data)
            offset = data.tell()
            for theirs in tensors:
                mine = out.graph.initializer.add()
                if external_data_helper.uses_external_data(theirs):
                    location, start, length = external_location(theirs)
                    file = source_dir / location
                    if base is not None and file.resolve() == base:
                        if length is None:
                            length = os.path.getsize(file) - start
                        _set_external(mine, theirs, data_name, start, length)
                        continue
                    written = _copy_range(file, start, length, data)
                elif theirs.HasField("raw_data") and theirs.ByteSize() >= EXTERNAL_THRESHOLD:
                    data.write(theirs.raw_data)
                    written = data.tell() - offset
                else:
                    mine.CopyFrom(theirs)
                    continue
                _set_external(mine, theirs, data_name, offset, written)
                offset += written
                pad = -offset % (_BLOCK if written >= _BLOCK else 64)  # for mmap and clones
                data.write(b"\0" * pad)
                offset += pad
        fd, tmp_model = temp(".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(out.SerializeToString())
        aside = None
        if path.exists():
            # the old model steps aside first: a run killed before the new model is in place
            # leaves no model, never the old model beside the new data; a failed rename puts
            # it back
            fd, aside = temp(".old.tmp")
            os.close(fd)
            os.replace(path, aside)
        try:
            os.replace(tmp_data, folder / data_name)
        except OSError:
            if aside is not None:
                os.replace(aside, path)
            raise
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


_BLOCK = 4096
#: ioctl numbers (Linux): FICLONE shares all of a file's extents with another file, copy on
#: write (btrfs, XFS, bcachefs, OCFS2, ZFS with block cloning)
_FICLONE = 0x40049409
#: the whole data file is copied, where it cannot be shared, when the tensors use this much of it
_WHOLE_FILE_COPY = 0.9


def _set_external(
    mine: TensorProto, theirs: TensorProto, location: str, offset: int, length: int
) -> None:
    mine.name, mine.data_type = theirs.name, theirs.data_type
    mine.dims.extend(theirs.dims)
    if theirs.doc_string:
        mine.doc_string = theirs.doc_string
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = mine.external_data.add()
        entry.key, entry.value = key, value
    mine.data_location = TensorProto.EXTERNAL


def _base_data(tensors: list[TensorProto], source_dir: Path, data) -> Path | None:
    """Starts the output's data file (``data``, empty) as the one file that the external
    ``tensors`` lie in, so that they keep their offsets: shared where the file system can
    (FICLONE: the two files share extents, copy on write, so writing one never changes the
    other; never a hard link), else copied in the kernel when the tensors fill most of the
    file. Ranges no tensor uses are then released (holes). Returns the file (resolved), or
    None where the tensors lie in several files or fill too little of one: they are then copied
    one by one."""
    import fcntl

    ranges: dict[Path, list[tuple[int, int]]] = {}
    for tensor in tensors:
        if external_data_helper.uses_external_data(tensor):
            location, start, length = external_location(tensor)
            file = (source_dir / location).resolve()
            if length is None:
                length = os.path.getsize(file) - start
            ranges.setdefault(file, []).append((start, start + length))
    if len(ranges) != 1:
        return None
    ((file, used),) = ranges.items()
    size = os.path.getsize(file)
    with open(file, "rb") as f:
        data.flush()
        try:
            fcntl.ioctl(data.fileno(), _FICLONE, f.fileno())
        except OSError:
            filled = sum(b - a for a, b in _merged(used))
            if size == 0 or filled < _WHOLE_FILE_COPY * size:
                return None
            data.seek(0)
            data.truncate()
            if _copy_range(file, 0, size, data) != size:
                raise OSError(f"{file} changed while it was copied") from None
    data.seek(0, os.SEEK_END)
    _release_unused(data, _merged(used), size)
    data.write(b"\0" * (-size % _BLOCK))
    return file


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _release_unused(data, used: list[tuple[int, int]], size: int) -> None:
    """Punches holes where no tensor lies, where the file system can: whole blocks are
    released, the rest of a block is zeroed."""
    import ctypes
    import ctypes.util

    try:
        fallocate = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).fallocate
    except (OSError, AttributeError):
        return
    fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    punch = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
    edges = [0] + [x for r in used for x in r] + [size]
    for start, end in zip(edges[0::2], edges[1::2]):
        if end > start and fallocate(data.fileno(), punch, start, end - start) != 0:
            return  # not supported here: the bytes stay


def _remove_stale_temps(folder: Path, name: str) -> None:
    """Removes the temporary files that a killed run writing ``name`` left in ``folder`` (those
    named after a process that no longer exists); a run still writing keeps its own."""
    prefix = f".{name}."
    for entry in os.scandir(folder):
        if not (entry.name.startswith(prefix) and entry.name.endswith(".tmp")):
            continue
        pid = entry.name[len(prefix) :].split(".", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
        except PermissionError:  # another user's live process
            pass


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _write_referenced(f, tensor: TensorProto, source_dir: Path) -> None:
    """Appends ``tensor`` to the model being written to ``f`` as one more graph initializer
    with its raw data streamed from its external-data reference: a ModelProto holding a
    GraphProto holding the TensorProto, length prefixes computed, the data copied in chunks."""
    location, start, length = external_location(tensor)
    if length is None:
        length = os.path.getsize(source_dir / location) - start
    meta = TensorProto()
    meta.name, meta.data_type = tensor.name, tensor.data_type
    meta.dims.extend(tensor.dims)
    if tensor.doc_string:
        meta.doc_string = tensor.doc_string
    raw_header = bytes([_TENSOR_RAW_DATA << 3 | 2]) + _encode_varint(length)
    tensor_head = meta.SerializeToString() + raw_header
    tensor_len = len(tensor_head) + length
    tensor_field = bytes([_GRAPH_INITIALIZER << 3 | 2]) + _encode_varint(tensor_len)
    graph_len = len(tensor_field) + tensor_len
    f.write(bytes([_MODEL_GRAPH << 3 | 2]) + _encode_varint(graph_len) + tensor_field + tensor_head)
    if _copy_range(source_dir / location, start, length, f) != length:
        raise OSError(f"{location} ends before the tensor data it should hold")


def _size(model: onnx.ModelProto, extra: list[TensorProto]) -> int:
    """The size of the model written inline: referenced tensors counted at their length."""
    total = model.ByteSize() + sum(t.ByteSize() + 8 for t in extra)
    for tensor in itertools.chain(
        external_tensors(model), (t for t in extra if external_data_helper.uses_external_data(t))
    ):
        total += _nbytes(tensor)
    return total


def weightless_shell(model: onnx.ModelProto) -> onnx.ModelProto:
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
    """Copies ``length`` bytes at ``start`` of ``file`` to the end of ``out``: in the kernel
    (copy_file_range) where the system can, else in chunks through this process."""
    with open(file, "rb") as f:
        remaining = length if length is not None else os.path.getsize(file) - start
        total = 0
        if hasattr(os, "copy_file_range"):
            out.flush()
            try:
                while remaining > 0:
                    done = os.copy_file_range(
                        f.fileno(), out.fileno(), min(remaining, 1 << 30), start + total
                    )
                    if done == 0:
                        raise OSError(f"{file} ends before the tensor data it should hold")
                    remaining -= done
                    total += done
                out.seek(0, os.SEEK_END)
                return total
            except OSError as error:
                if total or error.errno not in (18, 22, 38, 95, 1):  # EXDEV EINVAL ENOSYS ...
                    raise
        f.seek(start)
        while remaining > 0:
            chunk = f.read(min(_CHUNK, remaining))
            if not chunk:
                raise OSError(f"{file} ends before the tensor data it should hold")
            out.write(chunk)
            remaining -= len(chunk)
            total += len(chunk)
    return total
