"""A stand-in for Triton's ONNX Runtime backend, for tests only: a Python-based Triton backend
named ``onnxruntime`` (``BACKEND_DIR/onnxruntime/model.py``), so that a repository written by
``onnxnorm triton`` is served, unchanged, by a real tritonserver whose build has no ONNX Runtime
backend (PyTriton's). Triton reads the config (batching, instance groups, inputs and outputs)
and runs its dynamic batcher; this file does what the C++ backend does with it:

- registers every ``model_operations.op_library_filename`` into the session options, by the
  path as written (ONNX Runtime's RegisterCustomOpsLibrary, which the C++ backend calls);
- opens ``<model folder>/<version>/model.onnx`` on the CPU provider (CUDA for KIND_GPU);
- refuses a config whose inputs or outputs differ from the model's (names, types, dims);
- stacks the requests of a batch along the first dim, runs once, splits the outputs.

It is not Triton's backend: it shows that the generated repository is complete and consistent
as Triton reads it, not that the C++ backend's build of ONNX Runtime accepts the library.
"""

import json
import os

import numpy as np
import onnxruntime
import triton_python_backend_utils as pb_utils

_TYPES = {
    "tensor(float)": "TYPE_FP32",
    "tensor(float16)": "TYPE_FP16",
    "tensor(double)": "TYPE_FP64",
    "tensor(int8)": "TYPE_INT8",
    "tensor(int16)": "TYPE_INT16",
    "tensor(int32)": "TYPE_INT32",
    "tensor(int64)": "TYPE_INT64",
    "tensor(uint8)": "TYPE_UINT8",
    "tensor(bool)": "TYPE_BOOL",
    "tensor(string)": "TYPE_STRING",
}


def _dims(shape):
    return [d if isinstance(d, int) else -1 for d in shape]


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.batched = int(config.get("max_batch_size", 0)) > 0
        options = onnxruntime.SessionOptions()
        for library in config.get("model_operations", {}).get("op_library_filename", []):
            options.register_custom_ops_library(library)
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        providers = ["CPUExecutionProvider"]
        if args["model_instance_kind"] == "GPU":
            providers.insert(
                0, ("CUDAExecutionProvider", {"device_id": int(args["model_instance_device_id"])})
            )
        self.session = onnxruntime.InferenceSession(path, options, providers=providers)
        for kind, declared, actual in (
            ("input", config["input"], self.session.get_inputs()),
            ("output", config["output"], self.session.get_outputs()),
        ):
            found = {a.name: (_TYPES.get(a.type), _dims(a.shape)) for a in actual}
            for entry in declared:
                dims = [int(d) for d in entry["dims"]]
                if "reshape" in entry:
                    dims = [int(d) for d in entry["reshape"].get("shape", [])]
                want = (entry["data_type"], ([-1] if self.batched else []) + dims)
                if found.get(entry["name"]) != want:
                    raise pb_utils.TritonModelException(
                        f"{kind} {entry['name']!r}: the config says {want}, the model "
                        f"{found.get(entry['name'])}"
                    )
            if len(declared) != len(found):
                raise pb_utils.TritonModelException(
                    f"the config declares {len(declared)} {kind}s, the model has {len(found)}"
                )
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]

    def _run(self, feeds):
        return self.session.run(self.outputs, feeds)

    def execute(self, requests):
        arrays = [
            {n: pb_utils.get_input_tensor_by_name(r, n).as_numpy() for n in self.inputs}
            for r in requests
        ]
        responses = [None] * len(requests)
        groups = {}
        for i, feeds in enumerate(arrays):
            key = (
                tuple((n, a.shape[1:], a.dtype.str) for n, a in feeds.items())
                if self.batched
                else i
            )
            groups.setdefault(key, []).append(i)
        for members in groups.values():
            feeds = {n: np.concatenate([arrays[i][n] for i in members]) for n in self.inputs}
            try:
                outputs = self._run(feeds)
            except Exception as error:  # noqa: BLE001 - returned to the clients
                for i in members:
                    responses[i] = pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(str(error).splitlines()[0])
                    )
                continue
            rows = np.cumsum([len(arrays[i][self.inputs[0]]) for i in members])[:-1]
            parts = [np.split(out, rows) for out in outputs]
            for j, i in enumerate(members):
                responses[i] = pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor(n, part[j]) for n, part in zip(self.outputs, parts)
                    ]
                )
        return responses
