"""The catalogue: the numpy reference against torch, the ONNX function bodies (run by plain
onnxruntime) against the reference, and the onnx schemas."""

from __future__ import annotations

import functools
import itertools
import re

import numpy as np
import onnx
import pytest
import torch

from onnxnorm import ops
from onnxnorm.ops import functions, reference
from onnxnorm.testing.graphs import single_node_model
from tests.support.helpers import assert_close, assert_float8_equal, reference_outputs, run
from tests.support.matrix import DTYPES, TARGETS_WITHOUT_LIBRARY, torch_to_numpy

SHAPE = (2, 3, 16)


def _arrays(op, present, rng, axis=-1, dtype=np.float32, stat_shape=None):
    spec = ops.OPS[op]
    suffix = SHAPE[axis:] if stat_shape is None else stat_shape
    arrays = {"X": rng.standard_normal(SHAPE).astype(dtype)}
    if spec.has_residual:
        arrays["Residual"] = rng.standard_normal(SHAPE).astype(dtype)
    for name in present:
        if name == "Gate":  # of X's shape, spread so that the activation's range shows
            arrays[name] = (2 * rng.standard_normal(SHAPE)).astype(dtype)
        else:
            arrays[name] = (1 + 0.5 * rng.standard_normal(suffix)).astype(dtype)
    return arrays


def _attribute_cases(spec):
    cases = [{}, {"axis": -2, "epsilon": 1e-3}]
    if "scale_offset" in spec.defaults:
        cases.append({"scale_offset": 1.0})
    if "alpha" in spec.defaults:
        cases.append({"alpha": 2.5})
    if spec.gated:
        cases += [
            {"group_size": 8},
            {"activation": 1},
            {"norm_before_gate": 0, "group_size": 4, "epsilon": 1e-6},
        ]
    return cases


def _cases():
    for name, spec in ops.catalogue.FLOAT_OPS.items():
        presences = [()] + [(n,) for n in spec.optional_inputs] + [spec.optional_inputs]
        for present, attrs, opset, dtype, order in itertools.product(
            presences, _attribute_cases(spec), (17, 18, 23), DTYPES, (0, 1)
        ):
            if "cast_before_scale" not in spec.defaults:
                if order:
                    continue
            else:
                attrs = {**attrs, "cast_before_scale": order}
            yield pytest.param(
                name,
                present,
                attrs,
                opset,
                dtype,
                id=f"{name}-{'+'.join(present) or 'none'}-{attrs}-opset{opset}-{dtype}",
            )


@pytest.mark.parametrize("op, present, attrs, opset, dtype", _cases())
def test_function_body_matches_reference(op, present, attrs, opset, dtype, rng):
    """Every op, dtype, optional input and attribute class: the ONNX function body, run by
    plain onnxruntime, against the numpy reference."""
    arrays = _arrays(op, present, rng, axis=attrs.get("axis", -1), dtype=DTYPES[dtype])
    model = single_node_model(op, arrays, attrs, opset=opset)
    onnx.checker.check_model(model, full_check=True)
    got = run(model, arrays)
    want = reference_outputs(op, arrays, attrs)
    assert len(got) == len(want) == len(ops.OPS[op].outputs)
    for g, w in zip(got, want):
        assert_close(g, w)


@pytest.mark.parametrize("opset", [16, 17, 18])
def test_function_body_layer_norm_large_mean_small_spread(opset, rng):
    """mean 1e4, std 1e-2: a one-pass E[x^2] - E[x]^2 in float32 would lose every digit."""
    arrays = {"X": (1e4 + 1e-2 * rng.standard_normal((4, 256))).astype(np.float32)}
    got = run(single_node_model("LayerNorm", arrays, opset=opset), arrays)[0]
    np.testing.assert_allclose(got, reference_outputs("LayerNorm", arrays)[0], atol=1e-3)


def test_per_head_scale_spans_more_dims_than_statistics(rng):
    """Cohere's per-head Q/K norm: statistics over head_dim, Scale of shape [heads, head_dim]."""
    arrays = _arrays("LayerNorm", ("Scale",), rng, stat_shape=SHAPE[1:])
    want = reference_outputs("LayerNorm", arrays)[0]
    rows = arrays["X"].astype(np.float64)
    manual = (rows - rows.mean(-1, keepdims=True)) / np.sqrt(rows.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(want, (manual * arrays["Scale"]).astype(np.float32), rtol=1e-6)
    assert_close(run(single_node_model("LayerNorm", arrays), arrays)[0], want)


def _llama(x, w, eps):
    h = x.float()
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _gemma(x, w, eps):
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * (1.0 + w.float())).type_as(x)


def _t5(x, w, eps):
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(variance + eps)).to(w.dtype)


HF_STYLES = {  # module as Hugging Face writes it -> catalogue attributes reproducing it
    "llama": (_llama, {"cast_before_scale": 1}),
    "gemma": (_gemma, {"scale_offset": 1.0}),
    "t5": (_t5, {"cast_before_scale": 1}),
}


TORCH_TO_NUMPY = torch_to_numpy()


def _numpy(tensor):
    return tensor.float().numpy().astype(TORCH_TO_NUMPY[tensor.dtype])


@pytest.mark.parametrize("style", HF_STYLES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reference_reproduces_hugging_face_rounding(style, dtype, rng):
    """Llama and T5 round in order A, Gemma ((1 + w)) in order B. With the right order the
    reference equals the module bit for bit except in rare ties (torch takes rsqrt in float32,
    the reference in float64); with the other order a quarter or more of the values differ."""
    forward, attrs = HF_STYLES[style]
    x = torch.from_numpy(rng.standard_normal((64, 256)).astype(np.float32)).to(dtype)
    w = torch.from_numpy((0.5 + rng.standard_normal(256)).astype(np.float32)).to(dtype)
    want = forward(x, w, 1e-6).float().numpy()

    def exact_fraction(order):
        ours = reference.run(
            "RMSNorm", _numpy(x), _numpy(w), epsilon=1e-6, **{**attrs, "cast_before_scale": order}
        )[0]
        assert_close(ours, want.astype(ours.dtype))
        return (ours.astype(np.float32) == want).mean()

    right = attrs.get("cast_before_scale", 0)
    assert exact_fraction(right) >= 0.999
    assert exact_fraction(1 - right) < 0.9


def _exact_fraction(x, scale, z, attrs, want, order) -> float:
    """The share of GatedRMSNorm's reference outputs (rounding ``order``) equal to ``want``."""
    ours = reference.run(
        "GatedRMSNorm",
        _numpy(x),
        scale,
        _numpy(z),
        **{**attrs, "cast_before_scale": order},
    )[0]
    assert_close(ours, want.astype(ours.dtype))
    return (ours.astype(np.float32) == want).mean()


def _gated_classes() -> list:
    pytest.importorskip("transformers")
    from onnxnorm.testing import hf

    return [n for n in hf.norms.norm_classes() if n.gated]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_reference_reproduces_transformers_gated_norms(dtype, rng):
    """Every gated norm class of the installed transformers (found by reading its model
    modules), each way it builds: GatedRMSNorm with the attributes convert's probe finds for it
    reproduces the module, in float16 and bfloat16 bit for bit but for rare ties (torch takes
    rsqrt and the sigmoid in float32, the reference in float64), and the other rounding order
    misses a large share of the values; in float32 within tolerance."""
    from onnxnorm.nn.converter import probe
    from onnxnorm.testing import hf

    checked = 0
    for norm in _gated_classes():
        for variant in hf.norms.variants(norm):
            module = hf.norms.build(variant, 256)
            config = probe(module)
            attrs = config.attributes(torch.zeros(256))
            module = module.to(dtype)
            x, z = (
                torch.from_numpy(rng.standard_normal((64, 256)).astype(np.float32)).to(dtype)
                for _ in range(2)
            )
            with torch.no_grad():
                want = module(x, z).float().numpy()
            scale = _numpy(module.weight.detach()) if config.weight else None
            exact_fraction = functools.partial(_exact_fraction, x, scale, z, attrs, want)

            right = attrs["cast_before_scale"]
            fraction = exact_fraction(right)  # (float32: close, its last bits are float64's)
            if dtype != torch.float32:
                assert fraction >= 0.995, variant
                assert exact_fraction(1 - right) < 0.95, variant
            checked += 1
    assert checked >= len(_gated_classes())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_reference_l2_norm_matches_fla_and_llama4(dtype, rng):
    """L2Norm is FLA's l2norm (in float32, as onnxnorm computes it); Llama 4's L2Norm (the
    root of the mean square) is RMSNorm without Scale."""
    x = torch.from_numpy(rng.standard_normal((2, 8, 4, 128)).astype(np.float32)).to(dtype)
    xf = x.float()
    fla = (xf * torch.rsqrt((xf * xf).sum(-1, keepdim=True) + 1e-6)).to(dtype)
    assert_close(reference.run("L2Norm", _numpy(x), epsilon=1e-6)[0], _numpy(fla))
    from onnxnorm.nn.probe import ProbeFailure as _ProbeFailure, probe
    from onnxnorm.testing import hf

    # the weightless classes convert finds an RMSNorm without Scale (Llama 4's L2 norm, ...)
    for norm in hf.norms.norm_classes():
        if not norm.weightless or norm.gated:
            continue
        try:
            module = hf.norms.build(norm, 128)
            config = probe(module)
        except (hf.norms.NotBuildable, _ProbeFailure):  # test_convert's concern
            continue
        if config.kind != "rms" or config.weight:
            continue
        with torch.no_grad():
            want = module(x)
        got = reference.run("RMSNorm", _numpy(x), epsilon=config.eps)[0]
        assert_close(got, _numpy(want))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_reference_matches_torch_functional(dtype, rng):
    x = torch.from_numpy(rng.standard_normal(SHAPE).astype(np.float32)).to(dtype)
    w, b = (
        torch.from_numpy(rng.standard_normal(SHAPE[-1:]).astype(np.float32)).to(dtype)
        for _ in range(2)
    )
    rms = reference.run("RMSNorm", _numpy(x), _numpy(w), epsilon=1e-6)[0]
    assert_close(
        rms,
        torch.nn.functional.rms_norm(x, SHAPE[-1:], w, eps=1e-6).float().numpy().astype(rms.dtype),
    )
    ln = reference.run("LayerNorm", _numpy(x), _numpy(w), _numpy(b), epsilon=1e-5)[0]
    assert_close(
        ln, torch.nn.functional.layer_norm(x, SHAPE[-1:], w, b).float().numpy().astype(ln.dtype)
    )


@pytest.mark.parametrize("op", ops.catalogue.FLOAT_OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_torch_eager_matches_reference(op, dtype, rng):
    """onnxnorm.nn.call in eager mode (plain torch math) against the reference, every input."""
    from onnxnorm.nn import call

    spec = ops.OPS[op]
    attrs = {
        name: value
        for name, value in (("scale_offset", 1.0), ("alpha", 0.5), ("cast_before_scale", 1))
        if name in spec.defaults
    }
    arrays = _arrays(op, spec.optional_inputs, rng, dtype=TORCH_TO_NUMPY[dtype])
    tensors = [
        torch.from_numpy(arrays[p.name].astype(np.float32)).to(dtype) if p.name in arrays else None
        for p in spec.inputs
    ]
    got = call(op, *tensors, **attrs)
    got = got if isinstance(got, tuple) else (got,)
    for g, w in zip(got, reference_outputs(op, arrays, attrs)):
        assert_close(g.float().numpy(), w)


def test_reference_layer_norm_large_mean_small_spread(rng):
    x = (1e4 + 1e-2 * rng.standard_normal((4, 256))).astype(np.float32)
    got = reference.run("LayerNorm", x, epsilon=0.0)[0]
    exact = x.astype(np.float64)
    exact = (exact - exact.mean(-1, keepdims=True)) / exact.std(-1, keepdims=True)
    np.testing.assert_allclose(got, exact, atol=1e-5)


@pytest.mark.parametrize(
    "attrs, message",
    [
        ({"axis": 3}, "axis 3 is out of range"),
        ({"epsilon": -1.0}, "epsilon must be a finite number >= 0"),
        ({"cast_before_scale": 2}, "cast_before_scale must be 0 or 1"),
        ({"gamma": 1.0}, "unknown attribute"),
    ],
)
def test_reference_rejects_bad_attributes(attrs, message, rng):
    with pytest.raises(ValueError, match=message):
        reference.run("RMSNorm", rng.standard_normal(SHAPE).astype(np.float32), **attrs)


def test_reference_rejects_scale_that_does_not_fit(rng):
    x = rng.standard_normal(SHAPE).astype(np.float32)
    with pytest.raises(ValueError, match=r"Scale of shape \(3,\) does not fit X"):
        reference.run("RMSNorm", x, np.ones(3, np.float32))


@pytest.mark.parametrize("op", list(ops.catalogue.FLOAT_OPS))
def test_reference_outputs_keep_x_shape_with_weights_of_higher_rank(op, rng):
    """Weights may carry leading 1s beyond X's rank (a (1, 1, 8) Scale for an X of (4, 8)): the
    outputs keep X's shape and equal those with the weights squeezed."""
    spec = ops.OPS[op]
    x = rng.standard_normal((4, 8)).astype(np.float32)
    given = {p.name: rng.standard_normal((1, 1, 8)).astype(np.float32) for p in spec.inputs}
    for p in spec.inputs:  # X, Residual and Gate: of X's shape
        if p.type_var == "T":
            given[p.name] = x if p.name == "X" else rng.standard_normal((4, 8)).astype(np.float32)
    inputs = [given[p.name] for p in spec.inputs]
    squeezed = [v if v.shape == (4, 8) else v.reshape(8) for v in inputs]
    for got, want in zip(reference.run(op, *inputs), reference.run(op, *squeezed)):
        assert got.shape == (4, 8)
        np.testing.assert_array_equal(got, want)


def test_overload_names_variant():
    spec = ops.OPS["SkipRMSNorm"]
    assert functions.overload(spec, ["Scale", "XBias"], 1) == "scale_xbias_a"
    assert functions.overload(spec, [], 0) == "none"
    assert functions.overload(spec, [], 0, 1.0, with_sum=False) == "none_offset_nosum"


def test_gated_overload_names_its_shape():
    """A GatedRMSNorm's group size, sigmoid and gate-first order change its body's nodes, so
    the overload names them (SiLU and norm-then-gate, the defaults, have no part; without a
    Gate neither the activation nor the order shows)."""
    spec = ops.OPS["GatedRMSNorm"]
    assert functions.overload(spec, ["Scale", "Gate"], 1) == "scale_gate_a"
    attrs = {"group_size": 64, "activation": 1, "norm_before_gate": 0}
    assert (
        functions.overload(spec, ["Scale", "Gate"], 0, attrs=attrs)
        == "scale_gate_group64_sigmoid_gatefirst"
    )
    assert functions.overload(spec, ["Scale"], 0, attrs=attrs) == "scale_group64"
    assert functions.overload(ops.OPS["L2Norm"], [], 0, opset=11, x_type=1, attrs={}) == (
        "none_f32_axis-1_eps1e-05"
    )


@pytest.mark.parametrize(
    "op", [name for name, spec in ops.catalogue.FLOAT_OPS.items() if spec.has_residual]
)
def test_function_body_without_sum_output(op, rng):
    """A Skip or Sandwich node that leaves out Sum gets an overload without it, which ORT runs."""
    arrays = _arrays(op, ("Scale",), rng)
    model = single_node_model(op, arrays, optional_outputs=False)
    assert [len(f.output) for f in model.functions] == [1]
    assert model.functions[0].overload.endswith("nosum")
    got = run(model, arrays)
    assert len(got) == 1
    assert_close(got[0], reference_outputs(op, arrays)[0])


def test_schemas_registered_for_every_op():
    for name, spec in ops.OPS.items():
        schema = onnx.defs.get_schema(name, ops.VERSION, ops.DOMAIN)
        assert [i.name for i in schema.inputs] == [p.name for p in spec.inputs]
        assert [o.name for o in schema.outputs] == [p.name for p in spec.outputs]
        assert set(schema.attributes) == {a.name for a in spec.attributes}


def test_function_bodies_below_opset_15_name_x_type():
    """Below opset 15 (no CastLike) the overload names X's type; tests/ops/test_opsets.py runs
    them."""
    with pytest.raises(ValueError, match=r"names no element type of X .* below opset 15"):
        functions.function_proto("RMSNorm", "scale", 14)
    assert functions.function_proto("RMSNorm", "scale_f16", 14).overload == "scale_f16"


def _checked(node, inputs):
    graph = onnx.helper.make_graph(
        [node],
        "g",
        [onnx.helper.make_tensor_value_info(n, t, [2, 8]) for n, t in inputs],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 8])],
    )
    model = onnx.helper.make_model(
        graph,
        opset_imports=[
            onnx.helper.make_opsetid("", 18),
            onnx.helper.make_opsetid(ops.DOMAIN, ops.VERSION),
        ],
    )
    onnx.checker.check_model(model, full_check=True)


