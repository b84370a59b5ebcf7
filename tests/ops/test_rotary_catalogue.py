"""The rotary ops in the catalogue: defined once, found by name beside the norm ops, every
attribute with a rule the native library knows, documented in docs/ops.md, and claimed by the
library on both providers (the native op table is generated from ALL_OPS)."""

from __future__ import annotations

import pytest

from onnxnorm import _native
from onnxnorm.ops import catalogue, docs

ROTARY = list(catalogue.ROTARY_OPS)


def test_rotary_ops_are_their_own_family():
    assert ROTARY == ["RMSNormRotary", "LayerNormRotary", "L2NormRotary"]
    assert not set(ROTARY) & set(catalogue.OPS)
    for name in ROTARY:
        spec = catalogue.get(name)
        assert spec is catalogue.ROTARY_OPS[name] and spec.rotary
        assert [p.name for p in spec.outputs] == ["QOut", "KOut"]
        assert spec.required_inputs == ("Q", "Cos", "Sin")
    assert not any(spec.rotary for spec in catalogue.OPS.values())
    with pytest.raises(KeyError, match="RMSNormRotary"):
        catalogue.get("NoSuchOp")


@pytest.mark.parametrize("name", ROTARY)
def test_rotary_attributes_and_types_are_known(name):
    spec = catalogue.ROTARY_OPS[name]
    for a in spec.attributes:
        assert a.check in catalogue.CHECKS, a.name
        assert a.validate(a.default) is None, a.name
    assert {p.type_var for p in spec.inputs + spec.outputs} <= set(catalogue.TYPE_VARS)
    constraints = spec.type_constraints
    assert constraints["I"] == ("tensor(int64)",)
    assert constraints["A"] == catalogue.DATA_TYPES
    # the norm's own inputs follow its kind: weights but for L2, a bias for LayerNorm alone
    names = {p.name for p in spec.inputs}
    assert ("QScale" in names) == (spec.norm != "l2")
    assert ("QBias" in names) == (spec.norm == "layer")
    assert spec.attribute("layout").validate(3) == "must be 0, 1 or 2, got 3"


def test_rotary_ops_are_documented():
    page = docs.render()
    for name in ROTARY:
        assert f"## {name}" in page
    assert "## The norm site of attention: Q/K norm and rotary" in page


def test_the_native_library_claims_the_rotary_ops():
    """The library's op table holds every op of ALL_OPS, the rotary ops after the norm ops, each
    with a kernel for every (T, S, A) on each provider (S is T for L2NormRotary, which has no
    weights)."""
    ops = {entry["name"]: entry for entry in _native.manifest()["ops"]}
    assert list(ops) == list(catalogue.ALL_OPS)
    for name in ROTARY:
        kernels = {tuple(k) for k in ops[name]["kernels"]}
        providers = ("CPUExecutionProvider", "CUDAExecutionProvider")
        assert {k[0] for k in kernels} == set(providers)
        weighted = catalogue.ROTARY_OPS[name].norm != "l2"
        for provider in providers:
            assert (provider, "float16", "float16", "float32") in kernels
            assert (provider, "bfloat16", "bfloat16", "bfloat16") in kernels
            assert (provider, "float32", "float32", "float32") in kernels
            assert ((provider, "float16", "float32", "float16") in kernels) == weighted
        assert len(kernels) == 2 * (9 if weighted else 5)
