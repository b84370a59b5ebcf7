"""The declared minimum versions of the runtime dependencies are true, and said once.

Fast: every runtime dependency in pyproject.toml (``dependencies`` and the ``cpu``/``gpu``
extras, which choose the ONNX Runtime) has a lower bound, and docs/development.md's
supported-versions table names the same ones.

Slow (``test_install.py``, which builds the wheel it installs): a virtual environment with
exactly those lower bounds (read from pyproject.toml by :func:`minimum_versions`, so the test and
the declaration cannot drift), in which the fusion command, every target, its ``--verify`` and
the library's kernels work. ``CHECK`` is what it runs there. Needs PyPI.

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
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the extras that choose the ONNX Runtime distribution: runtime dependencies too
RUNTIME_EXTRAS = ("cpu", "gpu")
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*?)\s*$")
_LOWER = re.compile(r"(?:^|,)\s*>=\s*([0-9][0-9A-Za-z.+-]*)\s*(?=,|$)")


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _same_version(a: str, b: str) -> bool:
    """``1.23`` and ``1.23.0`` are one release (as pip reads ``==1.23``)."""

    def release(v: str) -> tuple[str, ...]:
        parts = v.split(".")
        while len(parts) > 1 and parts[-1] == "0":
            parts.pop()
        return tuple(parts)

    return release(a) == release(b)


def _runtime_requirements() -> dict[str, list[str]]:
    """group ("dependencies", "cpu", "gpu") -> its requirement strings."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = {"dependencies": project["dependencies"]}
    for extra in RUNTIME_EXTRAS:
        groups[extra] = project["optional-dependencies"][extra]
    return groups


def _lower_bound(requirement: str) -> tuple[str, str | None]:
    """(normalized name, its ``>=`` version or None) of one requirement string."""
    match = _REQUIREMENT.match(requirement.split(";")[0])
    assert match, f"cannot read the requirement {requirement!r}"
    lower = _LOWER.search(match.group(3))
    return _normalized(match.group(1)), lower.group(1) if lower else None


def minimum_versions() -> dict[str, str]:
    """Normalized package name -> declared lower bound, for every runtime dependency."""
    bounds = {}
    for requirements in _runtime_requirements().values():
        for requirement in requirements:
            name, lower = _lower_bound(requirement)
            assert lower is not None, f"{requirement!r} in pyproject.toml has no lower bound"
            bounds[name] = lower
    return bounds


# --- fast ---------------------------------------------------------------------------------------


