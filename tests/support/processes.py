"""onnxnorm as a user meets it in a process of its own: Python code or the command line run with
some modules hidden, as in an environment without them, and the one-line error a missing
module must give."""

from __future__ import annotations

import subprocess
import sys
import textwrap

#: run before the code of each subprocess: makes the named top-level modules unimportable, as
#: in an environment where they are not installed
_HIDE = textwrap.dedent("""\
    import importlib.abc, sys
    class _Hidden(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in HIDDEN:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None
    sys.meta_path.insert(0, _Hidden())
    """)


def run_python(code: str, hidden: tuple[str, ...] = (), cwd=None) -> subprocess.CompletedProcess:
    """``code`` run by this interpreter in a child process, the ``hidden`` modules unimportable."""
    script = f"HIDDEN = {set(hidden)!r}\n" + _HIDE + textwrap.dedent(code)
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def run_cli(*argv: str, hidden: tuple[str, ...] = (), cwd=None) -> subprocess.CompletedProcess:
    """``onnxnorm *argv`` in a child process, the ``hidden`` modules unimportable."""
    return run_python(f"from onnxnorm.cli import main; sys.exit(main({list(argv)!r}))", hidden, cwd)


def assert_one_line(result: subprocess.CompletedProcess, *fragments: str) -> str:
    """The process failed (status 1) with one line on stderr, no traceback, holding each of
    ``fragments``; that line."""
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]
