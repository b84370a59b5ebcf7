"""The axes of the test matrix, each derived once from what defines it: the element types and
(X, weight) type pairs from the op catalogue (``onnxnorm.ops.catalogue``), the targets from
``onnxnorm.targets``. A test that takes a subset says which, by one of the names below or by a
filter of them."""

from __future__ import annotations

import numpy as np

from onnxnorm import targets
from onnxnorm.ops import catalogue
from onnxnorm.testing.graphs import numpy_type

#: X's types (catalogue.DATA_TYPES) by their numpy names: "float32", "float16", "bfloat16"
DTYPES = {t.name: t for t in map(numpy_type, catalogue.DATA_TYPES)}
F32, F16, BF16 = DTYPES.values()
#: the quantized types' numpy types (catalogue.QUANT_TYPES): uint8, int8, float8 e4m3fn
QUANT_DTYPES = {t.name: t for t in map(numpy_type, catalogue.QUANT_TYPES)}
F8 = QUANT_DTYPES["float8_e4m3fn"]


def torch_to_numpy() -> dict:
    """torch's type -> numpy's, for X's types (torch names them as numpy does). It imports
    torch, which importing this module does not."""
    import torch

    return {getattr(torch, name): t for name, t in DTYPES.items()}


def type_id(x: np.dtype, weight: np.dtype | None = None) -> str:
    """A short test id of X's type and, where it differs, the weights' type: "bf16",
    "f16-w32"."""
    short = np.dtype(x).name.replace("float", "f")
    if weight is None or np.dtype(weight) == np.dtype(x):
        return short
    return f"{short}-w{np.dtype(weight).name.replace('float', '')}"


#: every (X type, weight type) an op with weights takes (catalogue.TYPE_PAIRS), and their ids
TYPE_PAIRS = [(numpy_type(t), numpy_type(s)) for t, s in catalogue.TYPE_PAIRS]
TYPE_IDS = [type_id(t, s) for t, s in TYPE_PAIRS]
#: the weight inputs: every op input of the weights' type variable S, in catalogue order
WEIGHTS = tuple(
    dict.fromkeys(
        p.name for spec in catalogue.OPS.values() for p in spec.inputs if p.type_var == "S"
    )
)

#: every target (onnxnorm.targets.TARGETS), in its order: function, fused, ort, onnx
TARGETS = tuple(targets.TARGETS)
#: the targets whose models keep the onnxnorm nodes: with their function bodies, or without
#: (which only ONNX Runtime with the onnxnorm library runs)
NODE_TARGETS = ("function", "fused")
#: the targets that write the norms in standard ops (ONNX Runtime's contrib ops, or ONNX's)
LOWERED_TARGETS = tuple(t for t in TARGETS if t not in NODE_TARGETS)
#: every target but "fused": their models hold function bodies or standard ops, which run
#: without the onnxnorm library
TARGETS_WITHOUT_LIBRARY = tuple(t for t in TARGETS if t != "fused")
