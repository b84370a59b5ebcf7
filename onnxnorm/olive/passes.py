"""The Olive pass, surgeon and model handler (see ``onnxnorm/olive/__init__.py``). Importing
this module imports Olive and defines them in Olive's registries, as any Olive pass module
does; it registers no library anywhere."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from onnxnorm._deps import require

require("olive", "onnxnorm.olive (the Olive pass and surgeon)")

import onnx  # noqa: E402
from olive.common.ort_inference import (  # noqa: E402
    check_and_normalize_provider_args,
    get_ort_available_providers,
)
from olive.hardware.accelerator import Device  # noqa: E402
from olive.model import ONNXModelHandler  # noqa: E402
from olive.model.config.registry import model_handler_registry  # noqa: E402
from olive.model.utils import resolve_onnx_path  # noqa: E402
from olive.package_config import OlivePackageConfig  # noqa: E402
from olive.passes import Pass  # noqa: E402
from olive.passes.onnx.common import get_external_data_config, model_proto_to_olive_model  # noqa: E402
from olive.passes.onnx.graph_surgeries import Surgeon  # noqa: E402
from olive.passes.pass_config import PassConfigParam, PassParamDefault  # noqa: E402
from olive.search.search_parameter import SpecialParamValue  # noqa: E402

from onnxnorm.olive import ATTRIBUTE, PASS, SURGEON, OliveSettingError, check_target  # noqa: E402
from onnxnorm.targets import DEFAULT, TARGETS  # noqa: E402

#: a child of Olive's logger, so that the report shows in Olive's log at its level
logger = logging.getLogger("olive.onnxnorm")


def _checked_setting(_, value: Any) -> Any:
    """The pass's ``target`` as Olive validates its config: a name is checked, Olive's own
    markers (default, search values) pass through."""
    if isinstance(value, str) and not isinstance(value, (PassParamDefault, SpecialParamValue)):
        check_target(value)
    return value


def _fuse(model: onnx.ModelProto, target: str, strict_precision: bool, base_dir: str | None):
    from onnxnorm.fusion import fuse

    fused, report = fuse(model, target=target, base_dir=base_dir, strict_precision=strict_precision)
    for line in str(report).splitlines():
        logger.info("onnxnorm: %s", line)
    return fused, report


def _verified(original, fused, where: str) -> list[dict[str, Any]]:
    """Runs both models (protos or files) on generated inputs; one line and
    :class:`OliveSettingError` when an output differs beyond tolerance."""
    from onnxnorm.fusion.verify import verify

    checks = verify(original, fused)
    for check in checks:
        logger.info("onnxnorm verify: %s", check)
    failed = [str(c) for c in checks if not c.ok]
    if failed:
        raise OliveSettingError(
            f"{where}: verify failed: the fused model's outputs differ "
            f"beyond tolerance: {'; '.join(failed)}"
        )
    return [vars(c) for c in checks]


def _session_options(settings: dict[str, Any]):
    """ONNX Runtime session options from Olive's ``inference_settings["session_options"]``,
    with the onnxnorm library registered."""
    import onnxruntime as ort

    from onnxnorm import runtime

    options = runtime.register(ort.SessionOptions())
    given = settings.get("session_options") or {}
    for key in ("inter_op_num_threads", "intra_op_num_threads", "log_severity_level"):
        if given.get(key) is not None:
            setattr(options, key, given[key])
    if given.get("enable_profiling"):
        options.enable_profiling = True
    if given.get("execution_mode") is not None:
        options.execution_mode = ort.ExecutionMode(given["execution_mode"])
    if given.get("graph_optimization_level") is not None:
        options.graph_optimization_level = ort.GraphOptimizationLevel(
            given["graph_optimization_level"]
        )
    for key, value in (given.get("extra_session_config") or {}).items():
        options.add_session_config_entry(key, value)
    return options


@model_handler_registry("OnnxNormModel")
class OnnxNormModelHandler(ONNXModelHandler):
    """An ONNX model with onnxnorm nodes that need the onnxnorm library (target ``fused``): its
    ONNX Runtime sessions, those of Olive's evaluators among them, register the library. Its
    session options come from ``inference_settings`` as for an ``ONNXModel``."""

    def prepare_session(
        self,
        inference_settings: dict[str, Any] | None = None,
        device: Device = Device.CPU,
        execution_providers: str | list[str] | None = None,
        rank: int | None = None,
    ):
        import onnxruntime as ort

        settings = self.merge_inference_settings(inference_settings, execution_providers)
        if not settings["execution_provider"]:
            settings["execution_provider"] = self._get_default_execution_providers(device)
            settings["provider_options"] = None
        providers, provider_options = check_and_normalize_provider_args(
            settings["execution_provider"],
            settings.get("provider_options"),
            get_ort_available_providers(),
        )
        return ort.InferenceSession(
            self.model_path,
            _session_options(settings),
            providers=providers,
            provider_options=provider_options,
        )


class OnnxNormFusion(Pass):
    """Fuses the norms of an ONNX model into onnxnorm ops (with their residual adds, where
    exact) and writes them for ``target``; ``verify`` runs the input and the output in ONNX
    Runtime on generated inputs and fails the pass over tolerance. The report, and the verify
    results, are the output model's ``model_attributes["onnxnorm"]``."""

    @classmethod
    def _default_config(cls, accelerator_spec) -> dict[str, PassConfigParam]:
        return {
            "target": PassConfigParam(
                type_=str,
                default_value=DEFAULT,
                description="what the fused model holds: "
                + "; ".join(f"{name}: {text}" for name, text in TARGETS.items()),
            ),
            "verify": PassConfigParam(
                type_=bool,
                default_value=False,
                description="run the input and the fused model in ONNX Runtime on generated "
                "inputs; the pass fails when an output differs beyond tolerance",
            ),
            "strict_precision": PassConfigParam(
                type_=bool,
                default_value=False,
                description="leave norms whose statistics the input computes in float16/"
                "bfloat16 as they are (by default they are fused with float32 "
                "statistics, and the report says so)",
            ),
            **get_external_data_config(),
        }

    @classmethod
    def _validators(cls) -> dict[str, Any]:
        from pydantic import field_validator

        return {"validate_target": field_validator("target")(classmethod(_checked_setting))}

    def _run_for_config(
        self, model: ONNXModelHandler, config, output_model_path: str
    ) -> ONNXModelHandler:
        check_target(config.target)
        source = Path(model.model_path)
        output_model_path = resolve_onnx_path(output_model_path, source.name)
        fused, report = _fuse(
            onnx.load(source), config.target, config.strict_precision, str(source.parent)
        )
        output = model_proto_to_olive_model(fused, output_model_path, config)
        del fused
        result = {"report": report.to_dict()}
        if config.verify:
            try:
                result["verify"] = _verified(source, output.model_path, PASS)
            except OliveSettingError:
                _remove(Path(output.model_path))
                raise
        if config.target == "fused":
            output = OnnxNormModelHandler(
                model_path=output.get_resource("model_path"),
                onnx_file_name=output.onnx_file_name,
                inference_settings=model.inference_settings,
            )
        else:
            output.inference_settings = model.inference_settings
        output.model_attributes = {**(model.model_attributes or {}), ATTRIBUTE: result}
        return output