F32, F16 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16


@pytest.mark.parametrize(
    "op, inputs, attrs, types, message",
    [
        ("RMSNorm", ["x"], {"gamma": 1.0}, [F32], "Unrecognized attribute: gamma"),
        ("RMSNorm", ["x"] * 4, {}, [F32], "input size 4 not in range"),
        ("RMSNorm", ["x"], {"axis": 1.5}, [F32], "Mismatched attribute type .*axis"),
        ("RMSNorm", ["x"], {"axis": 2}, [F32], "axis 2 is out of range for X of rank 2"),
        ("SkipRMSNorm", ["x", "r"], {}, [F32, F16], "Residual must be FLOAT .*got FLOAT16"),
        ("LayerNorm", ["x", "r"], {}, [F32, F16], "Scale must be FLOAT .*got FLOAT16"),
        (
            "SkipLayerNorm",
            ["x", "r"],
            {"alpha": 1},
            [F32, F32],
            "Mismatched attribute type .*alpha",
        ),
    ],
)
def test_checker_names_node_and_problem(op, inputs, attrs, types, message):
    node = onnx.helper.make_node(op, inputs, ["y"], name="bad_node", domain=ops.DOMAIN, **attrs)
    names = list(dict.fromkeys(inputs))
    with pytest.raises(Exception, match=message) as error:
        _checked(node, list(zip(names, types)))
    assert "bad_node" in str(error.value)


