"""The catalogue: the numpy reference against torch, the ONNX function bodies (run by plain
onnxruntime) against the reference, and the onnx schemas."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from helpers import feeds_for, reference_outputs, single_node_model
from onnxnorm import ops
from onnxnorm.ops import functions, reference

SHAPE = (2, 3, 16)


def _arrays(op, present, rng, axis=-1, dtype=np.float32, stat_shape=None):
    spec = ops.OPS[op]
    suffix = SHAPE[axis:] if stat_shape is None else stat_shape
    arrays = {"X": rng.standard_normal(SHAPE).astype(dtype)}
    if spec.skip:
        arrays["Residual"] = rng.standard_normal(SHAPE).astype(dtype)
    for name in present:
        arrays[name] = (1 + 0.5 * rng.standard_normal(suffix)).astype(dtype)
    return arrays


def _attribute_cases(spec):
    cases = [{}, {"axis": -2, "epsilon": 1e-3}]
    if "scale_offset" in spec.defaults:
        cases.append({"scale_offset": 1.0})
    if spec.skip:
        cases.append({"alpha": 2.5})
    return cases


def _cases():
    for name, spec in ops.OPS.items():
        presences = [()] + [(n,) for n in spec.optional_inputs] + [spec.optional_inputs]
        for present, attrs, opset in itertools.product(presences, _attribute_cases(spec),
                                                       (17, 18, 23)):
            yield pytest.param(name, present, attrs, opset,
                               id=f"{name}-{'+'.join(present) or 'none'}-{attrs}-opset{opset}")


@pytest.mark.parametrize("op, present, attrs, opset", _cases())
def test_function_body_matches_reference_float32(op, present, attrs, opset, rng):
    arrays = _arrays(op, present, rng, axis=attrs.get("axis", -1))
    model = single_node_model(op, arrays, attrs, opset=opset)
    onnx.checker.check_model(model, full_check=True)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, feeds_for(arrays))
    want = reference_outputs(op, arrays, attrs)
    assert len(got) == len(want) == len(ops.OPS[op].outputs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, *reference.tolerance(np.float32))


def test_per_head_scale_spans_more_dims_than_statistics(rng):
    """Cohere's per-head Q/K norm: statistics over head_dim, Scale of shape [heads, head_dim]."""
    arrays = _arrays("LayerNorm", ("Scale",), rng, stat_shape=SHAPE[1:])
    want = reference_outputs("LayerNorm", arrays)[0]
    rows = arrays["X"].astype(np.float64)
    manual = (rows - rows.mean(-1, keepdims=True)) / np.sqrt(rows.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(want, (manual * arrays["Scale"]).astype(np.float32), rtol=1e-6)
    model = single_node_model("LayerNorm", arrays)
    got = ort.InferenceSession(model.SerializeToString()).run(None, feeds_for(arrays))[0]
    np.testing.assert_allclose(got, want, *reference.tolerance(np.float32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_reference_matches_torch(dtype, rng):
    x = torch.from_numpy(rng.standard_normal(SHAPE).astype(np.float32)).to(dtype)
    w = torch.from_numpy(rng.standard_normal(SHAPE[-1:]).astype(np.float32)).to(dtype)
    b = torch.from_numpy(rng.standard_normal(SHAPE[-1:]).astype(np.float32)).to(dtype)
    tol = reference.tolerance(x.numpy().dtype)
    rms = reference.run("RMSNorm", x.numpy(), w.numpy(), epsilon=1e-6)[0]
    torch_rms = torch.nn.functional.rms_norm(x.float(), SHAPE[-1:], w.float(), eps=1e-6).to(dtype)
    np.testing.assert_allclose(rms.astype(np.float32), torch_rms.float().numpy(), *tol)
    ln = reference.run("LayerNorm", x.numpy(), w.numpy(), b.numpy(), epsilon=1e-5)[0]
    torch_ln = torch.nn.functional.layer_norm(x.float(), SHAPE[-1:], w.float(), b.float()).to(dtype)
    np.testing.assert_allclose(ln.astype(np.float32), torch_ln.float().numpy(), *tol)


def test_reference_order_a_is_llama_rounding(rng):
    """cast_before_scale=1 reproduces Hugging Face's LlamaRMSNorm in float16
    (to one unit in the last place: torch takes rsqrt in float32, the reference in float64)."""
    x = torch.from_numpy(rng.standard_normal((4, 64)).astype(np.float16))
    w = torch.from_numpy((1 + rng.standard_normal(64)).astype(np.float16))
    h = x.float()
    llama = w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.float16)
    ours = reference.run("RMSNorm", x.numpy(), w.numpy(), epsilon=1e-6, cast_before_scale=1)[0]
    assert (np.abs(ours.astype(np.float32) - llama.float().numpy()) <= 1e-3 * np.abs(ours)).all()


def test_reference_layer_norm_large_mean_small_spread(rng):
    x = (1e4 + 1e-2 * rng.standard_normal((4, 256))).astype(np.float32)
    got = reference.run("LayerNorm", x, epsilon=0.0)[0]
    exact = x.astype(np.float64)
    exact = (exact - exact.mean(-1, keepdims=True)) / exact.std(-1, keepdims=True)
    np.testing.assert_allclose(got, exact, atol=1e-5)


@pytest.mark.parametrize("attrs, message", [
    ({"axis": 3}, "axis 3 is out of range"),
    ({"epsilon": -1.0}, "epsilon must be a finite number >= 0"),
    ({"cast_before_scale": 2}, "cast_before_scale must be 0 or 1"),
    ({"gamma": 1.0}, "unknown attribute"),
])
def test_reference_rejects_bad_attributes(attrs, message, rng):
    with pytest.raises(ValueError, match=message):
        reference.run("RMSNorm", rng.standard_normal(SHAPE).astype(np.float32), **attrs)


def test_reference_rejects_scale_that_does_not_fit(rng):
    x = rng.standard_normal(SHAPE).astype(np.float32)
    with pytest.raises(ValueError, match=r"Scale of shape \(3,\) does not fit X"):
        reference.run("RMSNorm", x, np.ones(3, np.float32))


def test_overload_names_variant():
    spec = ops.OPS["SkipRMSNorm"]
    assert functions.overload(spec, ["Scale", "XBias"], 1) == "scale_xbias_a"
    assert functions.overload(spec, [], 0) == "none"


def test_schemas_registered_for_every_op():
    for name, spec in ops.OPS.items():
        schema = onnx.defs.get_schema(name, ops.VERSION, ops.DOMAIN)
        assert [i.name for i in schema.inputs] == [p.name for p in spec.inputs]
        assert [o.name for o in schema.outputs] == [p.name for p in spec.outputs]
        assert set(schema.attributes) == {a.name for a in spec.attributes}


def test_function_bodies_need_opset_15():
    with pytest.raises(ValueError, match="opset >= 15"):
        functions.function_proto("RMSNorm", "scale", 14)


def _checked(node, inputs):
    graph = onnx.helper.make_graph(
        [node], "g", [onnx.helper.make_tensor_value_info(n, t, [2, 8]) for n, t in inputs],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 8])])
    model = onnx.helper.make_model(graph, opset_imports=[
        onnx.helper.make_opsetid("", 18), onnx.helper.make_opsetid(ops.DOMAIN, ops.VERSION)])
    onnx.checker.check_model(model, full_check=True)


