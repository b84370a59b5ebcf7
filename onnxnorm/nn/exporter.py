"""``onnxnorm.export``: torch.onnx.export (dynamo) with one onnxnorm node per norm module (or per
fused residual add + norm), then lowered to the chosen target (``onnxnorm.targets``)."""

from __future__ import annotations

import contextlib
import copy
import inspect
import io
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import torch

from onnxnorm import targets
from onnxnorm._io import save_model
from onnxnorm.errors import OnnxNormError, first_line
from onnxnorm.nn.functional import TRANSLATION_TABLE
from onnxnorm.ops import catalogue, functions


@contextlib.contextmanager
def quiet_export(quiet: bool = True) -> Iterator[None]:
    """Silences what torch.onnx.export prints (progress lines, warnings, log records)."""
    if not quiet:
        yield
        return
    loggers = [logging.getLogger(name) for name in ("torch", "onnxscript", "onnx_ir")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _check_value(value: Any, where: str) -> None:
    if value is None or isinstance(value, (torch.Tensor, bool, int, float)):
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_value(item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            _check_value(item, f"{where}[{key!r}]")
        return
    hint = " (convert it with torch.from_numpy)" if type(value).__module__ == "numpy" else ""
    raise OnnxNormError(
        f"{where} must be a torch.Tensor, got {type(value).__module__}.{type(value).__name__}{hint}"
    )


def default_dynamic_shapes(
    model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None
) -> Any:
    """Dynamic batch (dim 0) and sequence (dim 1) axes for every tensor input of rank >= 2
    (batch only for rank 1), keyed by the names of ``model.forward``'s parameters as
    torch.export expects; None when no input has a dimension to make dynamic."""

    sequences: list[str] = []

    def dims(value: Any, name: str) -> Any:
        if isinstance(value, torch.Tensor) and value.dim() >= 1:
            if value.dim() == 1:
                return {0: "batch"}
            # inputs may have sequences of different lengths (encoder and decoder ids)
            sequences.append("sequence" if not sequences else f"sequence_{name}")
            return {0: "batch", 1: sequences[-1]}
        return None

    try:
        bound = inspect.signature(model.forward).bind(*args, **(kwargs or {}))
    except TypeError as error:
        raise OnnxNormError(f"the model's forward does not take these inputs: {error}") from None
    shapes: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        kind = bound.signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            shapes[name] = tuple(dims(v, f"{name}_{i}") for i, v in enumerate(value))
        elif kind is inspect.Parameter.VAR_KEYWORD:
            shapes[name] = {k: dims(v, k) for k, v in value.items()}
        else:
            shapes[name] = dims(value, name)
    if not any(v for v in shapes.values()):
        return None
    return shapes


def _auto(shapes: Any) -> Any:
    """``shapes`` with every named dim replaced by ``Dim.AUTO`` (dynamic where the model allows)."""
    if isinstance(shapes, dict) and all(isinstance(k, int) for k in shapes):
        return dict.fromkeys(shapes, torch.export.Dim.AUTO)
    if isinstance(shapes, dict):
        return {k: _auto(v) for k, v in shapes.items()}
    if isinstance(shapes, (tuple, list)):
        return type(shapes)(_auto(v) for v in shapes)
    return shapes


def _first_line(error: BaseException) -> str:
    """The error's type and first line: torch's exceptions say little without their type."""
    text = first_line(error, "")
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _innermost(error: BaseException) -> BaseException:
    """The original error under the exporter's wrappers (torch.onnx wraps what it catches)."""
    seen = set()
    while id(error) not in seen:
        seen.add(id(error))
        cause = error.__cause__ or error.__context__
        if cause is None:
            break
        error = cause
    return error


def norm_modules(model: torch.nn.Module) -> dict[str, list[str]]:
    """The model's norm modules by kind: ``onnxnorm`` (exported as onnxnorm nodes), ``other``
    (norms of other classes, which :func:`onnxnorm.convert` may replace) and ``no_op`` (norms
    that have no onnxnorm op: BatchNorm, GroupNorm, InstanceNorm, LocalResponseNorm)."""
    from onnxnorm.nn.converter import UNSUPPORTED
    from onnxnorm.nn.modules import NORM_TYPES

    found: dict[str, list[str]] = {"onnxnorm": [], "other": [], "no_op": []}
    for name, module in model.named_modules():
        label = f"{name or '<model>'} ({type(module).__name__})"
        if isinstance(module, NORM_TYPES):
            found["onnxnorm"].append(name)
        elif isinstance(module, tuple(UNSUPPORTED)):
            found["no_op"].append(label)
        elif "norm" in type(module).__name__.lower() and not list(module.children()):
            found["other"].append(label)
    return found


def _listed(items: list[str]) -> str:
    return ", ".join(items[:4]) + (" ..." if len(items) > 4 else "")


def _no_norms_message(model: torch.nn.Module) -> str:
    found = norm_modules(model)
    if found["other"]:
        return (
            f"the exported graph has no onnxnorm node: the model's norm modules are not "
            f"onnxnorm modules ({_listed(found['other'])}); pass convert=True or call "
            "onnxnorm.convert(model) first (its report says what it cannot replace)"
        )
    if found["no_op"]:
        return (
            f"the model has no norm that onnxnorm exports: {_listed(found['no_op'])} "
            "have no onnxnorm op and export as standard ONNX ops (pass allow_no_norms=True "
            "to export anyway)"
        )
    return (
        "the model has no norm modules: the exported graph has no onnxnorm node (use "
        "torch.onnx.export for models without norms, or pass allow_no_norms=True)"
    )


def save(
    model: onnx.ModelProto, path: str | os.PathLike, external_data: bool | None = None
) -> Path:
    """Writes ``model`` to ``path`` atomically (:func:`onnxnorm._io.save_model`); with
    ``external_data`` (default: when the model is over protobuf's 2 GB limit) the tensors go
    to ``<name>.data`` next to it, one at a time, and ``model`` keeps its own."""
    return save_model(model, path, external=external_data)


def lower(model: onnx.ModelProto, mode: str, runtime: str | None = None) -> onnx.ModelProto:
    """The exported model (onnxnorm nodes, no function bodies) in target ``mode``, or node by
    node in the forms of ``runtime`` (:data:`onnxnorm.targets.RUNTIMES`)."""
    if runtime is None and mode == "function":
        return functions.attach_functions(model)
    if runtime is None and mode == "fused":
        return functions.strip_functions(model)
    try:
        from onnxnorm.fusion.lowering import lower as lower_to
    except ImportError as error:
        raise OnnxNormError(
            f"export mode {mode!r} needs onnxnorm.fusion.lowering, which this "
            f"installation lacks ({error})"
        ) from None
    return lower_to(functions.strip_functions(model), mode, runtime=runtime)


def export(
    model: torch.nn.Module,
    args: Any = (),
    path: str | os.PathLike | None = None,
    *,
    mode: str = "function",
    runtime: str | None = None,
    opset_version: int = 18,
    kwargs: dict[str, Any] | None = None,
    dynamic: bool = True,
    dynamic_shapes: Any = None,
    input_names: list[str] | None = None,
    output_names: list[str] | None = None,
    convert: bool = False,
    external_data: bool | None = None,
    allow_no_norms: bool = False,
    verbose: bool = False,
) -> onnx.ModelProto:
    """Exports ``model`` with ``torch.onnx.export(dynamo=True)``; every onnxnorm norm module, and
    every residual add fused with a norm (:mod:`onnxnorm.nn.residual`), becomes one node.

    ``mode`` is the target, a name of :data:`onnxnorm.targets.TARGETS`. The default,
    ``"function"``, runs in ONNX Runtime (the fused kernels with the onnxnorm library
    registered, the function bodies without) and in runtimes that inline model-local
    functions. ``runtime`` (a name of :data:`onnxnorm.targets.RUNTIMES`, ``--for``) writes
    each norm in the form that runtime runs best instead (docs/runtimes.md).

    ``dynamic`` (default) makes dims 0 and 1 (batch and sequence) of every tensor input
    dynamic unless ``dynamic_shapes`` says otherwise (give example sizes of 2 or more there:
    torch.export may specialize a size-1 example, so that other sizes fail at run time).
    ``convert`` first replaces the norm modules of a copy of ``model`` with onnxnorm modules
    (:func:`onnxnorm.convert`; the model itself is left as it is). ``external_data`` writes the
    weights next to the model file (default: only for models over 2 GB). The model is written to
    ``path`` (atomically) when given, and returned. Bad input raises :class:`OnnxNormError` with a
    one-line message.
    """
    targets.check(mode, "export mode")
    if runtime is not None:
        targets.check_runtime(runtime)
    if not isinstance(opset_version, int) or opset_version < functions.MIN_OPSET:
        raise OnnxNormError(f"opset_version must be >= {functions.MIN_OPSET}, got {opset_version}")
    if not isinstance(model, torch.nn.Module):
        raise OnnxNormError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(args, tuple):
        args = (args,)
    _check_value(args, "args")
    if kwargs is not None:
        if not isinstance(kwargs, dict):
            raise OnnxNormError(f"kwargs must be a dict, got {type(kwargs).__name__}")
        _check_value(kwargs, "kwargs")
    if path is not None:
        folder = Path(path).parent
        if not folder.is_dir():
            raise OnnxNormError(f"cannot write {path}: folder {folder} does not exist")
    if convert:
        from onnxnorm.nn.converter import convert as convert_model

        model = copy.deepcopy(model)
        convert_model(model)
    guessed = dynamic_shapes is None and dynamic
    if guessed:
        dynamic_shapes = default_dynamic_shapes(model, args, kwargs)

    def run(shapes: Any) -> Any:
        with quiet_export(not verbose):
            return torch.onnx.export(
                model,
                args,
                kwargs=kwargs,
                dynamo=True,
                opset_version=opset_version,
                custom_translation_table=TRANSLATION_TABLE,
                dynamic_shapes=shapes,
                input_names=input_names,
                output_names=output_names,
                verbose=verbose,
                optimize=True,
            )

    was_training = model.training
    model.eval()
    try:
        try:
            program = run(dynamic_shapes)
        except Exception as error:
            problem = _eager_failure(model, args, kwargs)
            if problem:
                raise OnnxNormError(problem) from error
            if not guessed or dynamic_shapes is None:
                raise OnnxNormError(_exporter_failure(error)) from error
            # dim 1 is not a sequence in this model (channels, features): let torch.export
            # decide which of the guessed dims are really dynamic
            try:
                program = run(_auto(dynamic_shapes))
            except Exception as second:
                raise OnnxNormError(_exporter_failure(second)) from second
    finally:
        model.train(was_training)
    proto = _rotary_fused(single_output_rotary(program.model_proto))
    if not allow_no_norms and not any(True for _ in functions.onnxnorm_nodes(proto)):
        raise OnnxNormError(_no_norms_message(model))
    proto = lower(proto, mode, runtime)
    if path is not None:
        save(proto, path, external_data)
    return proto


def _rotary_fused(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each onnxnorm Q/K norm node and the rotary the model's own code computes
    after it (a transformers model after ``convert``: its q_norm and k_norm are onnxnorm
    modules, its rotary is not) as one rotary op, Q and K in one node (the fusion's stage
    rotary, :func:`onnxnorm.fusion.pipeline.fuse_rotary`); ``model`` itself where there is
    none (nothing else is rewritten)."""
    from onnxnorm.fusion.pipeline import fuse_rotary

    fused, report = fuse_rotary(model)
    return fused if report.fused_total else model


def single_output_rotary(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each rotary node of Q alone (``catalogue.ROTARY_OPS``, K left out) given
    its one output, QOut, as the fusion writes it: the exporter gives a node every output of
    its schema, and KOut is never used there. Changed in place and returned."""
    dropped: set[str] = set()
    for node in model.graph.node:
        if (
            node.domain == catalogue.DOMAIN
            and node.op_type in catalogue.ROTARY_OPS
            and (len(node.input) < 2 or not node.input[1])
            and len(node.output) > 1
        ):
            dropped.update(name for name in node.output[1:] if name)
            del node.output[1:]
    if dropped:
        used = {name for node in model.graph.node for name in node.input}
        used |= {output.name for output in model.graph.output}
        if dropped & used:
            raise OnnxNormError(
                f"a rotary node of Q alone has its KOut used: {sorted(dropped & used)}"
            )
        kept = [info for info in model.graph.value_info if info.name not in dropped]
        del model.graph.value_info[:]
        model.graph.value_info.extend(kept)
    return model


def _eager_failure(
    model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None
) -> str | None:
    """Why the model itself fails on these inputs, without the exporter (None if it runs)."""
    try:
        with torch.no_grad():
            model(*args, **(kwargs or {}))
    except Exception as error:  # noqa: BLE001 - the model fails on its own: that is what to report
        return f"the model fails on the given inputs: {_first_line(error)}"
    return None


def _exporter_failure(error: Exception) -> str:
    return f"torch.onnx.export failed: {_first_line(_innermost(error))}"


def count_norm_nodes(model: onnx.ModelProto) -> dict[str, int]:
    """Norm nodes of the model by op type: onnxnorm ops and the ORT / ONNX norm ops."""
    counts: dict[str, int] = {}
    for node in model.graph.node:
        if ("" if node.domain == "ai.onnx" else node.domain, node.op_type) in catalogue.NORM_OPS:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts
