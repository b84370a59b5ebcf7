"""``onnxnorm triton``: Triton model repositories for the ONNX Runtime backend. Each config is
checked line by line, and every config written here parses with Triton's own model-config
schema (tritonclient's model_config_pb2, in the serve venv) to the values expected."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxnorm import ops, runtime
from onnxnorm.serve import signature
from onnxnorm.serve.triton import api_requirement, first_triton_release
from tests.support.serve_harness import run_client

HIDDEN = 16


def _norm_model(
    x_dims, *, functions: bool = False, extra_outputs=(), name="x", second_input_dims=None
) -> onnx.ModelProto:
    """X -> onnxnorm RMSNorm (scale an initializer) -> Y, the fused target by default (no
    function body: it runs only with the onnxnorm library)."""
    scale = numpy_helper.from_array(np.linspace(0.5, 1.5, HIDDEN, dtype=np.float32), "scale")
    nodes = [helper.make_node("RMSNorm", [name, "scale"], ["y"], domain=ops.DOMAIN, epsilon=1e-6)]
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, x_dims)]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, x_dims)]
    if second_input_dims is not None:
        inputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, second_input_dims))
        nodes.append(helper.make_node("Identity", ["z"], ["z_out"]))
        outputs.append(helper.make_tensor_value_info("z_out", TensorProto.FLOAT, second_input_dims))
    for out in extra_outputs:
        nodes.append(helper.make_node("ReduceMean", ["y"], [out], keepdims=0))
        outputs.append(helper.make_tensor_value_info(out, TensorProto.FLOAT, []))
    graph = helper.make_graph(nodes, "norm", inputs, outputs, [scale])
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(ops.DOMAIN, ops.VERSION)],
    )
    return ops.attach_functions(model) if functions else model


def _plain_model() -> onnx.ModelProto:
    """No onnxnorm node: served by ONNX Runtime alone."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["a"], ["b"])],
        "plain",
        [helper.make_tensor_value_info("a", TensorProto.INT32, ["n", 3])],
        [helper.make_tensor_value_info("b", TensorProto.INT32, ["n", 3])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "onnxnorm", "triton", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _config(repo, name) -> str:
    return (repo / name / "config.pbtxt").read_text()


def _version() -> int:
    return int(runtime.build_info()["ort_api_version"])


def test_api_requirement_names_the_library_s_api_and_the_first_triton_release():
    version, sentence = api_requirement()
    assert version == _version() == 21  # built against the 1.21 headers (docs/development.md)
    assert first_triton_release(21) == ("25.03", "1.21.0")
    assert first_triton_release(20) == ("24.12", "1.20.1")
    assert first_triton_release(22) == ("25.05", "1.22.0")
    assert first_triton_release(99) is None
    assert sentence == (
        "the onnxnorm library asks ONNX Runtime for C API version 21, so the "
        "ONNX Runtime bundled by Triton's onnxruntime backend must be 1.21 or "
        "newer: Triton 25.03 or newer (25.03 bundles ONNX Runtime 1.21.0)"
    )


def test_signature_finds_the_batch_dim_or_says_why_not():
    assert signature(_norm_model(["batch", "seq", HIDDEN])).batch
    sig = signature(_norm_model([2, "seq", HIDDEN]))
    assert not sig.batch and sig.why_not == "the first dim of 'x' is fixed (2)"
    sig = signature(_norm_model(["b", HIDDEN], second_input_dims=["n", 4]))
    assert not sig.batch and sig.why_not == "the inputs' first dims have different names (b, n)"
    sig = signature(_norm_model(["b", HIDDEN], second_input_dims=["m", "b"]))
    assert not sig.batch and sig.why_not.startswith("the inputs' first dims have different")
    sig = signature(_norm_model(["b", HIDDEN], second_input_dims=["b", "b"]))
    assert sig.why_not == "dim 1 of 'z' is the first dims' 'b': requests cannot be stacked along it"
    sig = signature(_norm_model(["b", HIDDEN], extra_outputs=["mean"]))
    assert not sig.batch and sig.why_not == "'mean' is a scalar"
    spec = signature(_norm_model(["batch", None, HIDDEN])).inputs[0]
    assert spec.dims == (-1, -1, HIDDEN) and spec.symbols == ("batch", "", "")


def test_signature_leaves_out_initializers_listed_as_inputs_sparse_ones_too():
    model = _norm_model(["b", HIDDEN])
    values = numpy_helper.from_array(np.ones(2, dtype=np.float32), "bias")
    indices = numpy_helper.from_array(np.array([0, 3], dtype=np.int64), "bias_indices")
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [HIDDEN]))
    model.graph.input.append(helper.make_tensor_value_info("bias", TensorProto.FLOAT, [HIDDEN]))
    model.graph.input.append(helper.make_tensor_value_info("scale", TensorProto.FLOAT, [HIDDEN]))
    assert [spec.name for spec in signature(model).inputs] == ["x"]


def test_decoder_repository_cpu(tmp_path):
    model = tmp_path / "decoder_fused.onnx"
    onnx.save(_norm_model(["batch", "sequence", HIDDEN]), model)
    repo = tmp_path / "repo"
    result = _cli(model, "-o", repo, "--json", tmp_path / "r.json")
    assert result.returncode == 0, result.stderr
    folder = repo / "decoder_fused"
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == [
        "1/model.onnx",
        "config.pbtxt",
        "libonnxnorm_ops.so",
    ]
    assert (folder / "1" / "model.onnx").read_bytes() == model.read_bytes()
    assert (folder / "libonnxnorm_ops.so").read_bytes() == runtime.library_path().read_bytes()
    library = str((folder / "libonnxnorm_ops.so").absolute())
    config = _config(repo, "decoder_fused")
    body = [line for line in config.splitlines() if not line.startswith("#")]
    assert body == [
        'name: "decoder_fused"',
        'platform: "onnxruntime_onnx"',
        "max_batch_size: 8",
        "input [",
        "  {",
        '    name: "x"',
        "    data_type: TYPE_FP32",
        "    dims: [ -1, 16 ]",
        "  }",
        "]",
        "output [",
        "  {",
        '    name: "y"',
        "    data_type: TYPE_FP32",
        "    dims: [ -1, 16 ]",
        "  }",
        "]",
        "dynamic_batching { }",
        "instance_group [",
        "  {",
        "    count: 1",
        "    kind: KIND_CPU",
        "  }",
        "]",
        "model_operations {",
        f'  op_library_filename: "{library}"',
        "}",
    ]
    comments = " ".join(line[2:] for line in config.splitlines() if line.startswith("# "))
    assert (
        "asks ONNX Runtime for C API version 21, so the ONNX Runtime bundled by Triton's "
        "onnxruntime backend must be 1.21 or newer: Triton 25.03 or newer" in comments
    )
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["ort_api_version"] == 21 and report["repository"] == str(repo.absolute())
    (entry,) = report["models"]
    assert entry["max_batch_size"] == 8 and entry["libraries"] == [library]
    assert entry["inputs"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [-1, 16]}]
    assert f"start: tritonserver --model-repository {repo.absolute()}" in result.stdout
    # the model served this way cannot run without the library: no function body
    assert not onnx.load(folder / "1" / "model.onnx").functions


def test_gpu_instances_served_from_a_mount(tmp_path):
    model = tmp_path / "enc.onnx"
    onnx.save(_norm_model(["batch", "sequence", HIDDEN], functions=True), model)
    repo = tmp_path / "repo"
    result = _cli(
        model,
        "-o",
        repo,
        "--name",
        "encoder",
        "--gpu",
        "--instances",
        "2",
        "--max-batch-size",
        "32",
        "--served-from",
        "/models",
    )
    try:
        runtime.library_path("cuda")
    except Exception:  # noqa: BLE001 - a build without nvcc: --gpu says so in one line
        assert result.returncode == 1 and "--gpu needs the onnxnorm CUDA library" in result.stderr
        return
    assert result.returncode == 0, result.stderr
    config = _config(repo, "encoder")
    assert "    count: 2\n    kind: KIND_GPU\n" in config and "max_batch_size: 32\n" in config
    assert 'op_library_filename: "/models/encoder/libonnxnorm_ops.so"' in config
    assert (repo / "encoder" / "libonnxnorm_cuda_ops.so").read_bytes() == runtime.library_path(
        "cuda"
    ).read_bytes()


def test_fixed_batch_scalars_folders_and_external_data(tmp_path):
    source = tmp_path / "models"
    source.mkdir()
    onnx.save(_norm_model([2, "sequence", HIDDEN], extra_outputs=["mean"]), source / "fixed.onnx")
    big = _norm_model(["batch", HIDDEN])
    onnx.save(
        big,
        source / "ext.onnx",
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="ext.weights",
        size_threshold=0,
    )
    onnx.save(_plain_model(), source / "plain.onnx")
    repo = tmp_path / "repo"
    result = _cli(source, "-o", repo)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in repo.iterdir()) == ["ext", "fixed", "plain"]
    fixed = _config(repo, "fixed")
    assert "max_batch_size: 0\n" in fixed and "dynamic_batching" not in fixed
    assert "    dims: [ 2, -1, 16 ]\n" in fixed
    assert (
        '    name: "mean"\n    data_type: TYPE_FP32\n    dims: [ 1 ]\n    reshape: { shape: [ ] }'
    ) in fixed
    assert "no batching (the first dim of 'x' is fixed (2))" in result.stdout
    assert (repo / "ext" / "1" / "ext.weights").read_bytes() == (
        source / "ext.weights"
    ).read_bytes()
    # the copy runs from its own folder (its weights found beside it)
    x = np.random.default_rng(0).standard_normal((3, HIDDEN)).astype(np.float32)
    want = runtime.session(source / "ext.onnx").run(None, {"x": x})[0]
    have = runtime.session(repo / "ext" / "1" / "model.onnx").run(None, {"x": x})[0]
    np.testing.assert_array_equal(have, want)
    plain = _config(repo, "plain")
    assert "model_operations" not in plain and "C API" not in plain
    assert "TYPE_INT32" in plain and not (repo / "plain" / "libonnxnorm_ops.so").exists()
    assert "plain (" in result.stdout and "no onnxnorm node: no library" in result.stdout