def test_shape_inference_gives_outputs_x_type_and_shape():
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("SkipRMSNorm", ["x", "r", "s"], ["y", "sum"], domain=ops.DOMAIN)],
        "g",
        [
            onnx.helper.make_tensor_value_info("x", F16, ["batch", 8]),
            onnx.helper.make_tensor_value_info("r", F16, ["batch", 8]),
            onnx.helper.make_tensor_value_info("s", F32, [8]),
        ],
        [
            onnx.helper.make_value_info("y", onnx.TypeProto()),
            onnx.helper.make_value_info("sum", onnx.TypeProto()),
        ],
    )
    model = onnx.helper.make_model(
        graph,
        opset_imports=[
            onnx.helper.make_opsetid("", 18),
            onnx.helper.make_opsetid(ops.DOMAIN, ops.VERSION),
        ],
    )
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    for output in inferred.graph.output:
        assert output.type.tensor_type.elem_type == F16
        assert [d.dim_param or d.dim_value for d in output.type.tensor_type.shape.dim] == [
            "batch",
            8,
        ]


# ---------------------------------------------------------------------------------------------
# float8 e4m3fn: the static quantized ops' Y of the type of a float8 Y_zero_point

FLOAT8 = reference.FLOAT8_E4M3FN
STATIC = [name for name, spec in ops.catalogue.QUANTIZED_OPS.items() if spec.quantize == "static"]
#: Y_float values whose float8 e4m3fn is known exactly (Y_scale 1): exact values, ties that
#: round to the even neighbour (1.0625 -> 1, 1.1875 -> 1.25, 3 * 2^-10 -> 2^-8), the largest
#: value and what saturates to it (464 is halfway to 480; 1e4, Inf), subnormals, values that
#: round to zero (keeping their sign) and NaN
FLOAT8_VALUES = [
    1.0,
    1.0625,
    1.1875,
    -1.1875,
    448.0,
    464.0,
    -500.0,
    1e4,
    np.inf,
    -np.inf,
    2.0**-9,
    3 * 2.0**-10,
    -(2.0**-7),
    2.0**-11,
    -(2.0**-11),
    np.nan,
]


