"""The runtime dependencies' declared minimum versions, read from pyproject.toml, and the check
that runs in an environment of exactly those versions (tests/packaging/test_versions.py,
tests/packaging/test_install.py)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: the extras that choose the ONNX Runtime distribution: runtime dependencies too
RUNTIME_EXTRAS = ("cpu", "gpu")
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*?)\s*$")
_LOWER = re.compile(r"(?:^|,)\s*>=\s*([0-9][0-9A-Za-z.+-]*)\s*(?=,|$)")


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def same_version(a: str, b: str) -> bool:
    """``1.23`` and ``1.23.0`` are one release (as pip reads ``==1.23``)."""

    def release(v: str) -> tuple[str, ...]:
        parts = v.split(".")
        while len(parts) > 1 and parts[-1] == "0":
            parts.pop()
        return tuple(parts)

    return release(a) == release(b)


def runtime_requirements() -> dict[str, list[str]]:
    """group ("dependencies", "cpu", "gpu") -> its requirement strings."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = {"dependencies": project["dependencies"]}
    for extra in RUNTIME_EXTRAS:
        groups[extra] = project["optional-dependencies"][extra]
    return groups


def lower_bound(requirement: str) -> tuple[str, str | None]:
    """(normalized name, its ``>=`` version or None) of one requirement string."""
    match = _REQUIREMENT.match(requirement.split(";")[0])
    assert match, f"cannot read the requirement {requirement!r}"
    lower = _LOWER.search(match.group(3))
    return normalized(match.group(1)), lower.group(1) if lower else None


def minimum_versions() -> dict[str, str]:
    """Normalized package name -> declared lower bound, for every runtime dependency."""
    bounds = {}
    for requirements in runtime_requirements().values():
        for requirement in requirements:
            name, lower = lower_bound(requirement)
            assert lower is not None, f"{requirement!r} in pyproject.toml has no lower bound"
            bounds[name] = lower
    return bounds


#: run inside the environment of the minimum versions, on models it builds itself (a model
#: saved by a newer onnx may carry an IR version an older one refuses); prints CHECK OK
MINIMUM_VERSIONS_CHECK = r'''
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