def test_every_runtime_dependency_has_a_lower_bound():
    groups = _runtime_requirements()
    for group, requirements in groups.items():
        assert requirements, f"pyproject.toml: {group} is empty"
        for requirement in requirements:
            _, lower = _lower_bound(requirement)
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
    assert _same_version(names["onnxruntime"], names["onnxruntime-gpu"]), (
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
        name = _normalized(cells[0])
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
        assert found and _same_version(found.group(1), version), (
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

#: run inside the environment of the minimum versions, on models it builds itself (a model
#: saved by a newer onnx may carry an IR version an older one refuses); prints CHECK OK
CHECK = r'''
import subprocess, sys, tempfile
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import onnxnorm.runtime as rt
from onnxnorm.ops import reference

H = 16
ONNXNORM = Path(sys.executable).with_name("onnxnorm")
W = np.linspace(0.5, 1.5, H, dtype=np.float32)
B = np.linspace(-0.2, 0.3, H, dtype=np.float32)


def save(nodes, inputs, inits, path, opsets=(("", 18),)):
    graph = helper.make_graph(
        nodes, path.stem, [helper.make_tensor_value_info(n, t, [2, 3, H]) for n, t in inputs],
        [helper.make_tensor_value_info("y", inputs[0][1], [2, 3, H])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, ir_version=8,
                              opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    onnx.checker.check_model(model)
    onnx.save(model, path)


def rms_model(path):
    """A decomposed RMSNorm, as an exporter writes it."""
    save([helper.make_node("Pow", ["x", "two"], ["sq"]),
          helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
          helper.make_node("Add", ["ms", "eps"], ["mse"]),
          helper.make_node("Sqrt", ["mse"], ["rms"]),
          helper.make_node("Div", ["x", "rms"], ["n"]),
          helper.make_node("Mul", ["n", "w"], ["y"])],
         [("x", TensorProto.FLOAT)],
         {"two": np.array(2.0, np.float32), "axes": np.array([-1], np.int64),
          "eps": np.array(1e-6, np.float32), "w": W}, path)


def ln_model(path):
    """A residual Add and the decomposed LayerNorm after it."""
    save([helper.make_node("Add", ["x", "r"], ["s"]),
          helper.make_node("ReduceMean", ["s", "axes"], ["mu"], keepdims=1),
          helper.make_node("Sub", ["s", "mu"], ["d"]),
          helper.make_node("Mul", ["d", "d"], ["d2"]),
          helper.make_node("ReduceMean", ["d2", "axes"], ["var"], keepdims=1),
          helper.make_node("Add", ["var", "eps"], ["ve"]),
          helper.make_node("Sqrt", ["ve"], ["sd"]),
          helper.make_node("Div", ["d", "sd"], ["n"]),
          helper.make_node("Mul", ["n", "w"], ["nw"]),
          helper.make_node("Add", ["nw", "b"], ["y"])],
         [("x", TensorProto.FLOAT), ("r", TensorProto.FLOAT)],
         {"axes": np.array([-1], np.int64), "eps": np.array(1e-5, np.float32), "w": W, "b": B},
         path)


EXPECTED = {  # (model, target) -> (domain, op) of every node; None: only standard ops
    ("rms", "function"): [("onnxnorm", "RMSNorm")],
    ("ln", "function"): [("onnxnorm", "SkipLayerNorm")],
    ("rms", "fused"): [("onnxnorm", "RMSNorm")],
    ("ln", "fused"): [("onnxnorm", "SkipLayerNorm")],
    ("rms", "ort"): [("", "SimplifiedLayerNormalization")],
    ("ln", "ort"): [("com.microsoft", "SkipLayerNormalization")],
    ("rms", "onnx"): None,  # no RMSNormalization at opset 18: the body, inlined
    ("ln", "onnx"): [("", "Add"), ("", "LayerNormalization")],
}


def fuse_every_target(work, rng):
    x = rng.standard_normal((2, 3, H)).astype(np.float32)
    r = rng.standard_normal((2, 3, H)).astype(np.float32)
    s = x + r
    d = s - s.mean(-1, keepdims=True)
    cases = {"rms": ({"x": x}, x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-6) * W),
             "ln": ({"x": x, "r": r}, d / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5) * W + B)}
    rms_model(work / "rms.onnx")
    ln_model(work / "ln.onnx")
    for (name, target), want in EXPECTED.items():
        out = work / f"{name}_{target}.onnx"
        res = subprocess.run([str(ONNXNORM), "fuse", str(work / f"{name}.onnx"), "-o", str(out),
                              "--verify", "--target", target],
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, (name, target, res.returncode, res.stdout, res.stderr)
        assert "verify: y (float32)" in res.stdout and " ok" in res.stdout, res.stdout
        model = onnx.load(out)
        ops = [(n.domain, n.op_type) for n in model.graph.node]
        if want is None:
            assert {d for d, _ in ops} == {""}, (name, target, ops)
            assert {"ReduceMean", "Sqrt"} <= {o for _, o in ops}, (name, target, ops)
        else:
            assert ops == want, (name, target, ops)
        bodies = sorted({f.domain for f in model.functions})
        assert bodies == (["onnxnorm"] if target == "function" else []), (name, target, bodies)
        feeds, expected = cases[name]
        # with the library; and in plain ORT where the model does not need it
        for with_library in (True, False) if target != "fused" else (True,):
            got = rt.session(out, with_library=with_library).run(None, feeds)[0]
            error = float(np.abs(got - expected).max())
            assert error <= 1e-5, (name, target, with_library, error)
        print(name, target, "ok", flush=True)


def half_precision(work, rng):
    """The library's float16 kernel against the reference; the reference in bfloat16."""
    x = rng.standard_normal((2, 3, H)).astype(np.float16)
    w = W.astype(np.float16)
    path = work / "rms_f16.onnx"
    save([helper.make_node("RMSNorm", ["x", "w"], ["y"], domain="onnxnorm", epsilon=1e-6)],
         [("x", TensorProto.FLOAT16)], {"w": w}, path, opsets=(("", 18), ("onnxnorm", 1)))
    got = rt.session(path).run(None, {"x": x})[0]
    want = reference.run("RMSNorm", x, w, epsilon=1e-6)[0]
    assert got.dtype == np.float16 and want.dtype == np.float16
    atol, rtol = reference.tolerance(np.float16)
    assert np.allclose(got.astype(np.float32), want.astype(np.float32), atol=atol, rtol=rtol)
    bf = ml_dtypes.bfloat16
    y, total = reference.run("SkipLayerNorm", x.astype(bf), x.astype(bf), W.astype(bf),
                             B.astype(bf), epsilon=1e-5)
    y32 = reference.run("SkipLayerNorm", x.astype(bf).astype(np.float32),
                        x.astype(bf).astype(np.float32), W.astype(bf).astype(np.float32),
                        B.astype(bf).astype(np.float32), epsilon=1e-5)[0]
    assert y.dtype == bf and total.dtype == bf
    atol, rtol = reference.tolerance(bf)
    assert np.allclose(y.astype(np.float32), y32, atol=atol, rtol=rtol)
    print("float16 kernel, bfloat16 reference ok", flush=True)


rng = np.random.default_rng(0)
work = Path(tempfile.mkdtemp())
fuse_every_target(work, rng)
half_precision(work, rng)
# the private pieces of onnxscript and ONNX Runtime the pass relies on, at these versions
from onnxnorm.fusion import _onnxscript_private, _ort_symbolic
_onnxscript_private.check()
_ort_symbolic.check()
print("upstream private pieces ok", flush=True)
print("CHECK OK")
'''
