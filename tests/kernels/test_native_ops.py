"""The native library's op table is the catalogue's: the generated include is current and follows
catalogue changes, the manifest the built library exports says what the catalogue says (every op
of ALL_OPS: ids, inputs, outputs, attributes with their defaults and checks, type pairs on each
provider, the rotary ops' angle types), its
attribute errors are worded as the catalogue words them, and the Python mirror of NormArgs has
the library's layout."""

from __future__ import annotations

import ctypes
import dataclasses
import importlib.util
import types
from pathlib import Path

import numpy as np
import pytest

from onnxnorm import _native
from onnxnorm.ops import catalogue
from onnxnorm.testing.graphs import single_node_model
from tests.support.helpers import run
from tests.support.kernel_cases import (
    GATES,
    check_kernel,
    check_on_lesser_isa,
    gated_arrays,
    gated_matrix,
    l2_matrix,
)
from tests.support.matrix import DTYPES, F32, TYPE_IDS, TYPE_PAIRS, type_id

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "custom_ops" / "include" / "onnxnorm" / "ops_generated.h"
PROVIDERS = ("CPUExecutionProvider", "CUDAExecutionProvider")


def _generator():
    spec = importlib.util.spec_from_file_location(
        "gen_native_ops", ROOT / "tools" / "gen_native_ops.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def manifest():
    return _native.manifest()


def _catalogue_with(**changes):
    """The catalogue module's names, some replaced."""
    original = _generator().load_catalogue()
    names = {k: getattr(original, k) for k in dir(original) if not k.startswith("__")}
    return types.SimpleNamespace(**{**names, **changes})


def test_generator_follows_the_catalogue():
    gen = _generator()
    cat = gen.load_catalogue()
    epsilon = dataclasses.replace(cat.EPSILON, default=1e-6, check="finite")
    ops = {
        name: dataclasses.replace(
            spec, attributes=tuple(epsilon if a.name == "epsilon" else a for a in spec.attributes)
        )
        for name, spec in cat.ALL_OPS.items()
    }
    text = gen.render(_catalogue_with(ALL_OPS=ops))
    assert "inline constexpr float kEpsilon = 1e-06f;" in text
    assert '{"epsilon", AttrKind::kFloat, 0, 1e-06f, AttrCheck::kFinite},' in text
    assert text != GENERATED.read_text()

    renamed = {
        ("Norm" + name): dataclasses.replace(spec, name="Norm" + name)
        for name, spec in cat.ALL_OPS.items()
    }
    text = gen.render(_catalogue_with(ALL_OPS=renamed))
    assert "  kNormRMSNorm = 1," in text and "  kNormRMSNormRotary = 16," in text

    unknown = dataclasses.replace(cat.EPSILON, check="positive")
    bad = {"LayerNorm": dataclasses.replace(cat.OPS["LayerNorm"], attributes=(unknown,))}
    with pytest.raises(ValueError, match="name no check"):
        gen.render(_catalogue_with(ALL_OPS=bad))
    with pytest.raises(ValueError, match="no native element type"):
        gen.render(_catalogue_with(DATA_TYPES=catalogue.DATA_TYPES + ("tensor(double)",)))


def test_manifest_matches_catalogue(manifest):
    assert (manifest["domain"], manifest["version"]) == (catalogue.DOMAIN, catalogue.VERSION)
    assert manifest["elem_types"] == [_native.elem_type_name(t) for t in catalogue.DATA_TYPES]
    assert manifest["elem_types"] == list(_native.ELEM_TYPES)
    assert manifest["quant_types"] == [_native.elem_type_name(t) for t in catalogue.QUANT_TYPES]
    # the norm ops, then the rotary ops (ids after the norm ops')
    assert [entry["name"] for entry in manifest["ops"]] == list(catalogue.ALL_OPS)
    type_name = _native.elem_type_name
    pairs = [(type_name(t), type_name(s)) for t, s in catalogue.TYPE_PAIRS]
    for index, entry in enumerate(manifest["ops"]):
        spec = catalogue.ALL_OPS[entry["name"]]
        assert entry["id"] == index == _native.OP_IDS.get(spec.name, index)
        assert entry["since_version"] == catalogue.VERSION
        assert (entry["norm"], entry["residual"]) == (spec.norm, spec.residual)
        assert (entry["quantize"], entry["quant_types"]) == (
            spec.quantize,
            [_native.elem_type_name(t) for t in spec.quant_types],
        )
        for got, want in ((entry["inputs"], spec.inputs), (entry["outputs"], spec.outputs)):
            assert got == [
                {"name": p.name, "type": p.type_var, "optional": p.optional} for p in want
            ]
        assert [(a["name"], a["kind"], a["check"]) for a in entry["attributes"]] == [
            (a.name, a.kind, a.check) for a in spec.attributes
        ]
        for got, a in zip(entry["attributes"], spec.attributes):
            if a.kind == "int":
                assert got["default"] == a.default and isinstance(got["default"], int), (
                    spec.name,
                    got,
                )
            else:
                assert np.float32(got["default"]) == np.float32(a.default), (spec.name, got)
        # every (T, S) the schema allows, on both providers (ORT never falls back to the body);
        # the ops whose Y is of type U for every (T, S, U), the quantized ops for every Q; the
        # rotary ops for every (T, S) and angle type A (T or float32)
        if spec.rotary:
            f32 = type_name("tensor(float)")
            want = [
                (provider, type_name(t), type_name(s), a)
                for provider in PROVIDERS
                for t, s, _ in spec.type_sets
                for a in dict.fromkeys((type_name(t), f32))
            ]
            assert len(want) == len(PROVIDERS) * (9 if spec.norm != "l2" else 5)
        elif spec.quantize == "none":
            has_u = any(p.type_var == "U" for p in spec.outputs)
            want = [
                (provider, type_name(t), type_name(s)) + ((type_name(u),) if has_u else ())
                for provider in PROVIDERS
                for t, s, u in spec.type_sets
            ]
            if any(p.type_var == "S" for p in spec.inputs):
                assert len(want) == len(PROVIDERS) * (len(pairs) + 2 * has_u)
            else:  # no weights (L2Norm): (T, T) for each T
                assert len(want) == len(PROVIDERS) * len(catalogue.DATA_TYPES)
        else:
            want = [
                (provider, t, s, _native.elem_type_name(q))
                for provider in PROVIDERS
                for t, s in pairs
                for q in spec.quant_types
            ]
        assert sorted(map(tuple, entry["kernels"])) == sorted(want)


# a value each check refuses
_BAD_VALUES = {
    "finite": float("inf"),
    "finite_non_negative": -1.0,
    "zero_or_one": 2,
    "zero_one_or_two": 3,
    "non_negative_int": -1,
}


@pytest.mark.parametrize("op", list(catalogue.OPS))
def test_attribute_errors_are_worded_as_in_the_catalogue(op):
    spec = catalogue.OPS[op]
    arrays = {"X": np.ones((2, 16), np.float32)}
    if spec.has_residual:
        arrays["Residual"] = np.ones((2, 16), np.float32)
    if spec.quantize == "static":
        arrays["Y_scale"] = np.array(0.1, np.float32)
    checked = [a for a in spec.attributes if a.check != "none"]
    assert checked
    for a in checked:
        value = _BAD_VALUES[a.check]
        python = a.validate(value)
        assert python is not None
        wording = f"onnxnorm::{op}: attribute {a.name} {python.split(', got')[0]}, got "
        model = single_node_model(op, arrays, {a.name: value}, functions=False)
        with pytest.raises(Exception) as raised:
            run(model, arrays, with_library=True)
        assert wording in str(raised.value), str(raised.value)


def test_norm_args_mirror_has_the_library_layout():
    layout = _native.args_layout()
    assert layout == _native.layout()
    assert [f for f, _, _ in layout["fields"]] == [f for f, _ in _native.NormArgs._fields_]
    assert layout["size"] == ctypes.sizeof(_native.NormArgs) == 184


# ---------------------------------------------------------------------------------------------
# GatedRMSNorm and L2Norm through ONNX Runtime with the library (nodes without function bodies)
# against onnxnorm.ops.reference: every X type and weight type, both rounding orders, the gate
# absent, after the norm and before it, both activations, groups (a Scale of one group or of the
# whole extent), the shapes of the models that have them, every instruction set, bad inputs
# (the matrices: tests/support/kernel_cases.py).


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("types", TYPE_PAIRS, ids=TYPE_IDS)
def test_gated_rms_norm_matches_the_reference(types, gate, rng):
    gated_matrix(types, gate, rng)


@pytest.mark.parametrize("x_type", DTYPES.values(), ids=type_id)
def test_l2_norm_matches_the_reference(x_type, rng):
    l2_matrix(x_type, rng)


@pytest.mark.parametrize("types", TYPE_PAIRS, ids=TYPE_IDS)
@pytest.mark.parametrize(
    "model, x_shape, attrs, scale_shape",
    [
        # Mamba2 (Nemotron-H, Bamba, ...): d_inner 4096 in 8 groups, the gate first
        ("mamba2", (2, 7, 4096), {"group_size": 512, "norm_before_gate": 0}, (4096,)),
        # Qwen3-Next: 16 value heads of 128 packed per token, Scale [128], the gate after
        ("qwen3-next", (2, 5, 16 * 128), {"group_size": 128, "epsilon": 1e-6}, (128,)),
        # the same as [B, S, H, D] normalized over D
        ("qwen3-next-rank4", (2, 5, 16, 128), {"epsilon": 1e-6}, (128,)),
        # Kimi Linear: a sigmoid gate after the norm
        ("kimi", (1, 6, 8 * 128), {"group_size": 128, "activation": 1}, (128,)),
    ],
)
def test_gated_rms_norm_model_shapes(model, x_shape, attrs, scale_shape, types, rng):
    for order in (0, 1):
        arrays = gated_arrays(x_shape, *types, scale_shape, True, rng)
        check_kernel("GatedRMSNorm", arrays, {**attrs, "cast_before_scale": order}, threads=2)


@pytest.mark.parametrize("x_type", DTYPES.values(), ids=type_id)
def test_gated_rms_norm_nan_inf_and_large_gates(x_type, rng):
    """NaN and Inf in X and in the gate, and gates far past where exp(-|g|) leaves float32's range,
    propagate as in the reference, the gate after the norm and before it."""
    x_shape = (4, 3, 64)
    for before, activation in ((0, 0), (0, 1), (1, 0), (1, 1)):
        arrays = gated_arrays(x_shape, x_type, x_type, (64,), True, rng, spread=30.0)
        gate = arrays["Gate"].astype(np.float32)
        gate[0, 0, :6] = [np.nan, np.inf, -np.inf, 100.0, -100.0, -1e4]
        gate[1, 2, 5] = np.inf
        arrays["Gate"] = gate.astype(x_type)
        x = arrays["X"].astype(np.float32)
        x[2, 1, 3] = np.nan
        x[3, 0, 7] = -np.inf
        arrays["X"] = x.astype(x_type)
        attrs = {"norm_before_gate": 1 - before, "activation": activation, "group_size": 16}
        check_kernel("GatedRMSNorm", arrays, attrs)


@pytest.mark.parametrize("isa", ["portable", "avx2", "avx512"])
def test_gated_and_l2_norms_on_every_instruction_set(isa):
    """The matrices above on each lesser instruction set (ONNXNORM_CPU_ISA), in a subprocess each;
    the best one runs in this process."""
    check_on_lesser_isa(isa, "check_gated_and_l2_norms", seed=11, timeout=600)


def _bad(op, arrays, attrs, message):
    with pytest.raises(Exception, match=message):
        run(single_node_model(op, arrays, attrs, functions=False), arrays, with_library=True)


def test_gated_rms_norm_bad_inputs_are_clear_errors():
    name = "onnxnorm::GatedRMSNorm"

    def f32(*shape):
        return np.ones(shape, np.float32)

    _bad(
        "GatedRMSNorm",
        {"X": f32(2, 16), "Gate": f32(2, 16)},
        {"group_size": 3},
        rf"{name}: group_size 3 does not divide the normalized extent 16 of X of shape \[2,16\] "
        r"from axis 1",
    )
    _bad(
        "GatedRMSNorm",
        {"X": f32(2, 3, 8)},
        {"group_size": 16, "axis": -2},
        rf"{name}: group_size 16 does not divide the normalized extent 24",
    )
    # with groups, Scale is one group's or exactly the normalized dimensions'
    _bad(
        "GatedRMSNorm",
        {"X": f32(2, 16), "Scale": f32(8)},
        {"group_size": 4},
        rf"{name}: Scale of shape \[8\] does not fit X of shape \[2,16\]",
    )
    _bad(
        "GatedRMSNorm",
        {"X": f32(2, 4, 16), "Scale": f32(4, 16)},
        {"group_size": 4},
        rf"{name}: with group_size 4, Scale must be of shape \[4\] or cover exactly the "
        r"normalized dimensions \[16\] of X of shape \[2,4,16\], got \[4,16\]",
    )
    _bad(
        "GatedRMSNorm",
        {"X": f32(2, 16), "Gate": f32(1, 16)},
        {},
        rf"{name}: Gate of shape \[1,16\] must have the shape of X, \[2,16\]",
    )
    _bad(
        "GatedRMSNorm",
        {"X": f32(2, 16), "Gate": f32(2, 16, 1)},
        {},
        rf"{name}: Gate of shape \[2,16,1\] must have the shape of X",
    )
    _bad(
        "GatedRMSNorm",
        {"X": np.ones((2, 16), np.float16), "Gate": f32(2, 16)},
        {},
        "no kernel def matches node inputs for Op: GatedRMSNorm",
    )
    _bad(
        "L2Norm",
        {"X": np.ones((2, 16), np.float64)},
        {},
        r"'tensor\(double\)' of input parameter \(x\) of operator \(L2Norm\)",
    )


def test_gated_rms_norm_group_weights_are_accepted():
    """A Scale of one group given with leading 1s, and one covering exactly the normalized
    dimensions with leading 1s, are the reference's too."""
    rng = np.random.default_rng(3)
    for scale_shape, axis in (((1, 1, 8), -1), ((1, 3, 8), -2), ((8,), -2)):
        arrays = gated_arrays((2, 3, 8), F32, F32, scale_shape, True, rng)
        check_kernel("GatedRMSNorm", arrays, {"group_size": 8, "axis": axis})
