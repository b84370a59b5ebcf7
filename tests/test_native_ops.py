"""The native library's op table is the catalogue's: the generated include is current and follows
catalogue changes, the manifest the built library exports says what the catalogue says (ids,
inputs, outputs, attributes with their defaults and checks, type pairs on each provider), its
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

from helpers import run, single_node_model
from onnxnorm import _native
from onnxnorm.ops import catalogue

ROOT = Path(__file__).resolve().parents[1]
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
        for name, spec in cat.OPS.items()
    }
    text = gen.render(_catalogue_with(OPS=ops))
    assert "inline constexpr float kEpsilon = 1e-06f;" in text
    assert '{"epsilon", AttrKind::kFloat, 0, 1e-06f, AttrCheck::kFinite},' in text
    assert text != GENERATED.read_text()

    renamed = {
        ("Norm" + name): dataclasses.replace(spec, name="Norm" + name)
        for name, spec in cat.OPS.items()
    }
    assert "  kNormRMSNorm = 1," in gen.render(_catalogue_with(OPS=renamed))

    unknown = dataclasses.replace(cat.EPSILON, check="positive")
    bad = {"LayerNorm": dataclasses.replace(cat.OPS["LayerNorm"], attributes=(unknown,))}
    with pytest.raises(ValueError, match="name no check"):
        gen.render(_catalogue_with(OPS=bad))
    with pytest.raises(ValueError, match="no native element type"):
        gen.render(_catalogue_with(DATA_TYPES=catalogue.DATA_TYPES + ("tensor(double)",)))


def test_manifest_matches_catalogue(manifest):
    assert (manifest["domain"], manifest["version"]) == (catalogue.DOMAIN, catalogue.VERSION)
    assert manifest["elem_types"] == [_native.elem_type_name(t) for t in catalogue.DATA_TYPES]
    assert manifest["elem_types"] == list(_native.ELEM_TYPES)
    assert manifest["quant_types"] == [_native.elem_type_name(t) for t in catalogue.QUANT_TYPES]
    assert [entry["name"] for entry in manifest["ops"]] == list(catalogue.OPS)
    type_name = _native.elem_type_name
    pairs = [(type_name(t), type_name(s)) for t, s in catalogue.TYPE_PAIRS]
    for index, entry in enumerate(manifest["ops"]):
        spec = catalogue.OPS[entry["name"]]
        assert entry["id"] == index == _native.OP_IDS[spec.name]
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
        # the ops whose Y is of type U for every (T, S, U), the quantized ops for every Q
        if spec.quantize == "none":
            has_u = any(p.type_var == "U" for p in spec.outputs)
            want = [
                (provider, type_name(t), type_name(s)) + ((type_name(u),) if has_u else ())
                for provider in PROVIDERS
                for t, s, u in spec.type_sets
            ]
            assert len(want) == len(PROVIDERS) * (len(pairs) + 2 * has_u)
        else:
            want = [
                (provider, t, s, _native.elem_type_name(q))
                for provider in PROVIDERS
                for t, s in pairs
                for q in spec.quant_types
            ]
        assert sorted(map(tuple, entry["kernels"])) == sorted(want)


# a value each check refuses
_BAD_VALUES = {"finite": float("inf"), "finite_non_negative": -1.0, "zero_or_one": 2}


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
    assert layout["size"] == ctypes.sizeof(_native.NormArgs) == 168


def test_the_binding_keeps_its_old_names_in_bench():
    """The binding lived in onnxnorm.bench.cuda (active_isa in onnxnorm.bench.kernels): the old
    names still give it, with a DeprecationWarning that names the new place."""
    from onnxnorm.bench import cuda, kernels

    for module, old, new in (
        (cuda, "NormArgs", "NormArgs"),
        (cuda, "OP_IDS", "OP_IDS"),
        (cuda, "Kernels", "Kernels"),
        (cuda, "layout", "layout"),
        (cuda, "library_path", "cuda_library_path"),
        (kernels, "active_isa", "active_isa"),
    ):
        with pytest.warns(
            DeprecationWarning,
            match=f"{module.__name__}.{old} is deprecated: use onnxnorm._native.{new}",
        ):
            assert getattr(module, old) is getattr(_native, new)
