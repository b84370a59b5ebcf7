"""The package's import structure keeps its shape (docs/design.md, "Layout"): `make lint` runs
this file, so that a feature cannot bring back what the redesign removed.

Read from the source (every import statement, those inside functions included, since a lazy
import is an arrow all the same):

- no import circle among onnxnorm's modules;
- no private name (``_name``) imported from another module, nor read off one it imported
  (``functions._set_opset``): what crosses a module is public;
- the fusion pass and the op catalogue (``onnxnorm.fusion``, ``onnxnorm.ops``) import no
  pipeline package (``onnxnorm.genai``, ``onnxnorm.olive``, ``onnxnorm.serve``) and not the
  torch side (``onnxnorm.nn``);
- no library module imports the tooling packages (``onnxnorm.bench``, ``onnxnorm.testing``),
  which import the library like any user;
- no module of tests/ imports a test file (``test_*.py``), neither in its code nor in the Python
  it runs in a child process: what two test files share lives in ``tests/support``.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "onnxnorm"
TESTS = ROOT / "tests"
PIPELINES = ("onnxnorm.genai", "onnxnorm.olive", "onnxnorm.serve")
TOOLING = ("onnxnorm.bench", "onnxnorm.testing")
PASS = ("onnxnorm.fusion", "onnxnorm.ops")


@dataclasses.dataclass(frozen=True)
class Arrow:
    source: str  # the importing module
    target: str  # the imported module
    name: str | None  # the name taken from it (``from target import name``), if any
    line: int


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _within(name: str, modules: dict[str, Path]) -> str:
    """The module ``name`` lives in (a dotted name may end in an attribute)."""
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


@functools.cache
def arrows() -> tuple[Arrow, ...]:
    """Every import of an onnxnorm module by an onnxnorm module."""
    modules = _modules()
    found = []
    for source, path in modules.items():
        package = source if path.name == "__init__.py" else source.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "onnxnorm":
                        found.append(Arrow(source, _within(alias.name, modules), None, node.lineno))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                if base.split(".")[0] != "onnxnorm":
                    continue
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    if full in modules:  # a module taken from its package
                        found.append(Arrow(source, full, None, node.lineno))
                    else:
                        found.append(Arrow(source, _within(base, modules), alias.name, node.lineno))
    return tuple(a for a in found if a.target != a.source)


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a chain of attributes on a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


@functools.cache
def private_attributes() -> tuple[str, ...]:
    """Every ``module._name`` an onnxnorm module reads of another onnxnorm module it imported
    (``from onnxnorm.ops import functions`` then ``functions._set_opset``): a private name
    crossing a module as surely as an import of it."""
    modules = _modules()
    found = []
    for source, path in modules.items():
        package = source if path.name == "__init__.py" else source.rsplit(".", 1)[0]
        tree = ast.parse(path.read_text(), str(path))
        bound: dict[str, str] = {}  # local name -> the onnxnorm module it is
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "onnxnorm":
                        if alias.asname:
                            bound[alias.asname] = alias.name
                        else:
                            bound["onnxnorm"] = "onnxnorm"
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                for alias in node.names:
                    if f"{base}.{alias.name}" in modules:
                        bound[alias.asname or alias.name] = f"{base}.{alias.name}"
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            if not node.attr.startswith("_") or node.attr.startswith("__"):
                continue
            owner = _dotted(node.value)
            if owner is None or owner.split(".")[0] not in bound:
                continue
            head, _, rest = owner.partition(".")
            module = bound[head] + (f".{rest}" if rest else "")
            if module in modules and module != source:
                found.append(f"{source}:{node.lineno} -> {module}.{node.attr}")
    return tuple(found)


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return circles


def _where(arrow: Arrow) -> str:
    taken = f" ({arrow.name})" if arrow.name else ""
    return f"{arrow.source}:{arrow.line} -> {arrow.target}{taken}"


def test_the_reader_sees_the_imports():
    """The reader finds the arrows it must (a broken reader would pass every rule)."""
    found = {(a.source, a.target) for a in arrows()}
    assert ("onnxnorm.fusion.pipeline", "onnxnorm.fusion.norms") in found
    assert ("onnxnorm.nn.decoder", "onnxnorm.nn.families") in found
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle():
    edges: dict[str, set[str]] = {}
    for arrow in arrows():
        edges.setdefault(arrow.source, set()).add(arrow.target)
    circles = _circles(edges)
    assert not circles, "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


def test_no_private_name_crosses_a_module():
    crossing = [
        _where(a)
        for a in arrows()
        if a.name and a.name.startswith("_") and not a.name.startswith("__")
    ]
    assert not crossing, "private names imported from another module: " + "; ".join(crossing)


def test_the_reader_sees_private_attributes(tmp_path, monkeypatch):
    """A private name read off an imported module is found, however the module was bound."""
    package = tmp_path / "onnxnorm"
    (package / "ops").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "ops" / "__init__.py").write_text("")
    (package / "ops" / "functions.py").write_text("def _set_opset(): ...\n_TABLE = {}\n")
    (package / "lowering.py").write_text(
        "import onnxnorm.ops.functions\nimport onnxnorm.ops.functions as f\n"
        "from onnxnorm.ops import functions\nfrom .ops import functions as g\n\n"
        "functions._set_opset()\nf._TABLE\nonnxnorm.ops.functions._TABLE\ng._set_opset\n"
        "functions.__name__\nfunctions.public\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", package)
    assert sorted(private_attributes.__wrapped__()) == [
        "onnxnorm.lowering:6 -> onnxnorm.ops.functions._set_opset",
        "onnxnorm.lowering:7 -> onnxnorm.ops.functions._TABLE",
        "onnxnorm.lowering:8 -> onnxnorm.ops.functions._TABLE",
        "onnxnorm.lowering:9 -> onnxnorm.ops.functions._set_opset",
    ]


def test_no_private_attribute_of_another_module():
    crossing = private_attributes()
    assert not crossing, "private names read from another module: " + "; ".join(crossing)


def test_the_pass_imports_no_pipeline_and_no_torch_side():
    upward = [
        _where(a)
        for a in arrows()
        if a.source.startswith(PASS) and a.target.startswith(PIPELINES + ("onnxnorm.nn",))
    ]
    assert not upward, "the pass reaches up: " + "; ".join(upward)


def test_the_library_imports_no_tooling():
    upward = [
        _where(a)
        for a in arrows()
        if not a.source.startswith(TOOLING) and a.target.startswith(TOOLING)
    ]
    assert not upward, "library code imports bench or testing: " + "; ".join(upward)


def _imported_modules(tree: ast.AST) -> list[tuple[str, int]]:
    """(dotted name, line) of every module an import in ``tree`` names: ``from a import b``
    names ``a``, and ``a.b`` where b is named like a test module; relative ones with their
    leading dots."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            found.append((base, node.lineno))
            found += [
                (f"{base.rstrip('.')}.{alias.name}", node.lineno)
                for alias in node.names
                if alias.name.startswith("test_")
            ]
    return found