def _float8_arrays(op, dtype):
    """Inputs for which every Y_float is exact whatever computes it: rows of +-a (their norm is
    +-1 with epsilon 0, for LayerNorm and RMSNorm alike) times a Scale of FLOAT8_VALUES, so that
    Y_float is +-FLOAT8_VALUES, and Y is those (or twice those with Y_scale 0.5) in float8."""
    spec = ops.OPS[op]
    cols = len(FLOAT8_VALUES)
    signs = np.where(np.arange(cols) % 2, -1.0, 1.0)
    rows = np.array([1.0, 3.0, 0.25])[:, None] * signs
    rows[1] = -rows[1]
    arrays = {"X": rows.astype(dtype), "Scale": np.array(FLOAT8_VALUES).astype(dtype)}
    if spec.has_residual:
        arrays["Residual"] = np.zeros_like(arrays["X"])
    arrays["Y_scale"] = np.array(1.0, dtype)
    arrays["Y_zero_point"] = np.array(0.0, FLOAT8)
    return arrays


@pytest.mark.parametrize("library", [False, True], ids=["body", "kernel"])
@pytest.mark.parametrize("opset", [19, 21, 23])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", STATIC)
def test_float8_output_is_the_reference_bit_for_bit(op, dtype, opset, library):
    """A float8 Y_zero_point: Y is the reference's float8 e4m3fn bits (ties to even,
    saturation to +-448, subnormals, signed zeros, NaN), through the function body (plain ORT:
    its QuantizeLinear-19 or -21) and the library's kernel; Y_float and Sum as the reference's."""
    arrays = _float8_arrays(op, DTYPES[dtype])
    for y_scale in (1.0, 0.5):
        arrays["Y_scale"] = np.array(y_scale, DTYPES[dtype])
        attrs = {"epsilon": 0.0, "cast_before_scale": 1}
        model = single_node_model(op, arrays, attrs, opset=opset)
        if not library:
            onnx.checker.check_model(model, full_check=True)
        got = run(model, arrays, with_library=library)
        want = reference_outputs(op, arrays, attrs)
        assert want[0].dtype == FLOAT8
        assert_float8_equal(got[0], want[0])
        for g, w in zip(got[1:], want[1:]):  # [Sum,] Y_float: exact here
            np.testing.assert_array_equal(np.asarray(g, np.float32), w.astype(np.float32))
        if y_scale == 1.0:  # +-448, -0, the smallest subnormal
            assert {0x7E, 0xFE, 0x80, 0x01} <= set(got[0].view(np.uint8).ravel().tolist())


