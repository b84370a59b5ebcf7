"""External tensors outside the main graph's initializers (an If branch's initializer, a
Constant's value) are written with the output like the main graph's: in every ``--data`` mode
the output loads from where it is written and gives the input's results, and a model written
without external data holds their bytes. (They once kept their location relative to the input,
so that an output in another folder did not load.)"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T, helper, numpy_helper
from onnx.external_data_helper import _get_all_tensors, convert_model_to_external_data

from onnxnorm import cli
from onnxnorm._io import open_model, save_model

BIG = np.arange(4096, dtype=np.float32) / 7
CONSTANT = np.arange(2048, dtype=np.float32) / 3


def _model(folder):
    """An RMS norm to fuse, an If whose branch holds a 16 KiB initializer, and a Constant of
    8 KiB, every tensor of 1 KiB or more in ``m.data``."""
    then = helper.make_graph(
        [helper.make_node("Add", ["xs", "big"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", T.FLOAT, [4096])],
        initializer=[numpy_helper.from_array(BIG, "big")],
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["xs"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", T.FLOAT, [4096])],
    )
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1]),
        helper.make_node("Add", ["ms", "eps"], ["a"]),
        helper.make_node("Sqrt", ["a"], ["s"]),
        helper.make_node("Div", ["x", "s"], ["n"]),
        helper.make_node("Mul", ["n", "w"], ["y"]),
        helper.make_node("If", ["c"], ["z"], then_branch=then, else_branch=other),
        helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(CONSTANT, "k")),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", T.FLOAT, [2, 64]),
            helper.make_tensor_value_info("c", T.BOOL, []),
            helper.make_tensor_value_info("xs", T.FLOAT, [4096]),
        ],
        [
            helper.make_tensor_value_info("y", T.FLOAT, [2, 64]),
            helper.make_tensor_value_info("z", T.FLOAT, [4096]),
            helper.make_tensor_value_info("k", T.FLOAT, [2048]),
        ],
        initializer=[
            numpy_helper.from_array(np.linspace(0.5, 1.5, 64, dtype=np.float32), "w"),
            numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    convert_model_to_external_data(
        model, location="m.data", size_threshold=1024, convert_attribute=True
    )
    path = folder / "m.onnx"
    onnx.save(model, path)
    return path


def _locations(path) -> set[str]:
    tensors = _get_all_tensors(onnx.load(path, load_external_data=False))
    return {e.value for t in tensors for e in t.external_data if e.key == "location"}


def _check_runs(path):
    session = ort.InferenceSession(str(path))
    feeds = {
        "x": np.ones((2, 64), np.float32),
        "c": np.array(True),
        "xs": np.zeros(4096, np.float32),
    }
    _, z, k = session.run(None, feeds)
    np.testing.assert_array_equal(z, BIG)
    np.testing.assert_array_equal(k, CONSTANT)


@pytest.mark.parametrize(
    "mode, where",
    [("copy", "other"), ("copy", "same"), ("reference", "same"), ("link", "same")],
)
def test_every_data_mode(tmp_path, mode, where):
    (tmp_path / "in").mkdir()
    source = _model(tmp_path / "in")
    before = (tmp_path / "in" / "m.data").read_bytes()
    folder = tmp_path / ("out" if where == "other" else "in")
    folder.mkdir(exist_ok=True)
    out = folder / "fused.onnx"
    assert _locations(source) == {"m.data"}
    assert cli.main(["fuse", str(source), "-o", str(out), "--data", mode]) == 0
    _check_runs(out)
    ops = [n.op_type for n in onnx.load(out, load_external_data=False).graph.node]
    assert "RMSNorm" in ops
    expected = {"m.data"} if mode == "reference" else {"fused.onnx.data"}
    assert _locations(out) == expected
    assert (tmp_path / "in" / "m.data").read_bytes() == before


def test_written_without_external_data(tmp_path):
    source = _model(tmp_path)
    out = tmp_path / "sub" / "inline.onnx"
    out.parent.mkdir()
    save_model(open_model(source).model, out, source=source, external=False)
    assert _locations(out) == set()
    _check_runs(out)