class OnnxNormFuse(Surgeon):
    """The fusion as a surgery of Olive's ``GraphSurgeries`` pass: ``{"surgeon": "OnnxNormFuse",
    "target": ..., "verify": ..., "strict_precision": ...}``; the report goes to Olive's log."""

    def __init__(self, target: str = DEFAULT, verify: bool = False, strict_precision: bool = False):
        super().__init__()
        self.target = check_target(target, SURGEON)
        self.verify = verify
        self.strict_precision = strict_precision

    def __call__(self, model: onnx.ModelProto) -> onnx.ModelProto:
        fused, _ = _fuse(model, self.target, self.strict_precision, None)
        if self.verify:
            _verified(model, fused, SURGEON)
        return fused


def _remove(model_file: Path) -> None:
    for path in (model_file, Path(f"{model_file}.data")):
        path.unlink(missing_ok=True)


def package_config() -> dict[str, Any]:
    """Olive's package configuration (the passes it knows, and their dependencies) with
    :class:`OnnxNormFusion` added: for ``olive.workflows.run(config, package_config=...)`` or,
    written to a file, ``olive run --package-config``."""
    default = json.loads(Path(OlivePackageConfig.get_default_config_path()).read_text())
    default.setdefault("passes", {})[PASS] = {
        "module_path": f"{__name__}.{PASS}",
        "supported_providers": ["*"],
        "supported_accelerators": ["*"],
        "supported_precisions": ["*"],
        "supported_algorithms": [],
        "supported_quantization_encodings": [],
    }
    return default
