"""Plugin execution providers in onnxnorm's runtime helpers (``onnxnorm.runtime``): found from
their packages, registered once, refused in one clear line where they cannot run, and a model
with onnxnorm nodes without bodies still runs (the library registered, those nodes on the CPU)."""

from __future__ import annotations

import numpy as np
import pytest

from onnxnorm import runtime
from onnxnorm.errors import OnnxNormError
from onnxnorm.testing.graphs import single_node_model


def _openvino():
    pytest.importorskip("onnxruntime_ep_openvino")
    return runtime.plugin("openvino")


def _openvino_with_device():
    """The OpenVINO plugin where it offers this machine a device (it offers Intel devices only:
    none on an AMD CPU), else a skip that says why."""
    plugin = _openvino()
    try:
        runtime.plugin_devices(plugin)
    except OnnxNormError as error:
        pytest.skip(str(error))
    return plugin


def _model(functions: bool):
    rng = np.random.default_rng(0)
    arrays = {
        "X": rng.standard_normal((2, 5, 16)).astype(np.float32),
        "Scale": rng.standard_normal(16).astype(np.float32),
    }
    feeds = {"x": arrays["X"], "scale": arrays["Scale"]}
    return single_node_model("RMSNorm", arrays, {}, functions=functions), feeds


def test_unknown_plugin():
    with pytest.raises(OnnxNormError, match="unknown plugin execution provider 'vulkan'"):
        runtime.plugin("vulkan")


def test_missing_plugin_package(monkeypatch):
    monkeypatch.setitem(runtime.PLUGIN_PACKAGES, "openvino", ("no_such_ep_package", ("CPU",)))
    with pytest.raises(OnnxNormError, match="pip install no-such-ep-package"):
        runtime.plugin("openvino")


def test_no_device_of_the_kind_asked():
    plugin = runtime.plugin("openvino", device_types=("NPU",)) if _openvino() else None
    with pytest.raises(
        OnnxNormError, match=r"offers no device of kind NPU .*ONNX Runtime found: .*CPU by "
    ):
        runtime.plugin_devices(plugin)


def test_plugin_or_providers_not_both():
    model, _ = _model(True)
    with pytest.raises(OnnxNormError, match="a plugin or providers"):
        runtime.session(model, plugin=_openvino(), providers=["CPUExecutionProvider"])


def test_a_body_runs_on_the_provider_without_the_library():
    model, feeds = _model(True)
    counts = runtime.placement(model, feeds, plugin=_openvino_with_device(), cpu_fallback=False)
    assert counts == {"OpenVINOExecutionProvider": 1}


def test_a_node_without_body_gets_the_library_and_the_cpu():
    """The fused target on a provider that does not take onnxnorm's ops: the library is
    registered (the node has no body) and the node runs on the CPU; with CPU fallback
    disabled the session is refused, not wrong."""
    model, feeds = _model(False)
    plugin = _openvino_with_device()
    assert runtime.placement(model, feeds, plugin=plugin) == {"CPUExecutionProvider": 1}
    with pytest.raises(Exception, match="fallback to CPU EP has been explicitly disabled"):
        runtime.session(model, plugin=plugin, cpu_fallback=False)
