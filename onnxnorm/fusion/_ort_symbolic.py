"""ONNX Runtime's symbolic shape inference, made sound for the residual rules: the one place that
reaches into its private methods.

The residual rules take two equal dims as proof that an Add does not broadcast. Upstream
(``onnxruntime/tools/symbolic_shape_infer.py``), an op that broadcasts two dims it cannot prove
equal either stops the inference or, with ``auto_merge``, declares them equal, though one may be
1 at run time. Here no broadcast merges dims: such an output dim gets a name of its own, equal to
nothing else, and the inference goes on past the op (``infer_shapes`` would also save the model
to the working directory where it stops; here the shapes found so far are kept).

Upstream also reads a Constant's value from its ``value`` attribute alone, and stops at a
Constant written with ``value_float``, ``value_ints``, ...; here those are read too.

What it overrides and reads, none of it public (read on onnxruntime 1.21 to 1.32):
``_check_merged_dims``, ``_broadcast_shapes``, ``_onnx_infer_single_node``, ``_infer_Constant``,
``_preprocess``, ``_infer_impl``, ``_update_output_from_vi`` (where present), and the attributes
``symbolic_dims_``, ``known_vi_``, ``sympy_data_``, ``run_``, ``out_mp_``. The public API that
would replace them: an option of ``SymbolicShapeInference.infer_shapes`` to give a broadcast of
unproven dims a fresh symbol instead of merging them or stopping, and to return the shapes found
so far, and a Constant read from any of its attributes.

Where a future ONNX Runtime changes these, the pass goes on with onnx's shapes alone (its
caller, ``passes.symbolic_shapes``, is best effort), and :func:`check`, which the tests call on
every supported version, fails loudly.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx

#: ops whose output shape ORT's symbolic inference takes from onnx's, broadcasting their inputs
_BROADCASTING = {"Add", "Sub", "Mul", "Div", "Pow", "Where", "Sum", "Max", "Min", "MatMul"}
#: the private methods and attributes this module relies on
_METHODS = (
    "_check_merged_dims",
    "_broadcast_shapes",
    "_onnx_infer_single_node",
    "_infer_Constant",
    "_preprocess",
    "_infer_impl",
)
_ATTRIBUTES = ("symbolic_dims_", "known_vi_", "run_", "out_mp_")
#: a Constant's attributes other than ``value`` that hold a number or numbers, and their type
_CONSTANT_NUMBERS = {
    "value_float": "float32",
    "value_floats": "float32",
    "value_int": "int64",
    "value_ints": "int64",
}


def _upstream():
    """ORT's SymbolicShapeInference, loaded from its file: importing the onnxruntime.tools
    package imports torch, which takes seconds."""
    import onnxruntime

    name = "_onnxnorm_symbolic_shape_infer"
    if name not in sys.modules:
        path = Path(onnxruntime.__file__).parent / "tools" / "symbolic_shape_infer.py"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name].SymbolicShapeInference


def _inference_class():
    import sympy

    upstream: Any = _upstream()  # a class of an untyped module, found at run time

    class Inference(upstream):
        def _fresh(self) -> str:
            name = f"onnxnorm_unknown_{len(self.symbolic_dims_)}"
            self.symbolic_dims_[name] = sympy.Symbol(name, integer=True, nonnegative=True)
            return name

        def _check_merged_dims(self, dims, allow_broadcast=True):
            if not allow_broadcast:  # dims an op requires to be equal (Concat, MatMul's inner)
                super()._check_merged_dims(dims, allow_broadcast)

        def _infer_Constant(self, node):
            for attr in node.attribute:
                if attr.name == "value":
                    super()._infer_Constant(node)
                elif attr.name in _CONSTANT_NUMBERS:
                    number = onnx.helper.get_attribute_value(attr)
                    self.sympy_data_[node.output[0]] = np.array(
                        number, dtype=_CONSTANT_NUMBERS[attr.name]
                    )

        def _broadcast_shapes(self, shape1, shape2):
            shape = super()._broadcast_shapes(shape1, shape2)
            return [self._fresh() if dim is None else dim for dim in shape]

        def _onnx_infer_single_node(self, node):
            super()._onnx_infer_single_node(node)
            if node.op_type not in _BROADCASTING or node.domain not in ("", "ai.onnx"):
                return
            for name in node.output:
                info = self.known_vi_.get(name)
                if info is None or not info.type.HasField("tensor_type"):
                    continue
                for dim in info.type.tensor_type.shape.dim:
                    if not dim.HasField("dim_value") and (
                        not dim.dim_param or dim.dim_param.startswith("unk__")
                    ):
                        dim.dim_param = self._fresh()

    return Inference


def infer_symbolic(proto: onnx.ModelProto) -> onnx.ModelProto:
    """``proto`` with ORT's symbolic shapes, no broadcast merging two dims (module docstring)."""
    inference = _inference_class()(2**31 - 1, False, False, 0)
    inference._preprocess(proto)
    while inference.run_:
        if not inference._infer_impl():
            break
    if hasattr(inference, "_update_output_from_vi"):  # the graph outputs' shapes, where found
        inference._update_output_from_vi()
    return inference.out_mp_


def check() -> None:
    """Raises AssertionError, naming the installed onnxruntime, when the private pieces this
    module relies on are gone or no longer behave as it expects: a broadcast of two unproven
    dims must give a fresh dim, and an Add of two equal symbols keep it."""
    import onnxruntime
    from onnx import TensorProto, helper

    version = f"onnxruntime {onnxruntime.__version__}"
    upstream = _upstream()
    missing = [m for m in _METHODS if not callable(getattr(upstream, m, None))]
    assert not missing, f"{version}: SymbolicShapeInference lacks {missing}"
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["a", "b"], ["c"]),
            helper.make_node("Add", ["a", "a"], ["d"]),
            helper.make_node("Constant", [], ["one"], value_float=1.0),
            helper.make_node("Add", ["d", "one"], ["e"]),
        ],
        "check",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 4]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, ["m", 4]),
        ],
        [helper.make_tensor_value_info(v, TensorProto.FLOAT, None) for v in ("c", "d", "e")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    instance = _inference_class()(2**31 - 1, False, False, 0)
    instance._preprocess(model)
    missing = [a for a in _ATTRIBUTES if not hasattr(instance, a)]
    assert not missing, f"{version}: SymbolicShapeInference lacks {missing} after _preprocess"
    inferred = infer_symbolic(model)
    shapes = {
        v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in list(inferred.graph.value_info) + list(inferred.graph.output)
    }
    assert shapes.get("d") == ["n", 4], f"{version}: Add(a, a) gives {shapes.get('d')}"
    # past a Constant of value_float (upstream stops at it)
    assert shapes.get("e") == ["n", 4], f"{version}: Add(d, value_float 1) gives {shapes.get('e')}"
    broadcast = shapes.get("c")
    first = broadcast[0] if broadcast else None
    assert isinstance(first, str) and first.startswith("onnxnorm_unknown_"), (
        f"{version}: a broadcast of n and m gives {shapes.get('c')}, not a fresh dim: "
        "onnxnorm/fusion/_ort_symbolic.py must follow ONNX Runtime's change"
    )
