"""File-system work for writing large files: copies made in the kernel, data files shared with
their source where the file system can, unused ranges released, and temporary files that a
killed run leaves behind removed by the next.

Linux calls are used where they exist (FICLONE, ``copy_file_range``, ``fallocate``); elsewhere,
or where a file system refuses them, the bytes go through this process.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import tempfile
import threading
from pathlib import Path

#: the block that large tensors are aligned to in a data file (for mmap and clones)
BLOCK = 4096
#: ioctl numbers (Linux): FICLONE shares all of a file's extents with another file, copy on
#: write (btrfs, XFS, bcachefs, OCFS2, ZFS with block cloning)
FICLONE = 0x40049409
#: the whole data file is copied, where it cannot be shared, when the tensors use this much of it
_WHOLE_FILE_COPY = 0.9
_CHUNK = 1 << 24
#: a copy on a thread goes in chunks this large, so that a cancel stops it within one
_THREAD_CHUNK = 1 << 26
#: copy_file_range's errors that mean "not here": the bytes then go through this process
_NO_KERNEL_COPY = (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM)

#: how a written model gets the unchanged tensors of the input's external data
#: (``onnxnorm._io.save_model(data=...)``, ``onnxnorm fuse --data``):
#: ``copy``: a data file of its own, which starts as a clone of the input's where the file
#: system shares extents (copy on write: XFS, btrfs), else as a copy made by the kernel;
#: ``reflink``: the same, refused where the file system cannot clone (nothing is copied);
#: ``link``: a hard link to the input's data file beside the output (the same file under two
#: names), the new tensors in a data file of their own;
#: ``reference``: the output names the input's data file where it is (the output's folder
#: must hold it), the new tensors in a data file of their own.
DATA_MODES = ("copy", "reflink", "link", "reference")


def copy_range(file: Path, start: int, length: int | None, out) -> int:
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


def start_as(out, file: Path, used: list[tuple[int, int]], *, clone_only: bool = False) -> str:
    """Starts ``out`` (an empty file open for writing) as a copy of ``file``, of which only the
    byte ranges ``used`` matter: shared where the file system can (FICLONE: the two files share
    extents, copy on write, so writing one never changes the other; never a hard link), else
    copied in the kernel when the ranges fill most of the file. Ranges not used are then
    released (holes) and ``out`` is padded to a whole block, its position at the end
    (:func:`finish_start`). Returns how: ``"cloned"`` or ``"copied"``; ``""``, with ``out``
    left empty, where it is neither shared nor worth copying whole. ``clone_only``: a file
    system that cannot share the file raises :class:`CannotClone` instead of copying it.

    ``out`` is never truncated: on ext4, truncating a file to size 0 marks it to be flushed to
    the disk when it is closed (the auto_da_alloc heuristic, for programs that rewrite a file in
    place without fsync), which made closing a 2.5 GB copy take most of a second."""
    import fcntl

    size = os.path.getsize(file)
    with open(file, "rb") as f:
        out.flush()
        if os.fstat(out.fileno()).st_size:
            raise ValueError("start_as needs an empty file")
        try:
            fcntl.ioctl(out.fileno(), FICLONE, f.fileno())
            how = "cloned"
        except OSError as error:
            if clone_only:
                raise CannotClone(file, error) from None
            if not worth_copying_whole(size, used):
                return ""
            if copy_range(file, 0, size, out) != size:
                raise OSError(f"{file} changed while it was copied") from None
            how = "copied"
    finish_start(out, used, size)
    return how


def worth_copying_whole(size: int, used: list[tuple[int, int]]) -> bool:
    """Whether the byte ranges ``used`` fill enough of a file of ``size`` bytes that it is
    copied whole (then holes punched) rather than range by range."""
    return size > 0 and sum(b - a for a, b in _merged(used)) >= _WHOLE_FILE_COPY * size


def finish_start(out, used: list[tuple[int, int]], size: int) -> None:
    """Ends the start of ``out`` as a copy of a file of ``size`` bytes: the ranges not
    ``used`` released (holes), ``out`` padded to a whole block, its position at the end."""
    out.seek(0, os.SEEK_END)
    _release_unused(out, _merged(used), size)
    out.write(b"\0" * (-size % BLOCK))


class CopyInBackground:
    """A data file started as a copy of ``file`` on a thread, while this one goes on (the pass):
    a new temporary file from ``temps``, cloned where the file system can, else copied by the
    kernel (``copy_file_range``, which leaves the interpreter free) in chunks, between which
    :meth:`cancel` stops it. :meth:`result` waits for it; :meth:`take` hands its descriptor
    over (the caller then writes after the copy and closes it); :meth:`close` stops and closes
    what was not taken (``temps`` removes the file)."""

    def __init__(self, file: Path, temps: TempFiles):
        self.file = file
        self.fd, self.name = temps.new(".data.tmp")
        self.how = ""
        self.size = 0
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="onnxnorm-copy", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import fcntl

        try:
            with open(self.file, "rb") as f:
                self.size = os.fstat(f.fileno()).st_size
                try:
                    fcntl.ioctl(self.fd, FICLONE, f.fileno())
                    self.how = "cloned"
                    return
                except OSError:
                    pass
                done, kernel = 0, hasattr(os, "copy_file_range")
                while done < self.size and not self._stop.is_set():
                    n = min(_THREAD_CHUNK, self.size - done)
                    if kernel:
                        try:
                            n = os.copy_file_range(f.fileno(), self.fd, n, done, done)
                        except OSError as error:
                            if done or error.errno not in _NO_KERNEL_COPY:
                                raise
                            kernel = False
                            continue
                    else:
                        n = os.pwrite(self.fd, os.pread(f.fileno(), n, done), done)
                    if n == 0:
                        raise OSError(f"{self.file} ends before its size while it is copied")
                    done += n
                self.how = "copied" if done == self.size else ""
        except BaseException as error:  # noqa: BLE001 - raised again by result()
            self._error = error

    def result(self) -> str:
        """How the copy ended: ``"cloned"``, ``"copied"``, or ``""`` where it was cancelled;
        its error raised again."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self.how

    def take(self) -> int:
        """The file's descriptor, now the caller's to write and close."""
        fd, self.fd = self.fd, -1
        return fd

    def cancel(self) -> None:
        self._stop.set()
        self._thread.join()

    def close(self) -> None:
        self.cancel()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class CannotClone(OSError):
    """The file system refused to share ``file``'s extents with a new file (FICLONE)."""

    def __init__(self, file: Path, error: OSError):
        super().__init__(error.errno, error.strerror)
        self.file = file


