"""onnxnorm.nn.RMSNorm and onnxnorm.export: one onnxnorm node per norm module."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import onnxnorm
from onnxnorm import OnnxNormError, ops
from onnxnorm.nn import RMSNorm
from onnxnorm.ops import reference


class TwoNorms(torch.nn.Module):
    def __init__(self, hidden=16):
        super().__init__()
        self.first = RMSNorm(hidden, eps=1e-6)
        self.linear = torch.nn.Linear(hidden, hidden)
        self.second = RMSNorm(hidden, eps=1e-5, scale_offset=1.0)
        with torch.no_grad():
            self.first.weight.copy_(1 + 0.3 * torch.randn(hidden))
            self.second.weight.copy_(0.3 * torch.randn(hidden))

    def forward(self, x):
        return self.second(self.linear(self.first(x)))


def test_drop_in_for_torch_rmsnorm():
    theirs = torch.nn.RMSNorm(16, eps=1e-6)
    ours = RMSNorm(16, eps=1e-6)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    with torch.no_grad():
        theirs.weight.copy_(torch.randn(16))
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(3, 5, 16)
    torch.testing.assert_close(ours(x), theirs(x))
    # eps=None takes the input type's machine epsilon, as torch does
    torch.testing.assert_close(RMSNorm(16)(x), torch.nn.RMSNorm(16)(x))
    assert RMSNorm([4, 16], elementwise_affine=False).weight is None


def test_gemma_offset_starts_at_identity_scale():
    norm = RMSNorm(8, scale_offset=1.0)
    assert torch.equal(norm.weight, torch.zeros(8))
    x = torch.randn(2, 8)
    torch.testing.assert_close(norm(x), torch.nn.functional.rms_norm(x, (8,), eps=None))


def test_eager_matches_reference():
    norm = TwoNorms().second
    x = torch.randn(2, 5, 16)
    want = reference.run("RMSNorm", x.numpy(), norm.weight.detach().numpy(), epsilon=1e-5,
                         scale_offset=1.0)[0]
    np.testing.assert_allclose(norm(x).detach().numpy(), want, rtol=1e-5, atol=1e-5)


def test_wrong_input_shape_is_a_clear_error():
    with pytest.raises(ValueError, match=r"RMSNorm over \(16,\) got an input of shape \(2, 8\)"):
        RMSNorm(16)(torch.randn(2, 8))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.manual_seed(0)
    model = TwoNorms().eval()
    x = torch.randn(2, 5, 16)
    folder = tmp_path_factory.mktemp("export")
    paths = {}
    for mode in ("function", "fused"):
        paths[mode] = folder / f"{mode}.onnx"
        onnxnorm.export(model, (x,), paths[mode], mode=mode,
                        dynamic_shapes=({0: "batch", 1: "seq"},))
    return model, paths


@pytest.mark.parametrize("mode", ["function", "fused"])
def test_export_one_node_per_module(exported, mode):
    _, paths = exported
    model = onnx.load(paths[mode])
    norms = [n for n in model.graph.node if n.domain == ops.DOMAIN]
    assert [n.op_type for n in norms] == ["RMSNorm", "RMSNorm"]
    attrs = [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in norms]
    assert attrs[0]["epsilon"] == pytest.approx(1e-6) and attrs[0]["axis"] == -1
    assert attrs[1]["scale_offset"] == 1.0
    assert not any(n.op_type in ("Pow", "ReduceMean", "Sqrt") for n in model.graph.node)
    functions = sorted((f.domain, f.name, f.overload) for f in model.functions)
    expected = [(ops.DOMAIN, "RMSNorm", "scale"), (ops.DOMAIN, "RMSNorm", "scale_offset")]
    assert functions == (expected if mode == "function" else [])
    assert [n.overload for n in norms] == (["scale", "scale_offset"] if mode == "function" else ["", ""])
    onnx.checker.check_model(model, full_check=True)


def test_exported_function_runs_in_plain_ort_with_dynamic_shapes(exported):
    model, paths = exported
    x = torch.randn(3, 7, 16)
    sess = ort.InferenceSession(str(paths["function"]), providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    with torch.no_grad():
        np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-5, atol=1e-5)


def test_fused_mode_needs_the_library(exported):
    _, paths = exported
    with pytest.raises(Exception, match="RMSNorm"):
        ort.InferenceSession(str(paths["fused"]), providers=["CPUExecutionProvider"])


def test_export_bad_arguments(tmp_path):
    with pytest.raises(OnnxNormError, match="unknown export mode 'ort'"):
        onnxnorm.export(TwoNorms(), (torch.randn(1, 2, 16),), mode="ort")
    with pytest.raises(OnnxNormError, match="must be a torch.nn.Module"):
        onnxnorm.export(lambda x: x, (torch.randn(1, 2, 16),))
    with pytest.raises(OnnxNormError, match="opset_version must be >= 15"):
        onnxnorm.export(TwoNorms(), (torch.randn(1, 2, 16),), opset_version=13)
    with pytest.raises(OnnxNormError, match="does not exist"):
        onnxnorm.export(TwoNorms(), (torch.randn(1, 2, 16),), tmp_path / "no" / "m.onnx")