F32, F16 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16


@pytest.mark.parametrize("op, inputs, attrs, types, message", [
    ("RMSNorm", ["x"], {"gamma": 1.0}, [F32], "Unrecognized attribute: gamma"),
    ("RMSNorm", ["x"] * 4, {}, [F32], "input size 4 not in range"),
    ("RMSNorm", ["x"], {"axis": 1.5}, [F32], "Mismatched attribute type .*axis"),
    ("RMSNorm", ["x"], {"axis": 2}, [F32], "axis 2 is out of range for X of rank 2"),
    ("SkipRMSNorm", ["x", "r"], {}, [F32, F16], "Residual must be FLOAT .*got FLOAT16"),
    ("LayerNorm", ["x", "r"], {}, [F32, F16], "Scale must be FLOAT .*got FLOAT16"),
    ("SkipLayerNorm", ["x", "r"], {"alpha": 1}, [F32, F32], "Mismatched attribute type .*alpha"),
])
def test_checker_names_node_and_problem(op, inputs, attrs, types, message):
    node = onnx.helper.make_node(op, inputs, ["y"], name="bad_node", domain=ops.DOMAIN, **attrs)
    names = list(dict.fromkeys(inputs))
    with pytest.raises(Exception, match=message) as error:
        _checked(node, list(zip(names, types)))
    assert "bad_node" in str(error.value)


def test_shape_inference_gives_outputs_x_type_and_shape():
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("SkipRMSNorm", ["x", "r", "s"], ["y", "sum"], domain=ops.DOMAIN)],
        "g", [onnx.helper.make_tensor_value_info("x", F16, ["batch", 8]),
              onnx.helper.make_tensor_value_info("r", F16, ["batch", 8]),
              onnx.helper.make_tensor_value_info("s", F32, [8])],
        [onnx.helper.make_value_info("y", onnx.TypeProto()),
         onnx.helper.make_value_info("sum", onnx.TypeProto())])
    model = onnx.helper.make_model(graph, opset_imports=[
        onnx.helper.make_opsetid("", 18), onnx.helper.make_opsetid(ops.DOMAIN, ops.VERSION)])
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    for output in inferred.graph.output:
        assert output.type.tensor_type.elem_type == F16
        assert [d.dim_param or d.dim_value for d in output.type.tensor_type.shape.dim] == ["batch", 8]