def _test_module_imports(path: Path) -> list[str]:
    """The imports of a test module (a name part ``test_*``) in ``path``'s code and in the
    strings of it that parse as Python with an import (the scripts it runs in a child
    process), each as path:line -> module."""
    tree = ast.parse(path.read_text(), str(path))
    trees = [(tree, 0)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and "import" in str(node.value):
            try:
                trees.append((ast.parse(node.value), node.lineno - 1))
            except SyntaxError:
                continue  # prose, or Python in pieces
    where = path.relative_to(ROOT)
    return [
        f"{where}:{offset + line} -> {name}"
        for found, offset in trees
        for name, line in _imported_modules(found)
        if any(part.startswith("test_") for part in name.split("."))
    ]


def test_the_test_reader_sees_test_imports(tmp_path):
    """The reader finds a test module imported in code and in a child process's script (the
    module names filled in here, so that this file's own strings import none)."""
    (tmp_path / "tests").mkdir()
    path = tmp_path / "tests" / "test_a.py"
    code = (
        "import {b}\nfrom tests.{c} import f\nfrom . import {d}\nfrom {e} import g\n"
        "from tests.support import helpers\n"
        'SCRIPT = """\nimport sys\nimport {f} as t\n"""\n'
    )
    path.write_text(code.format(**{k: "test_" + k for k in "bcdef"}))
    global ROOT
    root, ROOT = ROOT, tmp_path
    try:
        found = _test_module_imports(path)
    finally:
        ROOT = root
    assert found == [
        "tests/test_a.py:1 -> test_b",
        "tests/test_a.py:2 -> tests.test_c",
        "tests/test_a.py:3 -> .test_d",
        "tests/test_a.py:4 -> test_e",
        "tests/test_a.py:8 -> test_f",
    ], found


def test_no_test_file_imports_another():
    found = [f for path in sorted(TESTS.rglob("*.py")) for f in _test_module_imports(path)]
    assert not found, "test modules imported (move what they share to tests/support): " + (
        "; ".join(found)
    )
