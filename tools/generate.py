"""Every file generated from the code, from one command (`make generate`).

    python tools/generate.py            rewrites each generated file that differs from what its
                                        generator renders now, and names it
    python tools/generate.py --check    writes nothing: names each stale file, shows how it
                                        differs, and exits 1 (`make check-generated`)

Each file in the tree is compared with its generator's output, so the answer does not depend on
what else in the working tree is uncommitted. ``--root DIR`` reads and writes the files under
DIR instead of this repository (a copy; the generators still render from this tree's code).

The pages written by a measurement (``MEASURED``) are not regenerated here: their commands run
for minutes and date the numbers they write.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
_TOOLS = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:  # render from this tree's onnxnorm, installed or not
    sys.path.insert(0, str(ROOT))


def _tool(name: str) -> ModuleType:
    """A generator of tools/, loaded by its path (tools/ is not a package)."""
    key = f"_onnxnorm_tools_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, _TOOLS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[key] = module
    return sys.modules[key]


def _native_op_table() -> str:
    return _tool("gen_native_ops").render()


def _ops_page() -> str:
    from onnxnorm.ops import docs

    return docs.render()


def _norms_page() -> str:
    return _tool("gen_norms_doc").render()


def _runtimes_page() -> str:
    return _tool("runtimes_page").render()


def _development_page() -> str:
    return _tool("gen_development_doc").render()


#: every generated file, relative to the repository root: the command that writes it alone, and
#: the function that renders its content
GENERATED: dict[str, tuple[str, Callable[[], str]]] = {
    "custom_ops/include/onnxnorm/ops_generated.h": (
        "python tools/gen_native_ops.py",
        _native_op_table,
    ),
    "docs/ops.md": ("python -m onnxnorm.ops.docs docs/ops.md", _ops_page),
    "docs/norms.md": ("python tools/gen_norms_doc.py", _norms_page),
    # its sections between <!-- generated: NAME --> marks; the rest is written by hand
    "docs/development.md": ("python tools/gen_development_doc.py", _development_page),
    "docs/runtimes.md": ("python tools/runtimes_page.py", _runtimes_page),
}

#: pages written by measuring, each by its own command: dated, minutes long, not checked here
MEASURED: dict[str, str] = {
    "docs/fusion.md": "python tools/fusion_page.py",
    "docs/pipelines.md": "python tools/pipelines_page.py",
}


def _compare(path: str, root: Path) -> tuple[str, str]:
    """(the content of ``path`` under ``root``, "" when missing; what its generator renders)."""
    file = Path(root) / path
    return (file.read_text() if file.exists() else ""), GENERATED[path][1]()


def stale(root: Path = ROOT) -> dict[str, tuple[str, str]]:
    """The generated files under ``root`` whose content is not what their generator renders:
    path -> (content found, content rendered)."""
    pairs = {path: _compare(path, root) for path in GENERATED}
    return {path: pair for path, pair in pairs.items() if pair[0] != pair[1]}


def _diff(path: str, have: str, want: str, limit: int = 40) -> str:
    lines = list(
        difflib.unified_diff(
            have.splitlines(),
            want.splitlines(),
            f"{path} (in the tree)",
            f"{path} (generated)",
            lineterm="",
        )
    )
    more = f"\n... {len(lines) - limit} more lines" if len(lines) > limit else ""
    return "\n".join(lines[:limit]) + more


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python tools/generate.py", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 when a generated file is stale"
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=ROOT,
        help="the tree whose generated files are read and written (default: this one)",
    )
    args = parser.parse_args(argv)
    failed = changed = 0
    for path, (command, _) in GENERATED.items():
        try:
            have, want = _compare(path, args.root)
        except Exception as error:  # noqa: BLE001 - one broken generator: still do the others
            print(
                f"{path}: its generator failed ({command}): {type(error).__name__}: {error}",
                file=sys.stderr,
            )
            failed += 1
            continue
        if have == want:
            continue
        changed += 1
        if args.check:
            print(
                f"{path} is stale: run make generate ({command})\n{_diff(path, have, want)}",
                file=sys.stderr,
            )
        else:
            (args.root / path).write_text(want)
            print(f"wrote {path}")
    current = len(GENERATED) - failed - changed
    print(
        f"{current} of {len(GENERATED)} generated files "
        f"{'current' if args.check else 'already current'}"
    )
    return 1 if failed or (changed and args.check) else 0


if __name__ == "__main__":
    raise SystemExit(main())
