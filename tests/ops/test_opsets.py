"""Models of every standard opset from 7: the function bodies are written in the model's own
opset, pass the checker and, run by plain ONNX Runtime (the body inlined), match the numpy
reference; the lowering to ort and onnx does too. A node whose body the opset cannot hold is
left without one (it needs the library) and the notes say why."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from onnxnorm import ops, runtime
from onnxnorm.fusion.lowering import lower_with_notes, op_types
from onnxnorm.ops import catalogue, functions, reference
from onnxnorm.testing.graphs import single_node_model
from tests.support.helpers import assert_close, reference_outputs, run
from tests.support.matrix import DTYPES, LOWERED_TARGETS, TARGETS_WITHOUT_LIBRARY

NEWEST = onnx.defs.onnx_opset_version()
OPSETS = sorted({7, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 22, 23, NEWEST})
EPS = 2.0**-16
SHAPE = (2, 5, 32)


def _arrays(op, present, dtype, rng, axis=-1, group=0):
    """X, Residual (ops with one) and the ``present`` optional inputs over dims [axis, rank)
    (Gate: X's shape; with ``group``, a GatedRMSNorm's Scale of one group)."""
    t = DTYPES[dtype]
    arrays = {"X": (rng.standard_normal(SHAPE) * 2 + 0.5).astype(t)}
    if catalogue.get(op).has_residual:
        arrays["Residual"] = rng.standard_normal(SHAPE).astype(t)
    for name in present:
        if name == "Gate":
            arrays[name] = (rng.standard_normal(SHAPE) * 2).astype(t)
            continue
        shape = SHAPE[axis:] if name != "Scale" or not group else (group,)
        arrays[name] = (rng.standard_normal(shape) * 0.7 + (1 if "Scale" in name else 0)).astype(t)
    return arrays


def _cases():
    """(op, present optional inputs, attributes, dtype, Sum an output) for every float op: every
    optional input; none (with a positive axis); order A in float16 over two dims (a negative
    axis, which Flatten takes from opset 11 only); a scale offset; no Sum; alpha != 1; bfloat16;
    a gated norm's groups, gate first and sigmoid. Inputs and attributes an op lacks are left
    out."""
    for op, spec in catalogue.FLOAT_OPS.items():

        def case(present, attrs, dtype, with_sum=True, op=op, spec=spec):
            present = tuple(name for name in present if name in spec.optional_inputs)
            attrs = {k: v for k, v in attrs.items() if k in spec.defaults}
            return op, present, attrs, dtype, with_sum

        yield case(spec.optional_inputs, {}, "float32")
        yield case((), {"axis": 1}, "float32")
        yield case(("Scale",), {"cast_before_scale": 1, "axis": -2}, "float16")
        if "scale_offset" in spec.defaults:
            yield case(("Scale",), {"scale_offset": 1.0}, "float16")
        if spec.has_residual:
            yield case(("Scale",), {}, "float32", False)
        if "alpha" in spec.defaults:
            yield case(("Scale", "XBias"), {"alpha": 0.5}, "float32")
        yield case(("Scale",), {"cast_before_scale": 1}, "bfloat16")
        if spec.gated:
            yield case(("Scale", "Gate"), {"group_size": 8, "norm_before_gate": 0}, "float16")
            yield case(("Scale", "Gate"), {"group_size": 8, "activation": 1}, "bfloat16")
            yield case(("Gate",), {"cast_before_scale": 1, "group_size": 16}, "float16")


def _params():
    for opset in OPSETS:
        for op, present, attrs, dtype, with_sum in _cases():
            if dtype == "bfloat16" and opset < functions.BFLOAT16_MIN_OPSET:
                continue  # test_bfloat16_below_opset_13_has_no_body
            label = "-".join(
                [op, "+".join(present) or "none", dtype]
                + [f"{k}{v}" for k, v in attrs.items()]
                + ([] if with_sum else ["nosum"])
            )
            yield pytest.param(
                op, present, attrs, dtype, with_sum, opset, id=f"opset{opset}-{label}"
            )


def _model(op, arrays, attrs, opset, optional_outputs=True):
    """single_node_model without bodies, with the IR version of its opset's ONNX release (an
    old model's), which the function target raises to 10."""
    model = single_node_model(
        op, arrays, attrs, opset=opset, functions=False, optional_outputs=optional_outputs
    )
    model.ir_version = helper.find_min_ir_version_for([helper.make_opsetid("", opset)])
    return model


