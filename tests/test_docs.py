"""Generated documentation stays in step with the code."""

from pathlib import Path

from onnxnorm.ops import catalogue, docs

ROOT = Path(__file__).resolve().parents[1]


def test_ops_page_is_current():
    committed = (ROOT / "docs" / "ops.md").read_text()
    assert committed == docs.render(), (
        "docs/ops.md is stale: run python -m onnxnorm.ops.docs docs/ops.md"
    )


def test_ops_page_names_every_op_and_attribute():
    text = docs.render()
    for spec in catalogue.OPS.values():
        assert f"## {spec.name}" in text
        for attribute in spec.attributes:
            assert f"| {attribute.name} |" in text