def _float8_node_model(opset, zero_point_type=onnx.TensorProto.FLOAT8E4M3FN, declared=True):
    """One RMSNormQuantizeLinear node whose Y_zero_point is an initializer (or, not declared, the
    output of an Identity of one that nothing types)."""
    node = onnx.helper.make_node(
        "RMSNormQuantizeLinear", ["x", "", "", "ys", "yz"], ["y"], domain=ops.DOMAIN, name="norm_q"
    )
    nodes = [node]
    init = onnx.helper.make_tensor("yz" if declared else "yz0", zero_point_type, [], [0])
    if not declared:
        nodes.insert(0, onnx.helper.make_node("Identity", ["yz0"], ["yz"]))
    graph = onnx.helper.make_graph(
        nodes,
        "g",
        [
            onnx.helper.make_tensor_value_info("x", F32, [2, 8]),
            onnx.helper.make_tensor_value_info("ys", F32, []),
        ],
        [
            onnx.helper.make_tensor_value_info("y", zero_point_type, [2, 8])
            if declared
            else onnx.helper.make_value_info("y", onnx.TypeProto())
        ],
        [init],
    )
    return onnx.helper.make_model(
        graph,
        opset_imports=[
            onnx.helper.make_opsetid("", opset),
            onnx.helper.make_opsetid(ops.DOMAIN, ops.VERSION),
        ],
    )