def _assert_matches(model, arrays, op, attrs, dtype):
    want = reference_outputs(op, arrays, attrs)
    got = run(model, arrays)
    assert got
    for g, w in zip(got, want):
        assert_close(g, w, DTYPES[dtype])


@pytest.mark.parametrize("op, present, attrs, dtype, with_sum, opset", _params())
def test_every_opset_function_and_lowered_targets_match_reference(
    op, present, attrs, dtype, with_sum, opset, rng
):
    attrs = {"epsilon": EPS, **attrs}
    arrays = _arrays(op, present, dtype, rng, attrs.get("axis", -1), attrs.get("group_size", 0))
    model = _model(op, arrays, attrs, opset, optional_outputs=with_sum)

    body, notes = lower_with_notes(model, "function")
    assert not notes
    (node,) = [n for n in body.graph.node if n.domain == ops.DOMAIN]
    (function,) = body.functions
    assert node.overload == function.overload and function.opset_import[0].version == opset
    if opset < functions.MIN_OPSET:
        assert (
            f"_{ {'float32': 'f32', 'float16': 'f16', 'bfloat16': 'bf16'}[dtype] }" in node.overload
        )
        assert not any(n.op_type == "CastLike" for n in function.node)
    if opset < functions.REF_OPSET:
        assert "_eps1.5258789e-05" in node.overload
        assert not any(a.ref_attr_name for n in function.node for a in n.attribute)
    assert body.ir_version >= functions.MIN_IR_VERSION
    onnx.checker.check_model(body, full_check=True)
    _assert_matches(body, arrays, op, attrs, dtype)  # without the library: the body inlined

    for target in LOWERED_TARGETS:
        lowered, notes = lower_with_notes(model, target)
        assert len(notes) == 1 and not any(d == ops.DOMAIN for d, _ in op_types(lowered)), notes
        assert lowered.ir_version == model.ir_version
        if target == "onnx":
            assert {d for d, _ in op_types(lowered)} <= {""}
            onnx.checker.check_model(lowered, full_check=True)
        _assert_matches(lowered, arrays, op, attrs, dtype)


def test_ort_target_uses_ort_own_ops_at_old_opsets(rng):
    """ONNX Runtime registers LayerNormalization and SimplifiedLayerNormalization in the ONNX
    domain from version 1 and its Skip ops in com.microsoft: the ort target uses them at every
    opset, and where a unit scale is needed below opset 9 (no ConstantOfShape) tiles ones."""
    for op, kind in (
        ("LayerNorm", "LayerNormalization"),
        ("SkipRMSNorm", "SkipSimplifiedLayerNormalization"),
    ):
        for opset in (7, 11):
            arrays = _arrays(op, ("Scale",), "float32", rng)
            lowered, notes = lower_with_notes(_model(op, arrays, {}, opset), "ort")
            assert kind in {t for _, t in op_types(lowered)}, notes
            _assert_matches(lowered, arrays, op, {}, "float32")
    arrays = _arrays("RMSNorm", ("Scale",), "float16", rng)
    lowered, notes = lower_with_notes(_model("RMSNorm", arrays, {}, 7), "ort")
    kinds = {t for _, t in op_types(lowered)}
    assert {"SimplifiedLayerNormalization", "Tile"} <= kinds and "ConstantOfShape" not in kinds
    _assert_matches(lowered, arrays, "RMSNorm", {}, "float16")


def _no_body(model, notes, op, pattern):
    """The node of ``op`` stayed an onnxnorm node without a body; its one note says
    ``pattern``."""
    (node,) = [n for n in model.graph.node if n.op_type == op]
    assert node.domain == ops.DOMAIN and not node.overload
    assert not [f for f in model.functions if f.domain == ops.DOMAIN]
    assert len(notes) == 1 and notes[0].emitted == functions.WITHOUT_BODY, notes
    assert re.search(pattern, notes[0].reason), notes[0].reason


