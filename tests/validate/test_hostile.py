"""Hostile and broken model files given to `onnxnorm fuse`, `fuse --verify`, `onnxnorm export`
and the Python API: each is refused with one line naming the problem and a non-zero exit,
nothing is written, the input folder is left as it was, and external data that would be read
from outside the model's folder is refused before it is opened.

docs/reliability.md lists the cases with the line each gives.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxnorm.fusion
from onnxnorm import OnnxNormError, cli, ops, runtime
from onnxnorm.fusion.verify import verify

HIDDEN = 16
SHAPE = [2, 3, HIDDEN]


def _value(name: str, shape=SHAPE) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _model(nodes=None, inits=None, inputs=None, outputs=None, domains=()) -> onnx.ModelProto:
    """x + r, LayerNormalization, then a MatMul by a 16x16 weight (1 KiB: read from a file when
    stored as external data)."""
    rng = np.random.default_rng(0)
    if nodes is None:
        nodes = [
            helper.make_node("Add", ["x", "r"], ["s"], name="add"),
            helper.make_node(
                "LayerNormalization", ["s", "g", "b"], ["n"], name="norm", epsilon=1e-5
            ),
            helper.make_node("MatMul", ["n", "w"], ["y"], name="proj"),
        ]
    if inits is None:
        inits = [
            numpy_helper.from_array(rng.random(HIDDEN, np.float32) + 0.5, "g"),
            numpy_helper.from_array(rng.random(HIDDEN, np.float32), "b"),
            numpy_helper.from_array(rng.standard_normal((HIDDEN, HIDDEN), np.float32), "w"),
        ]
    graph = helper.make_graph(
        nodes, "hostile", inputs or [_value("x"), _value("r")], outputs or [_value("y")], inits
    )
    imports = [helper.make_opsetid("", 18)] + [helper.make_opsetid(d, 1) for d in domains]
    return helper.make_model(graph, opset_imports=imports, ir_version=10)


def _external(
    model: onnx.ModelProto, location: str, length: int | None = HIDDEN * HIDDEN * 4
) -> onnx.ModelProto:
    """``model`` with its weight w stored as external data at ``location``."""
    tensor = next(t for t in model.graph.initializer if t.name == "w")
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    entries = [("location", location), ("offset", "0")]
    entries += [("length", str(length))] if length is not None else []
    for key, value in entries:
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return model


def _norm(op="LayerNormalization", domain="", **attrs) -> onnx.ModelProto:
    """One norm node on the graph input x (of known rank), then the MatMul."""
    inputs = (
        ["x", "g", "b"]
        if domain != ops.DOMAIN or not op.startswith("Skip")
        else ["x", "r", "g", "b"]
    )
    nodes = [
        helper.make_node(op, inputs, ["n"], name="norm", domain=domain, **attrs),
        helper.make_node("MatMul", ["n", "w"], ["y"], name="proj"),
    ]
    return _model(nodes=nodes, domains=[domain] if domain else [])


def _huge_inline() -> onnx.ModelProto:
    model = _model()
    w = model.graph.initializer[2]
    del w.dims[:]
    w.dims.extend([10**6, 10**6])  # 4 TB declared over 1 KiB of raw data
    return model


def _dims(model: onnx.ModelProto, name: str, dims) -> onnx.ModelProto:
    tensor = next(t for t in model.graph.initializer if t.name == name)
    del tensor.dims[:]
    tensor.dims.extend(dims)
    if tensor.HasField("raw_data"):
        tensor.ClearField("raw_data")
    return model


def _replace_node(index: int, node: onnx.NodeProto) -> onnx.ModelProto:
    model = _model()
    model.graph.node[index].CopyFrom(node)
    return model


def _bytes(model: onnx.ModelProto) -> bytes:
    return model.SerializeToString()


def _valid() -> bytes:
    return _bytes(_model())


#: name -> (the model file's bytes, or a function writing the folder's files and returning them;
#: the fragment of the one line it gives)
CASES = {
    "truncated": (lambda: _valid()[: len(_valid()) // 2], "not a readable ONNX model"),
    "wrong magic": (lambda: b"\x89PNG\r\n\x1a\n" + _valid()[8:], "not an ONNX model"),
    "empty file": (lambda: b"", "not an ONNX model (no IR version or graph)"),
    "text file": (lambda: b"name: model\nversion: 3\n", "not a"),
    "huge inline shape": (
        lambda: _bytes(_huge_inline()),
        "tensor 'w' of shape [1000000, 1000000] needs 4000000000000 bytes, it holds 1024",
    ),
    "huge shape, no data": (
        lambda: _bytes(_dims(_model(), "w", [10**6, 10**6])),
        "declares 1000000000000 elements, it holds 0",
    ),
    "negative dimension": (
        lambda: _bytes(_dims(_model(), "g", [-16])),
        "tensor 'g' has a negative dimension [-16]",
    ),
    "cycle": (
        lambda: _bytes(_replace_node(0, helper.make_node("Add", ["x", "y"], ["s"], name="add"))),
        "graph: the nodes form a cycle: node 'add' (Add) -> node 'norm' "
        "(LayerNormalization) -> node 'proj' (MatMul)",
    ),
    "dangling input": (
        lambda: _bytes(_replace_node(0, helper.make_node("Add", ["x", "nope"], ["s"], name="add"))),
        "graph: node 'add' (Add) reads 'nope', which no node, graph input or initializer provides",
    ),
    "missing initializer": (
        lambda: _bytes(_model(inits=[])),
        "graph: node 'norm' (LayerNormalization) reads 'g', which no node",
    ),
    "value produced twice": (
        lambda: _bytes(
            _model(
                nodes=[
                    helper.make_node("Add", ["x", "r"], ["s"], name="add"),
                    helper.make_node("Sub", ["x", "r"], ["s"], name="sub"),
                    helper.make_node("MatMul", ["s", "w"], ["y"]),
                ]
            )
        ),
        "graph: value 's' is produced twice, by node 'add' (Add) and node 'sub' (Sub)",
    ),
    "no default domain": (
        lambda: _bytes(helper.make_model(_model().graph, opset_imports=[], ir_version=10)),
        "graph: node 'add' (Add): the model imports no opset at all (opset_import is empty); "
        "ONNX Runtime refuses it too",
    ),
    "duplicate input": (
        lambda: _bytes(_model(inputs=[_value("x"), _value("r"), _value("x")])),
        "graph: input 'x' is declared twice",
    ),
    "output from nothing": (
        lambda: _bytes(_model(outputs=[_value("y"), _value("ghost")])),
        "graph: output 'ghost' is produced by no node, graph input or initializer",
    ),
    "domain not imported": (
        lambda: _bytes(
            _replace_node(
                0, helper.make_node("Frob", ["x", "r"], ["s"], name="add", domain="example.com")
            )
        ),
        "graph: node 'add' (example.com::Frob): domain 'example.com' is not imported",
    ),
    "onnxnorm epsilon negative": (
        lambda: _bytes(_norm("LayerNorm", ops.DOMAIN, epsilon=-1.0)),
        "node 'norm' (onnxnorm::LayerNorm): attribute epsilon must be "
        "a finite number >= 0, got -1.0",
    ),
    "onnxnorm epsilon NaN": (
        lambda: _bytes(_norm("RMSNorm", ops.DOMAIN, epsilon=math.nan)),
        "attribute epsilon must be a finite number >= 0, got nan",
    ),
    "onnxnorm epsilon inf": (
        lambda: _bytes(_norm("SkipRMSNorm", ops.DOMAIN, epsilon=math.inf)),
        "node 'norm' (onnxnorm::SkipRMSNorm): attribute epsilon must be a "
        "finite number >= 0, got inf",
    ),
    "epsilon an int": (
        lambda: _bytes(_norm(epsilon=1)),
        "attribute epsilon must be a float, got INT",
    ),
    "axis out of range": (
        lambda: _bytes(_norm(axis=3)),
        "attribute axis 3 is out of range for its input of rank 3",
    ),
    "axis below range": (
        lambda: _bytes(_norm(axis=-4)),
        "attribute axis -4 is out of range for its input of rank 3",
    ),
    "onnxnorm alpha inf": (
        lambda: _bytes(_norm("SkipLayerNorm", ops.DOMAIN, alpha=math.inf)),
        "node 'norm' (onnxnorm::SkipLayerNorm): attribute alpha must be a finite number, got inf",
    ),
    "onnxnorm cast_before_scale 2": (
        lambda: _bytes(_norm("RMSNorm", ops.DOMAIN, cast_before_scale=2)),
        "attribute cast_before_scale must be 0 or 1, got 2",
    ),
    "onnxnorm unknown op": (
        lambda: _bytes(_norm("GroupRMSNorm", ops.DOMAIN)),
        "node 'norm' (onnxnorm::GroupRMSNorm): not an op of the onnxnorm domain",
    ),
    "external data too short": (
        lambda folder: (
            (folder / "w.bin").write_bytes(b"\0" * 100),
            _bytes(_external(_model(), "w.bin")),
        )[1],
        "tensor 'w': external data 'w.bin' holds 100 bytes, tensor 'w' needs bytes 0 to 1024",
    ),
    "external length 10^12": (
        lambda folder: (
            (folder / "w.bin").write_bytes(b"\0" * 1024),
            _bytes(_external(_model(), "w.bin", length=10**12)),
        )[1],
        "tensor 'w' of shape [16, 16] needs 1024 bytes, its external data length says "
        "1000000000000",
    ),
    "external file missing": (
        lambda folder: _bytes(_external(_model(), "absent.bin")),
        "tensor 'w': external data 'absent.bin': no such file in the model's folder",
    ),
    "external data a FIFO": (
        lambda folder: (os.mkfifo(folder / "w.bin"), _bytes(_external(_model(), "w.bin")))[1],
        "tensor 'w': external data 'w.bin' is not a regular file (refused, not read)",
    ),
}


def _write_case(folder: Path, name: str) -> Path:
    make, _ = CASES[name]
    data = make(folder) if make.__code__.co_argcount else make()
    path = folder / "model.onnx"
    path.write_bytes(data)
    return path


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    return {
        p.name: (p.read_bytes() if p.is_file() and not p.is_fifo() else None)
        for p in folder.iterdir()
    }


def _one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


@pytest.mark.parametrize("name", list(CASES))
def test_fuse_refuses_in_one_line(tmp_path, capsys, name):
    folder, out = tmp_path / "in", tmp_path / "out"
    folder.mkdir()
    out.mkdir()
    path = _write_case(folder, name)
    before = _snapshot(folder)
    for extra in ([], ["--verify"]):
        assert cli.main(["fuse", str(path), "-o", str(out / "fused.onnx"), *extra]) == 1
        captured = capsys.readouterr()
        line = _one_line(captured.err)
        assert line.startswith(f"onnxnorm: error: {path}: ") and CASES[name][1] in line, line
        assert captured.out == ""
        assert list(out.iterdir()) == [], "something was written"
        assert _snapshot(folder) == before, "the input folder changed"


@pytest.mark.parametrize(
    "name", [n for n in CASES if n not in ("truncated", "wrong magic", "empty file", "text file")]
)
def test_python_api_refuses_in_one_line(tmp_path, name):
    """onnxnorm.fusion.fuse on the ModelProto (external data in its folder) and verify() on the
    file raise OnnxNormError with the line `fuse` prints."""
    path = _write_case(tmp_path, name)
    proto = onnx.load(path, load_external_data=False)
    with pytest.raises(OnnxNormError) as raised:
        onnxnorm.fusion.fuse(proto, base_dir=str(tmp_path))
    assert CASES[name][1] in _one_line(str(raised.value))
    with pytest.raises(OnnxNormError) as raised:
        verify(path, path)
    assert _one_line(str(raised.value)).startswith(f"{path}: ")
    assert CASES[name][1] in str(raised.value)
    if name.startswith("external"):  # checked before ONNX Runtime opens anything
        with pytest.raises(OnnxNormError) as raised:
            runtime.session(path)
        assert _one_line(str(raised.value)) == f"{path}: {CASES[name][1]}"


@pytest.mark.parametrize("name", list(CASES))
def test_onnx_runtime_refuses_them_too(tmp_path, name):
    """What the pass refuses, ONNX Runtime's own loader refuses too (the onnxnorm library
    registered): the pass is no stricter than the runtime. What ONNX Runtime loads although it
    is sloppy is mended instead (tests/fusion/test_wild_models.py)."""
    import onnxruntime as ort

    path = _write_case(tmp_path, name)
    options = ort.SessionOptions()
    runtime.register(options)
    with pytest.raises(Exception) as raised:
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    assert not isinstance(raised.value, (AssertionError, pytest.fail.Exception))


def test_the_valid_model_passes(tmp_path, capsys):
    """The model the cases break is fused and verified (so each case fails for its one fault)."""
    path = tmp_path / "model.onnx"
    path.write_bytes(_valid())
    assert cli.main(["fuse", str(path), "-o", str(tmp_path / "fused.onnx"), "--verify"]) == 0
    out = capsys.readouterr().out
    assert "verify: y (float32)" in out and " ok" in out
    fused = [n.op_type for n in onnx.load(tmp_path / "fused.onnx").graph.node]
    assert fused == ["SkipLayerNorm", "MatMul"], fused


def test_ops_of_an_imported_unknown_domain_fuse_but_do_not_verify(tmp_path, capsys):
    """An op of a domain the model imports but no runtime here knows (a plugin's) is left as it
    is; --verify cannot run it, says so in one line and keeps nothing."""
    model = _model(domains=["example.com"])
    model.graph.node.append(helper.make_node("Frob", ["x"], ["f"], domain="example.com"))
    path, out = tmp_path / "model.onnx", tmp_path / "fused.onnx"
    path.write_bytes(_bytes(model))
    assert cli.main(["fuse", str(path), "-o", str(out)]) == 0
    assert "ops of unknown domains, left as they are: example.com::Frob" in capsys.readouterr().out
    out.unlink()
    assert cli.main(["fuse", str(path), "-o", str(out), "--verify"]) == 1
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("onnxnorm: error: --verify could not run the models in onnxruntime: ")
    assert "example.com:Frob" in line and line.endswith(f"{out} not kept")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


# --- float8 e4m3fn quantized nodes that cannot run ----------------------------------------------


def _float8_node(zero_point_shape=(), dynamic=False) -> onnx.ModelProto:
    """One onnxnorm quantized node with a float8 e4m3fn Y (opset 21, which has float8's
    QuantizeLinear): RMSNormQuantizeLinear with a float8 Y_zero_point of zero_point_shape, or
    RMSNormDynamicQuantizeLinear with its Y and Y_zero_point declared float8 (it gives uint8)."""
    scale = numpy_helper.from_array(np.random.default_rng(0).random(HIDDEN, np.float32) + 0.5, "g")
    f8 = TensorProto.FLOAT8E4M3FN
    if dynamic:
        node = helper.make_node(
            "RMSNormDynamicQuantizeLinear",
            ["x", "g"],
            ["q", "ys", "yz"],
            name="norm",
            domain=ops.DOMAIN,
        )
        outputs = [
            helper.make_tensor_value_info("q", f8, SHAPE),
            helper.make_tensor_value_info("ys", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("yz", f8, []),
        ]
        inits = [scale]
    else:
        node = helper.make_node(
            "RMSNormQuantizeLinear", ["x", "g", "", "s", "z"], ["q"], name="norm", domain=ops.DOMAIN
        )
        outputs = [helper.make_tensor_value_info("q", f8, SHAPE)]
        zero_point = np.zeros(zero_point_shape, np.float32).astype(ops.reference.FLOAT8_E4M3FN)
        inits = [
            scale,
            numpy_helper.from_array(np.array(0.1, np.float32), "s"),
            numpy_helper.from_array(zero_point, "z"),
        ]
    model = _model(
        nodes=[node], inits=inits, inputs=[_value("x")], outputs=outputs, domains=[ops.DOMAIN]
    )
    model.opset_import[0].version = 21
    return model


@pytest.mark.parametrize(
    "case, fragment",
    [
        (
            "zero point of shape [2]",
            "onnxnorm::RMSNormQuantizeLinear: Y_zero_point of shape [2] "
            "must be a scalar or a one-element 1-D tensor (per-tensor "
            "quantization)",
        ),
        (
            "dynamic op with float8 Y_zero_point",
            "Type (tensor(float8e4m3fn)) of output arg (q) of node "
            "(norm) does not match expected type (tensor(uint8))",
        ),
    ],
)
def test_float8_nodes_that_cannot_run_are_clear_errors(tmp_path, capsys, case, fragment):
    """A float8 e4m3fn Y_zero_point of the wrong shape (the kernel's per-tensor check), and a
    dynamic op asked for float8 (it quantizes to uint8 only; ONNX Runtime's type check): running
    the model fails with one line naming the problem; `fuse --verify` refuses in one line and
    keeps nothing. The same node with a float8 scalar zero point runs."""
    model = _float8_node((2,) if "shape" in case else (), dynamic="dynamic" in case)
    path, out = tmp_path / "model.onnx", tmp_path / "fused.onnx"
    path.write_bytes(_bytes(model))
    feeds = {"x": np.ones(SHAPE, np.float32)}
    with pytest.raises(Exception) as raised:
        runtime.session(path).run(None, feeds)
    assert fragment in _one_line(str(raised.value)), str(raised.value)
    assert cli.main(["fuse", str(path), "-o", str(out), "--verify"]) == 1
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("onnxnorm: error: --verify could not run the models in onnxruntime: ")
    assert fragment in line and line.endswith(f"{out} not kept"), line
    assert not out.exists()
    fine = _float8_node(())
    y = runtime.session(fine).run(None, feeds)[0]  # (float8 comes back as its uint8 bits)
    inits = {t.name: numpy_helper.to_array(t) for t in fine.graph.initializer}
    want = ops.reference.run(
        "RMSNormQuantizeLinear", feeds["x"], inits["g"], None, inits["s"], inits["z"]
    )[0]
    np.testing.assert_array_equal(y.view(np.uint8), want.view(np.uint8))


# --- external data that leaves the model's folder ----------------------------------------------

ESCAPES = {"dotdot": "../outside/w.bin", "absolute": None, "symlink": "link.bin"}

#: runs in a child process: a FIFO outside the folder blocks whoever opens it, so a run that
#: read it would never finish (the parent's timeout fails the test)
_ESCAPE_SCRIPT = textwrap.dedent("""
    import json, sys
    import onnx
    import onnxnorm.fusion
    from onnxnorm import OnnxNormError, cli, runtime
    from onnxnorm.fusion.verify import verify
    results = {}
    for name, path, out in json.loads(sys.argv[1]):
        entry = results[name] = {}
        import io, contextlib
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            entry["rc"] = cli.main(["fuse", path, "-o", out, "--verify"])
        entry["stderr"] = err.getvalue()
        try:
            verify(path, path)
        except OnnxNormError as error:
            entry["verify"] = str(error)
        proto = onnx.load(path, load_external_data=False)
        try:
            onnxnorm.fusion.fuse(proto, base_dir=path.rsplit("/", 1)[0])
        except OnnxNormError as error:
            entry["fuse"] = str(error)
        try:
            runtime.session(path)
        except OnnxNormError as error:
            entry["session"] = str(error)
    print(json.dumps(results))
""")


def test_external_data_outside_the_folder_is_refused_unread(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    target = outside / "w.bin"
    os.mkfifo(target)
    jobs = []
    for name, location in ESCAPES.items():
        folder = tmp_path / name
        folder.mkdir()
        if name == "symlink":
            os.symlink(target, folder / location)
        path = folder / "model.onnx"
        path.write_bytes(_bytes(_external(_model(), location or str(target))))
        jobs.append((name, str(path), str(tmp_path / f"{name}-fused.onnx")))
    result = subprocess.run(
        [sys.executable, "-c", _ESCAPE_SCRIPT, json.dumps(jobs)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    results = json.loads(result.stdout.strip().splitlines()[-1])
    expected = {
        "dotdot": "external data '../outside/w.bin' leaves the model's folder (refused, not read)",
        "absolute": f"external data '{target}' is an absolute path; only files in the "
        "model's folder are read (refused, not read)",
        "symlink": f"external data 'link.bin' is a symbolic link to {target}, outside "
        "the model's folder (refused, not read)",
    }
    for name, entry in results.items():
        assert entry["rc"] == 1
        assert expected[name] in _one_line(entry["stderr"]), entry["stderr"]
        for api in ("verify", "fuse", "session"):
            assert expected[name] in _one_line(entry.get(api, "")), (api, entry)
        assert not (tmp_path / f"{name}-fused.onnx").exists()
    assert sorted(p.name for p in outside.iterdir()) == ["w.bin"]


# --- onnxnorm export on hostile configurations -------------------------------------------------


@pytest.mark.parametrize(
    "config, fragment",
    [
        (
            '{"model_type": "llama", "hidden_size": 64, "num_attention_he',
            "not a readable Hugging Face config",
        ),
        ("[1, 2, 3]", "not a readable Hugging Face config"),
        (
            json.dumps(
                {
                    "model_type": "llama",
                    "hidden_size": 10**6,
                    "intermediate_size": 10**6,
                    "num_attention_heads": 4,
                    "num_hidden_layers": 2,
                    "vocab_size": 10**6,
                }
            ),
            # 2 V H + L (4 H^2 + 3 H I + 2 H) + H weights of 4 bytes
            ": LlamaForCausalLM: 16,000,005,000,000 weights need 59604.7 GiB, more than the",
        ),
        (
            json.dumps(
                {
                    "model_type": "llama",
                    "hidden_size": -64,
                    "num_attention_heads": 4,
                    "num_hidden_layers": 2,
                    "vocab_size": 100,
                }
            ),
            "transformers cannot build a model of type 'llama' (Trying to create tensor with "
            "negative dimension",
        ),
    ],
)
def test_export_refuses_hostile_configs(tmp_path, capsys, config, fragment):
    pytest.importorskip("transformers")
    source = tmp_path / "config.json"
    source.write_text(config)
    out = tmp_path / "out"
    out.mkdir()
    assert cli.main(["export", str(source), "-o", str(out / "model.onnx")]) == 1
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"onnxnorm: error: {source}") and fragment in line, line
    assert list(out.iterdir()) == []


def test_export_refuses_sizes_beyond_memory_before_allocating(tmp_path, capsys):
    pytest.importorskip("torch")
    out = tmp_path / "model.onnx"
    assert (
        cli.main(
            ["export", "llama", "--hidden", "200000", "--intermediate", "200000", "-o", str(out)]
        )
        == 1
    )
    line = _one_line(capsys.readouterr().err)
    assert "onnxnorm: error: Llama-style decoder: 560,001,000,000 weights need 2086.2 GiB" in line
    assert not out.exists()
