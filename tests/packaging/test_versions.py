"""The declared minimum versions of the runtime dependencies are true, and said once.

Fast: every runtime dependency in pyproject.toml (``dependencies`` and the ``cpu``/``gpu``
extras, which choose the ONNX Runtime) has a lower bound, and docs/development.md's
supported-versions table names the same ones.

Slow (``test_install.py``, which builds the wheel it installs): a virtual environment with
exactly those lower bounds (read from pyproject.toml by ``tests.support.versions``'s
``minimum_versions``, so the test and the declaration cannot drift), in which the fusion command,
every target, its ``--verify`` and the library's kernels work. That module's
``MINIMUM_VERSIONS_CHECK`` is what it runs there. Needs PyPI.

What breaks just below each bound (Python 3.11):

- onnxruntime: 1.21 is the oldest the library can load in (it is built against the 1.21
  headers). 1.24 to 1.27 once aborted on a fused SkipLayerNorm without Sum, when the library's
  shape inference also typed the optional Sum output, which these releases do not bounds-check;
  it types Y alone now, and 1.21 and 1.24.1 pass.
- onnx 1.19 to 1.22: ``import onnxnorm.ops`` registers schemas whose inference functions are
  Python callables; onnx's registry destroys them after the interpreter is gone: the process
  crashes (1.21, 1.22) or hangs (1.19) at exit. 1.20 and 1.21 also lack
  ``make_attribute_ref(ref_attr_name=...)``.
- onnxscript 0.7.0 and older: ``Tape.op()`` takes no ``_domain``.
- onnx-ir 0.1.15, ml_dtypes 0.5.3, numpy 1.23.2: not installable beside the others
  (onnxscript 0.7.1 needs onnx-ir >= 0.1.16, onnx 1.23 ml_dtypes >= 0.5.4, which needs
  numpy >= 1.23.3 on Python 3.11).
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.versions import (
    lower_bound,
    minimum_versions,
    normalized,
    runtime_requirements,
    same_version,
)

ROOT = Path(__file__).resolve().parents[2]

# --- fast ---------------------------------------------------------------------------------------


def test_every_runtime_dependency_has_a_lower_bound():
    groups = runtime_requirements()
    for group, requirements in groups.items():
        assert requirements, f"pyproject.toml: {group} is empty"
        for requirement in requirements:
            _, lower = lower_bound(requirement)
            assert lower is not None, f"pyproject.toml {group}: {requirement!r} has no >= bound"
    names = minimum_versions()
    for needed in (
        "numpy",
        "ml-dtypes",
        "onnx",
        "onnx-ir",
        "onnxscript",
        "onnxruntime",
        "onnxruntime-gpu",
    ):
        assert needed in names, f"pyproject.toml declares no {needed}"
    assert same_version(names["onnxruntime"], names["onnxruntime-gpu"]), (
        "the cpu and gpu extras must require the same ONNX Runtime version"
    )


def _readme_table() -> dict[str, tuple[str, str]]:
    """docs/development.md's ``## Supported versions`` table: normalized package -> (its row,
    its ``required`` cell)."""
    text = (ROOT / "docs" / "development.md").read_text()
    heading = re.search(r"^## Supported versions[ \t]*$", text, re.MULTILINE)
    assert heading, "docs/development.md has no '## Supported versions' section"
    section = text[heading.end() :]
    following = re.search(r"^#{1,2} ", section, re.MULTILINE)
    section = section[: following.start()] if following else section
    rows = [line.strip() for line in section.splitlines() if line.strip().startswith("|")]
    assert rows, "docs/development.md '## Supported versions' has no table"
    header = [c.strip().lower() for c in rows[0].strip("|").split("|")]
    assert header == ["package", "required", "tested by ci"], (
        f"docs/development.md supported-versions table header is {rows[0]!r}, "
        "expected '| package | required | tested by CI |'"
    )
    table = {}
    for row in rows[1:]:
        cells = [c.strip().strip("`").strip() for c in row.strip("|").split("|")]
        if set("".join(cells)) <= set("-: "):
            continue  # the separator row
        assert len(cells) == 3, f"docs/development.md supported-versions row {row!r}: not 3 cells"
        name = normalized(cells[0])
        assert name not in table, f"docs/development.md supported-versions table: {cells[0]} twice"
        table[name] = (row, cells[1])
    return table


def test_readme_names_the_declared_lower_bounds():
    declared = minimum_versions()
    table = _readme_table()
    missing = [
        f"| {name} | >={version} | ... |" for name, version in declared.items() if name not in table
    ]
    assert not missing, (
        "docs/development.md's supported-versions table lacks the rows " + "; ".join(missing)
    )
    for name, version in declared.items():
        row, required = table[name]
        # the required cell: 1.2.3, >=1.2.3, >= 1.2.3 or ≥ 1.2.3, backticks allowed
        found = re.fullmatch(r"(?:>=|≥)?\s*`?([0-9][0-9A-Za-z.+-]*)`?", required)
        assert found and same_version(found.group(1), version), (
            f"docs/development.md row {row!r}: pyproject.toml declares {name}>={version}"
        )


def test_the_lock_pins_every_input_exactly():
    """tools/lock.py --check: every package the environments' inputs name is pinned by its
    lock, each line of which is name==version (no range, no local label)."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "lock.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    for lock in (ROOT / "requirements").glob("*.lock"):
        for line in lock.read_text().splitlines():
            if line and not line.startswith("#"):
                assert re.fullmatch(r"[a-z0-9-]+==[0-9][0-9A-Za-z.]*", line), (lock.name, line)


# --- slow ---------------------------------------------------------------------------------------