def clone_problem(path: Path) -> str | None:
    """Why the file system of ``path``'s folder cannot clone a file (FICLONE between two empty
    temporary files beside ``path``, removed at once), None where it can."""
    import fcntl

    with TempFiles(path) as temps:
        fd_a, _ = temps.new(".probe.tmp")
        fd_b, _ = temps.new(".probe.tmp")
        try:
            fcntl.ioctl(fd_b, FICLONE, fd_a)
        except OSError as error:
            return error.strerror or str(error)
        finally:
            os.close(fd_a)
            os.close(fd_b)
    return None


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


class TempFiles:
    """Temporary files beside ``path``, named after it and this process
    (``.<name>.<pid>.*.tmp``), so that a later run can tell that they are a killed run's
    (:func:`remove_stale_temps`); those still there when the ``with`` block ends are removed."""

    def __init__(self, path: Path):
        self.path = path
        self.names: list[str] = []

    def new(self, suffix: str) -> tuple[int, str]:
        """A new temporary file (its descriptor and name) with the permissions a new file gets."""
        fd, name = tempfile.mkstemp(
            prefix=f".{self.path.name}.{os.getpid()}.", suffix=suffix, dir=self.path.parent
        )
        self.names.append(name)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(name, 0o666 & ~umask)
        return fd, name

    def free_name(self, suffix: str) -> str:
        """A temporary name that no file has yet, for a hard link or a file moved aside (both
        must replace no file: see :meth:`move_aside`)."""
        while True:
            name = os.path.join(
                self.path.parent, f".{self.path.name}.{os.getpid()}.{secrets.token_hex(6)}{suffix}"
            )
            if not os.path.lexists(name):
                self.names.append(name)
                return name

    def link(self, file: Path) -> str:
        """A hard link to ``file`` (the file a symbolic link leads to) under a temporary name;
        OSError where the file system refuses it (EXDEV: another file system)."""
        while True:
            name = self.free_name(".link.tmp")
            try:
                os.link(file, name)
                return name
            except FileExistsError:
                continue

    def move_aside(self, path: Path) -> str:
        """Renames ``path`` to a temporary name, removed at the end unless it is put back.

        A file is put in place by renaming it to a name that no file has, never over one: on
        ext4, a rename that replaces a file first flushes the renamed file's data to the disk
        (the auto_da_alloc heuristic), most of a second for a 2.5 GB data file."""
        name = self.free_name(".old.tmp")
        os.rename(path, name)
        return name

    def __enter__(self) -> TempFiles:
        return self

    def __exit__(self, *exc) -> None:
        for name in self.names:
            if os.path.lexists(name):
                os.unlink(name)


def remove_stale_temps(folder: Path, name: str) -> None:
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
