"""The norm spellings the rules learned from other people's models, shown on exports made here
with both PyTorch exporters, dynamic batch and sequence, float32 and float16: a norm whose
epsilon Add the dynamo export drops (a 1e-12 epsilon), the mean written as a sum divided by
the row's length (a constant, or ``x.shape[-1]`` as TorchScript computes it from the shape),
and the L2 norm's sum of squares."""

from __future__ import annotations

import io
import warnings

import onnx
import pytest
import torch
from onnx import helper

from onnxnorm.fusion import fuse
from onnxnorm.fusion.verify import verify
from onnxnorm.nn.exporter import quiet_export

pytestmark = pytest.mark.slow

EXPORTERS = ("dynamo", "torchscript")
DTYPES = (torch.float32, torch.float16)


class TinyEpsilonRMSNorm(torch.nn.Module):
    """An RMSNorm of epsilon 1e-12, as a 2026 MoE family configures it."""

    def __init__(self, width: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(width) + 0.5)

    def forward(self, x):
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-12)
        return self.weight * normed.to(x.dtype)


class SumOverLengthRMSNorm(torch.nn.Module):
    """The mean of squares written as their sum over the row's length."""

    def __init__(self, width: int | None):
        super().__init__()
        self.weight = None if width is None else torch.nn.Parameter(torch.rand(width) + 0.5)

    def forward(self, x):
        xf = x.float()
        mean = xf.pow(2).sum(-1, keepdim=True) / x.shape[-1]
        normed = (xf * torch.rsqrt(mean + 1e-6)).to(x.dtype)
        return normed if self.weight is None else self.weight * normed


class SumOverOtherDim(torch.nn.Module):
    """A near miss: the sum of squares over the last axis divided by the length of another."""

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) / x.shape[-2] + 1e-6)).to(x.dtype)


class L2Norm(torch.nn.Module):
    def forward(self, x):
        return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def _export(module, dtype, exporter, dynamic_last=False):
    x = torch.randn(2, 5, 64, dtype=dtype)
    module = module.to(dtype)
    axes = {0: "batch", 1: "sequence", **({2: "width"} if dynamic_last else {})}
    with quiet_export(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            dims = {i: torch.export.Dim(name) for i, name in axes.items()}
            return torch.onnx.export(
                module, (x,), dynamo=True, input_names=["x"], dynamic_shapes=(dims,)
            ).model_proto
        buffer = io.BytesIO()
        torch.onnx.export(
            module, (x,), buffer, dynamo=False, input_names=["x"],
            dynamic_axes={"x": axes}, opset_version=17,
        )  # fmt: skip
        return onnx.load_from_string(buffer.getvalue())


def _fused(model):
    fused, report = fuse(model, "function")
    checks = verify(model, fused)
    assert checks and all(c.ok for c in checks), [str(c) for c in checks]
    nodes = [n for n in fused.graph.node if n.domain == "onnxnorm"]
    return nodes, report


def _epsilon(node) -> float:
    (value,) = [helper.get_attribute_value(a) for a in node.attribute if a.name == "epsilon"]
    return value


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_tiny_epsilon(exporter, dtype):
    """The dynamo export drops the Add of 1e-12 (below float32's resolution at the mean's
    scale): the norm of epsilon 0; TorchScript keeps it: epsilon 1e-12."""
    model = _export(TinyEpsilonRMSNorm(64), dtype, exporter)
    added = any(n.op_type == "Add" for n in model.graph.node)
    (node,), _ = _fused(model)
    assert node.op_type == "RMSNorm"
    assert _epsilon(node) == pytest.approx(1e-12 if added else 0.0, rel=1e-6, abs=0)
    if exporter == "dynamo":
        assert not added, "the dynamo export kept the epsilon Add: this test no longer shows it"


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_sum_over_the_row_length(exporter, dtype):
    model = _export(SumOverLengthRMSNorm(64), dtype, exporter)
    ops = {n.op_type for n in model.graph.node}
    assert "ReduceSum" in ops and "ReduceMean" not in ops
    if exporter == "torchscript":
        assert {"Shape", "Gather"} <= ops  # x.shape[-1], computed from the shape
    (node,), report = _fused(model)
    assert node.op_type == "RMSNorm", str(report)


def test_sum_over_a_dynamic_row_length():
    """A weightless norm over a last dim that is dynamic: dividing by x.shape[-1] is the mean
    whatever that dim is."""
    model = _export(SumOverLengthRMSNorm(None), torch.float32, "torchscript", dynamic_last=True)
    width = model.graph.input[0].type.tensor_type.shape.dim[2]
    assert width.dim_param, "the last dim is not dynamic"
    (node,), _ = _fused(model)
    assert node.op_type == "RMSNorm"


def test_sum_over_another_dim_is_not_the_mean():
    model = _export(SumOverOtherDim(), torch.float32, "torchscript")
    nodes, report = _fused(model)
    assert nodes == [], str(report)


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_l2_norm_sum_of_squares(exporter, dtype):
    (node,), _ = _fused(_export(L2Norm(), dtype, exporter))
    assert node.op_type == "L2Norm"