def test_one_line_errors_and_overwrite(tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(_norm_model([4, HIDDEN]), model)
    repo = tmp_path / "repo"
    result = _cli(model, "-o", repo, "--max-batch-size", "4")
    assert result.returncode == 1 and result.stderr.strip() == (
        f"onnxnorm: error: {model}: --max-batch-size 4 needs a free batch dim first in every "
        "input and output, but the first dim of 'x' is fixed (4); pass --max-batch-size 0"
    )
    assert not repo.exists()
    assert _cli(model, "-o", repo).returncode == 0
    before = _config(repo, "m")
    (repo / "other").mkdir()  # another model of the repository: left alone
    (repo / "other" / "config.pbtxt").write_text('name: "other"\n')
    result = _cli(model, "-o", repo)
    assert (
        result.returncode == 1
        and result.stderr.strip()
        == f"onnxnorm: error: {repo / 'm'} exists; pass --overwrite to replace it"
    )
    onnx.save(_norm_model(["n", HIDDEN]), model)
    assert _cli(model, "-o", repo, "--overwrite").returncode == 0
    assert _config(repo, "m") != before and "max_batch_size: 8" in _config(repo, "m")
    assert (repo / "other" / "config.pbtxt").read_text() == 'name: "other"\n'
    for args, message in [
        ((tmp_path / "missing.onnx", "-o", repo), "no such file or folder"),
        ((model, "-o", repo, "--name", "bad name"), "--name 'bad name': use letters"),
        ((model, "-o", repo, "--instances", "0"), "--instances must be 1 or more"),
        (
            (model, "-o", repo / "x", "--served-from", "models"),
            "--served-from models: give the absolute path",
        ),
        ((model, "-o", tmp_path / "no" / "repo"), "does not exist"),
    ]:
        result = _cli(*args)
        assert result.returncode == 1, args
        assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr, (
            result.stderr
        )
    folder = tmp_path / "two"
    folder.mkdir()
    for stem in ("a", "b"):
        onnx.save(_plain_model(), folder / f"{stem}.onnx")
    result = _cli(folder, "-o", repo, "--name", "one")
    assert result.returncode == 1 and "--name names one model, but" in result.stderr


def test_every_config_parses_with_triton_s_schema(tmp_path):
    """The configs as Triton reads them: model_config_pb2 with protobuf's text format."""
    cases = {}
    for name, model, args in [
        ("decoder", _norm_model(["batch", "sequence", HIDDEN]), ()),
        ("fixed", _norm_model([2, HIDDEN], extra_outputs=["mean"]), ()),
        (
            "gpu",
            _norm_model(["batch", HIDDEN]),
            ("--gpu", "--instances", "3", "--served-from", "/models"),
        ),
        ("plain", _plain_model(), ("--max-batch-size", "0")),
    ]:
        path = tmp_path / f"{name}.onnx"
        onnx.save(model, path)
        result = _cli(path, "-o", tmp_path / "repo", *args)
        if result.returncode and "--gpu needs" in result.stderr:
            continue  # no CUDA library in this build
        assert result.returncode == 0, result.stderr
        cases[name] = str(tmp_path / "repo" / name / "config.pbtxt")
    (parsed,) = run_client(
        [{"action": "schema", "configs": list(cases.values())}], tmp_path / "client"
    )
    decoder = parsed[cases["decoder"]]
    library = str(tmp_path / "repo" / "decoder" / "libonnxnorm_ops.so")
    assert decoder == {
        "name": "decoder",
        "platform": "onnxruntime_onnx",
        "max_batch_size": 8,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": ["-1", "16"]}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": ["-1", "16"]}],
        "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
        "dynamic_batching": {},
        "model_operations": {"op_library_filename": [library]},
    }
    fixed = parsed[cases["fixed"]]
    assert "max_batch_size" not in fixed and "dynamic_batching" not in fixed  # 0: the default
    assert fixed["output"][1] == {
        "name": "mean",
        "data_type": "TYPE_FP32",
        "dims": ["1"],
        "reshape": {},
    }
    assert fixed["input"][0]["dims"] == ["2", "16"]
    plain = parsed[cases["plain"]]
    assert "model_operations" not in plain and plain["input"][0]["dims"] == ["-1", "3"]
    if "gpu" in cases:
        gpu = parsed[cases["gpu"]]
        assert gpu["instance_group"] == [{"count": 3, "kind": "KIND_GPU"}]
        assert gpu["model_operations"] == {
            "op_library_filename": ["/models/gpu/libonnxnorm_ops.so"]
        }


def test_help_lists_the_command():
    result = subprocess.run(
        [sys.executable, "-m", "onnxnorm", "--help"], capture_output=True, text=True, timeout=60
    )
    assert "triton" in result.stdout and "Triton Inference Server model repository" in result.stdout


def test_serving_without_pytriton_is_one_line(tmp_path):
    """The main venv has no PyTriton: python -m onnxnorm.serve says what to install."""
    pytest.importorskip("onnxruntime")
    if importlib.util.find_spec("pytriton") is not None:
        pytest.skip("PyTriton is installed here")
    model = tmp_path / "m.onnx"
    onnx.save(_norm_model(["n", HIDDEN]), model)
    result = subprocess.run(
        [sys.executable, "-m", "onnxnorm.serve", str(model)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1 and result.stderr.strip() == (
        "onnxnorm.serve: error: python -m onnxnorm.serve needs pytriton, which is not "
        "installed: pip install 'onnxnorm[serve]'"
    )