def test_bfloat16_below_opset_13_has_no_body(rng):
    """Cast-13 added bfloat16: at opset 12 no body, no lowering; the node needs the library
    and every target says why."""
    arrays = _arrays("SkipRMSNorm", ("Scale",), "bfloat16", rng)
    model = _model("SkipRMSNorm", arrays, {}, 12)
    reason = r"X is bfloat16, which ONNX casts to from opset 13 on .* imports opset 12"
    for target in TARGETS_WITHOUT_LIBRARY:
        lowered, notes = lower_with_notes(model, target)
        _no_body(lowered, notes, "SkipRMSNorm", reason)
    assert functions.body_problem("SkipRMSNorm", 12, TensorProto.BFLOAT16)
    assert functions.body_problem("SkipRMSNorm", 13, TensorProto.BFLOAT16) is None
    notes = []
    functions.attach_functions(model, notes)
    _no_body(model, notes, "SkipRMSNorm", reason)


ZERO_POINTS = {"uint8": np.array(131, np.uint8), "int8": np.array(-5, np.int8)}


def _quantized_arrays(op, dtype, zero_point, rng):
    spec = catalogue.get(op)
    arrays = _arrays(op, ("Scale",), dtype, rng)
    if spec.quantize == "static":
        arrays["Y_scale"] = np.array(0.005, DTYPES[dtype])  # some values saturate
        if zero_point:
            arrays["Y_zero_point"] = ZERO_POINTS[zero_point]
    return arrays


@pytest.mark.parametrize("target", TARGETS_WITHOUT_LIBRARY)
@pytest.mark.parametrize("op", catalogue.QUANTIZED_OPS)
@pytest.mark.parametrize("at", ["oldest", 13])
def test_quantized_ops_at_old_opsets(op, target, at, rng):
    """QuantizeLinear is in opset 10, DynamicQuantizeLinear in 11: there, and at 13 (no
    CastLike yet), every target runs in plain ONNX Runtime, Y_float as the reference's and Y
    (and Y_scale, Y_zero_point) the reference's quantizer of it."""
    spec = catalogue.get(op)
    opset = functions.QUANTIZE_MIN_OPSET[spec.quantize] if at == "oldest" else at
    dtype = "float16"
    zero_point = "int8" if "Skip" in op else ("uint8" if spec.quantize == "static" else None)
    arrays = _quantized_arrays(op, dtype, zero_point, rng)
    attrs = {"epsilon": EPS, "cast_before_scale": 1}
    lowered, notes = lower_with_notes(_model(op, arrays, attrs, opset), target)
    assert not any(n.emitted == functions.WITHOUT_BODY for n in notes), notes
    assert not any(d == ops.DOMAIN for d, _ in op_types(lowered)) or target == "function"
    if target != "ort":
        onnx.checker.check_model(lowered, full_check=True)
    names = [p.name for p in spec.outputs]
    got = dict(zip(names, run(lowered, arrays)))
    want = dict(zip(names, reference_outputs(op, arrays, attrs)))
    assert_close(got["Y_float"], want["Y_float"], DTYPES[dtype])
    y_float = got["Y_float"].astype(DTYPES[dtype])
    if spec.quantize == "static":
        own = [
            reference.quantize_linear(
                y_float, arrays["Y_scale"], arrays.get("Y_zero_point", np.array(0, np.uint8))
            )
        ]
    else:
        own = reference.dynamic_quantize_linear(y_float)
    for name, value in zip(("Y", "Y_scale", "Y_zero_point"), own):
        assert got[name].dtype == value.dtype
        np.testing.assert_array_equal(got[name], value)


@pytest.mark.parametrize("op", ["RMSNormQuantizeLinear", "SkipLayerNormDynamicQuantizeLinear"])
def test_quantized_op_below_its_opset_has_no_body(op, rng):
    """One opset below its quantizer's, a quantized node keeps no body on every target and
    runs with the library."""
    spec = catalogue.get(op)
    opset = functions.QUANTIZE_MIN_OPSET[spec.quantize] - 1
    quantizer = "QuantizeLinear" if spec.quantize == "static" else "DynamicQuantizeLinear"
    arrays = _quantized_arrays(op, "float32", "int8" if spec.quantize == "static" else None, rng)
    model = _model(op, arrays, {}, opset)
    reason = (
        rf"its body ends in {quantizer}, which ONNX has from opset {opset + 1}; the model "
        rf"imports opset {opset}: convert the model to opset {opset + 1} or newer"
    )
    for target in TARGETS_WITHOUT_LIBRARY:
        _no_body(*lower_with_notes(model, target), op, reason)
    got = run(lower_with_notes(model, "function")[0], arrays, with_library=True)
    want = reference_outputs(op, arrays)
    np.testing.assert_array_equal(got[0], want[0])