@pytest.mark.parametrize("declared", [True, False])
def test_float8_needs_opset_19(declared, tmp_path, capsys):
    """The function body of a float8 node ends in QuantizeLinear to float8, which ONNX has from
    opset 19: in an older model attaching the bodies, and lowering to the ort and onnx targets,
    leave the node without a body (it needs the library), with a note naming the node, the
    opset and what it needs (the type found by shape inference where nothing declares it);
    `onnxnorm fuse` writes it so and says why, and with --upgrade-opset converts the model to
    opset 19, where the node gets its body. uint8 and int8 take any opset; opset 19 takes
    float8."""
    from onnxnorm import cli
    from onnxnorm.fusion.lowering import lower, lower_with_notes

    note = (
        r"norm_q \(RMSNormQuantizeLinear\) -> onnxnorm node without a function body .*: "
        r"quantizes to float8e4m3fn .* needs ONNX opset >= 19 .* the model imports opset "
        r"18: .*"
    )
    for target in TARGETS_WITHOUT_LIBRARY:
        lowered, notes = lower_with_notes(_float8_node_model(18, declared=declared), target)
        assert len(notes) == 1 and re.fullmatch(note, str(notes[0])), notes
        norm = next(n for n in lowered.graph.node if n.op_type == "RMSNormQuantizeLinear")
        assert norm.domain == ops.DOMAIN and not norm.overload and not lowered.functions
    notes = []
    functions.attach_functions(_float8_node_model(18, declared=declared), notes)
    assert len(notes) == 1 and re.fullmatch(note, str(notes[0])), notes
    onnx.save(_float8_node_model(18, declared=declared), tmp_path / "old.onnx")
    assert cli.main(["fuse", str(tmp_path / "old.onnx"), "-o", str(tmp_path / "out.onnx")]) == 0
    printed = capsys.readouterr().out
    assert re.search("lowered to function: " + note[:-3], printed), printed
    assert not onnx.load(tmp_path / "out.onnx").functions
    assert (
        cli.main(
            ["fuse", str(tmp_path / "old.onnx"), "-o", str(tmp_path / "up.onnx"), "--upgrade-opset"]
        )
        == 0
    )
    assert "--upgrade-opset: ONNX opset 18 -> 19" in capsys.readouterr().out
    upgraded = onnx.load(tmp_path / "up.onnx")
    assert functions.model_opset(upgraded) == 19 and len(upgraded.functions) == 1
    assert len(lower(_float8_node_model(18, declared=declared), "fused").graph.node) == 1 + (
        not declared
    )  # the library's kernel needs no standard op
    for q_type in (onnx.TensorProto.UINT8, onnx.TensorProto.INT8):
        functions.attach_functions(_float8_node_model(17, q_type, declared))
    model = functions.attach_functions(_float8_node_model(19, declared=declared))
    if declared:  # (the checker wants every graph output typed)
        onnx.checker.check_model(model, full_check=True)
    x = np.linspace(-3, 3, 16, dtype=np.float32).reshape(2, 8)
    got = run(model, {"x": x, "ys": np.array(0.01, np.float32)})[0]
    want = reference.run(
        "RMSNormQuantizeLinear", x, None, None, np.array(0.01, np.float32), np.array(0, FLOAT8)
    )[0]
    assert_float8_equal(got, want)


def test_schema_types_float8_output():
    """Q's type constraint lists float8e4m3fn; type inference gives Y the zero point's type."""
    for op in STATIC:
        schema = onnx.defs.get_schema(op, ops.VERSION, ops.DOMAIN)
        q = next(c for c in schema.type_constraints if c.type_param_str == "Q")
        assert list(q.allowed_type_strs) == [
            "tensor(uint8)",
            "tensor(int8)",
            "tensor(float8e4m3fn)",
        ]
    model = _float8_node_model(19)
    del model.graph.output[:]
    model.graph.output.append(onnx.helper.make_value_info("y", onnx.TypeProto()))
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    y = inferred.graph.output[0].type.tensor_type
    assert y.elem_type == onnx.TensorProto.FLOAT8E4M3FN
    assert [d.dim_value for d in y.shape.dim] == [2, 8]


def test_verify_reads_a_float8_output_as_float8():
    """`onnxnorm fuse --verify` on a model whose output is a float8 Y (ORT returns its bits as
    uint8): the output is named float8e4m3fn, held exact, and a difference is measured in
    float8's values, not in its bits."""
    from onnxnorm.fusion.verify import verify

    model = _float8_node_model(21)
    feeds = {
        "x": np.linspace(-3, 3, 16, dtype=np.float32).reshape(2, 8),
        "ys": np.array(0.01, np.float32),
    }
    [same] = verify(model, model, with_library=True, feeds=feeds)
    assert (same.dtype, same.ok, same.max_abs) == ("float8e4m3fn", True, 0.0)
    other = onnx.ModelProto()
    other.CopyFrom(model)
    other.graph.node[0].attribute.append(onnx.helper.make_attribute("epsilon", 1.0))
    [differs] = verify(model, other, with_library=True, feeds=feeds)
    assert differs.dtype == "float8e4m3fn" and not differs.ok
    # the rows normalize to about +-1.6 / 0.01 (epsilon 1e-5) or less (epsilon 1): float8 values
    # up to 160, never a byte difference of up to 255
    assert 0 < differs.max_abs <= 160, differs
