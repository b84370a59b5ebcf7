"""The op catalogue and everything derived from it."""

from onnxnorm.ops import bodies, catalogue, functions, opsets, overloads, reference, schemas
from onnxnorm.ops.catalogue import DOMAIN, OPS, VERSION, OpSpec
from onnxnorm.ops.functions import attach_functions, strip_functions

schemas.register()

__all__ = [
    "DOMAIN",
    "OPS",
    "VERSION",
    "OpSpec",
    "attach_functions",
    "bodies",
    "catalogue",
    "functions",
    "opsets",
    "overloads",
    "reference",
    "schemas",
    "strip_functions",
]