def test_ai_onnx_opset_import_is_the_default_domain(rng):
    """A model that imports the standard domain as "ai.onnx": its opset is read from it (opset
    11: overloads of opset 11), no second import of "" is added, and every target runs."""
    arrays = _arrays("LayerNorm", ("Scale", "Bias"), "float16", rng)
    for opset in (11, 17):
        model = _model("LayerNorm", arrays, {}, opset)
        model.opset_import[0].domain = "ai.onnx"
        assert functions.model_opset(model) == functions.model_opset(model, "ai.onnx") == opset
        body, notes = lower_with_notes(model, "function")
        assert not notes and body.functions[0].overload == (
            "scale_bias_f16_axis-1_eps1e-05" if opset == 11 else "scale_bias"
        )
        assert sorted((i.domain, i.version) for i in body.opset_import) == [
            ("ai.onnx", opset),
            (ops.DOMAIN, ops.VERSION),
        ]
        onnx.checker.check_model(body, full_check=True)
        for lowered in [body] + [lower_with_notes(model, t)[0] for t in LOWERED_TARGETS]:
            assert not any(i.domain == "" for i in lowered.opset_import)
            _assert_matches(lowered, arrays, "LayerNorm", {}, "float16")
    functions.set_opset(model, "", 18)
    first = model.opset_import[0]
    assert (first.domain, first.version) == ("ai.onnx", 18)


def _two_rms_norms(epsilons, opset):
    """Nodes of RMSNorm in a row ("x" -> "y0" -> "y1" ...), node i with epsilon ``epsilons[i]``."""
    nodes = [
        helper.make_node(
            "RMSNorm",
            ["x" if i == 0 else f"y{i - 1}", "scale"],
            [f"y{i}"],
            domain=ops.DOMAIN,
            name=f"norm{i}",
            epsilon=eps,
        )
        for i, eps in enumerate(epsilons)
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8]),
            helper.make_tensor_value_info("scale", TensorProto.FLOAT, [8]),
        ],
        [
            helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [4, 8])
            for i in range(len(epsilons))
        ],
    )
    return helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid("", opset),
            helper.make_opsetid(ops.DOMAIN, ops.VERSION),
        ],
    )


def test_epsilon_is_baked_below_opset_12(rng):
    """Below opset 12 Constant has no value_float, so the body holds the node's epsilon: two
    nodes with different epsilons get two bodies (a third with the first's shares its body),
    and each computes with its own."""
    epsilons = [1e-6, 0.25, 1e-6]
    model = functions.attach_functions(_two_rms_norms(epsilons, 11))
    assert [n.overload for n in model.graph.node] == [
        "scale_f32_axis-1_eps1e-06",
        "scale_f32_axis-1_eps0.25",
        "scale_f32_axis-1_eps1e-06",
    ]
    assert sorted(f.overload for f in model.functions) == [
        "scale_f32_axis-1_eps0.25",
        "scale_f32_axis-1_eps1e-06",
    ]
    onnx.checker.check_model(model, full_check=True)
    x = (rng.standard_normal((4, 8)) * 0.3).astype(np.float32)
    scale = (1 + 0.5 * rng.standard_normal(8)).astype(np.float32)
    got = run(model, {"x": x, "scale": scale})
    want, value = [], x
    for eps in epsilons:
        value = reference.run("RMSNorm", value, scale, epsilon=eps)[0]
        want.append(value)
    for g, w in zip(got, want):
        assert_close(g, w)
    # the same model at opset 12 refers to the attribute: one body for all three
    model = functions.attach_functions(_two_rms_norms(epsilons, 12))
    assert [f.overload for f in model.functions] == ["scale_f32"]
    for g, w in zip(run(model, {"x": x, "scale": scale}), want):
        assert_close(g, w)


