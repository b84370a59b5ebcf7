"""docs/ops.md as the catalogue renders it names every op and attribute
(tests/packaging/test_generated.py holds the committed page current)."""

from onnxnorm.ops import catalogue, docs


def test_ops_page_names_every_op_and_attribute():
    text = docs.render()
    for spec in catalogue.OPS.values():
        assert f"## {spec.name}" in text
        for attribute in spec.attributes:
            assert f"| {attribute.name} |" in text
