"""The generated sections of docs/development.md: the facts it lists that live elsewhere.

- ``ops``: the op catalogue's ops and attributes (``onnxnorm/ops/catalogue.py``);
- ``versions``: the supported-versions table, from ``pyproject.toml`` (the required ranges,
  whose lower bounds ``tests/packaging/test_versions.py`` installs) and
  ``requirements/dev.lock`` (the versions the suite is locked to), with a note per package from
  :data:`NOTES`.

The rest of the page is written by hand. A section stands between
``<!-- generated: NAME -->`` and ``<!-- end of generated: NAME -->``;
``python tools/generate.py`` rewrites it (``make generate``), ``--check`` fails when it is stale.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = "docs/development.md"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: package -> what is tested of it beside the minimum and the lock (the versions table's notes)
NOTES = {
    "onnxruntime": "1.21 is the oldest the library loads in (it is built against the 1.21 "
    "headers); 1.24.1 is tested too",
    "onnxruntime-gpu": "installed beside the wheel: no onnxruntime pulled in, `pip check` clean, "
    "CUDA provider offered (`tests/packaging/test_install.py`); the CUDA kernels have not run on a "
    "GPU",
    "torch": "the CPU build; older releases are declared, not tested",
    "transformers": "5.24.0 too (the tests that build transformers models, run by hand); the "
    "library uses only `AutoConfig` and the `AutoModel` classes, and the tests find the norm "
    "classes and families by reading the installed transformers (`onnxnorm.testing.hf.norms`), "
    "so a class renamed upstream needs no edit; older releases are declared, not tested",
}
#: the extras whose packages the table lists, beside the runtime dependencies
EXTRAS = ("cpu", "gpu", "torch")


def _lock():
    """(requirements/dev.lock as tools/lock.py reads it, normalized name -> version; its name
    normalization)."""
    spec = importlib.util.spec_from_file_location(
        "_onnxnorm_tools_lock", ROOT / "tools" / "lock.py"
    )
    lock = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lock)
    return lock.read_lock(ROOT / "requirements" / "dev.lock"), lock.normalized


def _requirements() -> list[tuple[str, str, str]]:
    """(name as written, its extra or "", its version range) in pyproject.toml's order."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = [("", project["dependencies"])]
    groups += [(extra, project["optional-dependencies"][extra]) for extra in EXTRAS]
    found = []
    for extra, requirements in groups:
        for requirement in requirements:
            match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*(.*)", requirement)
            found.append((match.group(1), extra, match.group(3).strip()))
    return found


def versions() -> str:
    """The supported-versions table."""
    pins, normalized = _lock()
    python = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    rows = [
        "| package | required | tested by CI |",
        "|---|---|---|",
        f"| Python | {python} | 3.11 |",
    ]
    for name, extra, required in _requirements():
        key = normalized(name)
        lower = re.search(r">=\s*([0-9][0-9A-Za-z.]*)", required)
        tested = []
        if lower and extra in ("", "cpu"):
            tested.append(f"{lower.group(1)} (the minimum, `tests/packaging/test_versions.py`)")
        if key in pins:
            tested.append(f"{pins[key]} (the lock)")
        cell = " and ".join(tested)
        if key in NOTES:
            cell = f"{cell}; {NOTES[key]}" if cell else NOTES[key]
        label = f"{name} (`[{extra}]`)" if extra in ("torch",) else name
        rows.append(f"| {label} | {required} | {cell} |")
    rows.append(
        "| CUDA (build) | nvcc that targets sm_80 and sm_90 | nvcc 13.0 compiles the CUDA "
        "library; no GPU in CI |"
    )
    return "\n".join(rows) + "\n"


def ops() -> str:
    """The catalogue's ops and their attributes, as a sentence."""
    from onnxnorm.ops import catalogue

    names = ", ".join(f"`{name}`" for name in catalogue.OPS)
    attributes = dict.fromkeys(a.name for op in catalogue.OPS.values() for a in op.attributes)
    return (
        f"{len(catalogue.OPS)} ops in the domain `{catalogue.DOMAIN}`: {names}; with their "
        f"inputs, attributes ({', '.join(f'`{a}`' for a in attributes)}) and type constraints\n"
    )


#: section name -> its renderer
SECTIONS = {"ops": ops, "versions": versions}


def render(text: str | None = None) -> str:
    """The page (``text``, by default this tree's) with every generated section rendered."""
    if text is None:
        text = (ROOT / PAGE).read_text()
    for name, section in SECTIONS.items():
        start = f"<!-- generated: {name} -->\n"
        end = f"<!-- end of generated: {name} -->"
        if start not in text or end not in text:
            raise ValueError(f"{PAGE} has no section {start.strip()} ... {end}")
        head, rest = text.split(start, 1)
        text = head + start + section() + end + rest.split(end, 1)[1]
    return text


if __name__ == "__main__":
    (ROOT / PAGE).write_text(render())
    print(f"wrote {PAGE}")