def test_overload_names_below_opsets_15_and_12():
    spec = catalogue.get("SkipRMSNorm")
    attrs = {"epsilon": 1e-6, "alpha": 0.5, "axis": -1}
    assert functions.overload(spec, ["Scale"], 1, 1.0, opset=15) == "scale_offset_a"
    assert (
        functions.overload(
            spec, ["Scale"], 1, 1.0, opset=13, x_type=TensorProto.FLOAT16, attrs=attrs
        )
        == "scale_offset_a_f16"
    )
    name = functions.overload(
        spec, ["Scale"], 1, 1.0, with_sum=False, opset=11, x_type=TensorProto.FLOAT16, attrs=attrs
    )
    assert name == "scale_offset1_a_nosum_f16_axis-1_eps1e-06_alpha0.5"
    body = functions.function_proto("SkipRMSNorm", name, 11)
    assert list(body.output) == ["Y"]
    with pytest.raises(ValueError, match="names no eps, alpha value"):
        functions.function_proto("SkipRMSNorm", "scale_f16_axis-1", 11)
    with pytest.raises(ValueError, match="bfloat16, which ONNX casts to from opset 13"):
        functions.function_proto("RMSNorm", "scale_bf16", 12)


def test_x_type_found_by_shape_inference_or_the_reason(rng):
    """Below opset 15 a body names X's type: where nothing declares it shape inference finds
    it; where that cannot either, the node keeps no body and the note says so."""

    def model(producer, domain=""):
        graph = helper.make_graph(
            [
                helper.make_node(producer, ["x"], ["h"], domain=domain),
                helper.make_node("RMSNorm", ["h"], ["y"], domain=ops.DOMAIN, name="norm"),
            ],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [4, 8])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [4, 8])],
        )
        imports = [helper.make_opsetid("", 13), helper.make_opsetid(ops.DOMAIN, ops.VERSION)]
        return helper.make_model(
            graph, opset_imports=imports + ([helper.make_opsetid(domain, 1)] if domain else [])
        )

    notes = []
    inferred = functions.attach_functions(model("Identity"), notes)
    assert not notes and [f.overload for f in inferred.functions] == ["none_f16"]
    x = rng.standard_normal((4, 8)).astype(np.float16)
    assert_close(run(inferred, {"x": x})[0], reference.run("RMSNorm", x)[0])
    unknown = functions.attach_functions(model("Frob", "example.com"), notes)
    _no_body(unknown, notes, "RMSNorm", r"element type of X is not declared .* opset 15")


def test_library_runs_the_kernel_of_an_opset_11_node_and_plain_ort_the_body(rng):
    """The function target at opset 11: ORT with the library registered runs the fused kernel,
    ORT without it the body (ORT's profiler shows which); both match the reference."""
    arrays = _arrays("LayerNorm", ("Scale",), "float16", rng)
    attrs = {"cast_before_scale": 1}
    model = functions.attach_functions(_model("LayerNorm", arrays, attrs, 11))
    assert model.graph.node[0].overload == "scale_a_f16_axis-1_eps1e-05"
    feeds = {"x": arrays["X"], "scale": arrays["Scale"]}
    assert runtime.executed_ops(model, feeds, with_library=True) == {"LayerNorm": 1}
    plain = runtime.executed_ops(model, feeds, with_library=False)
    assert plain["LayerNorm"] == 0 and {"Flatten", "ReduceMean", "Sqrt"} <= set(plain), plain
    want = reference_outputs("LayerNorm", arrays, attrs)[0]
    for library in (False, True):
        assert_close(run(model, arrays, with_library=library)[0], want, np.float16)


def test_model_without_standard_opset_import_gets_opset_15(rng):
    """A model that imports only onnxnorm gets standard opset 15 for its bodies, and IR version
    10 (function overloads), a pair ONNX Runtime loads; lowered, it imports the opset its
    standard ops are written in."""
    arrays = _arrays("SkipRMSNorm", ("Scale",), "float16", rng)
    model = _model("SkipRMSNorm", arrays, {}, 11)
    model.ir_version = 3
    del model.opset_import[0]
    assert functions.model_opset(model) is None
    for target in TARGETS_WITHOUT_LIBRARY:
        lowered, _ = lower_with_notes(model, target)
        assert functions.model_opset(lowered) == functions.MIN_OPSET, target
        if target == "function":
            assert lowered.ir_version == 10 and lowered.functions[0].overload == "scale"
        if target != "ort":
            onnx.checker.check_model(lowered, full_check=True)
        _assert_matches(lowered, arrays, "SkipRMSNorm", {}, "float16")
