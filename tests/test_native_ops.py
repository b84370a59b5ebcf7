"""The native library's op table is the catalogue's: the generated include is current and follows
catalogue changes."""

from __future__ import annotations

import dataclasses
import importlib.util
import types
from pathlib import Path

import pytest

from onnxnorm.ops import catalogue

ROOT = Path(__file__).resolve().parents[1]
GENERATED = ROOT / "custom_ops" / "include" / "onnxnorm" / "ops_generated.h"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_native_ops", ROOT / "tools" / "gen_native_ops.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_op_table_is_current():
    assert GENERATED.read_text() == _generator().render(), (
        f"{GENERATED.relative_to(ROOT)} is stale: run python tools/gen_native_ops.py")


def _catalogue_with(**changes):
    """The catalogue module's names, some replaced."""
    original = _generator().load_catalogue()
    names = {k: getattr(original, k) for k in dir(original) if not k.startswith("__")}
    return types.SimpleNamespace(**{**names, **changes})


def test_generator_follows_the_catalogue():
    gen = _generator()
    cat = gen.load_catalogue()
    epsilon = dataclasses.replace(cat.EPSILON, default=1e-6, check="finite")
    ops = {name: dataclasses.replace(spec, attributes=tuple(epsilon if a.name == "epsilon" else a
                                                            for a in spec.attributes))
           for name, spec in cat.OPS.items()}
    text = gen.render(_catalogue_with(OPS=ops))
    assert "inline constexpr float kEpsilon = 1e-06f;" in text
    assert '{"epsilon", AttrKind::kFloat, 0, 1e-06f, AttrCheck::kFinite},' in text
    assert text != GENERATED.read_text()

    renamed = {("Norm" + name): dataclasses.replace(spec, name="Norm" + name) for name, spec in cat.OPS.items()}
    assert "  kNormRMSNorm = 1," in gen.render(_catalogue_with(OPS=renamed))

    unknown = dataclasses.replace(cat.EPSILON, check="positive")
    bad = {"LayerNorm": dataclasses.replace(cat.OPS["LayerNorm"], attributes=(unknown,))}
    with pytest.raises(ValueError, match="name no check"):
        gen.render(_catalogue_with(OPS=bad))
    with pytest.raises(ValueError, match="no native element type"):
        gen.render(_catalogue_with(DATA_TYPES=catalogue.DATA_TYPES + ("tensor(double)",)))
