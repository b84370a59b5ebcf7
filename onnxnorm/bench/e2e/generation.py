"""The generation loop every ONNX Runtime variant runs: greedy, with a KV cache, through IO
binding (:class:`Generator`); :func:`collect` turns any generator's steps into one generation's
tokens and times."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from onnxnorm.bench.e2e.config import Config
from onnxnorm.bench.timing import clock
from onnxnorm.testing.hf import past_names


def _session(path: str, library: bool, threads: int, device: str, profile: str | None = None):
    """An ORT session of the variant, as every variant's is made (``profile``: ORT's profile
    file prefix)."""
    import onnxruntime as ort

    from onnxnorm import runtime

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    # the threads stop spinning when a run ends: the variants generate in lockstep, and one
    # session's idle threads must not take the cores from the next session's run
    options.add_session_config_entry("session.force_spinning_stop", "1")
    if profile:
        options.enable_profiling = True
        options.profile_file_prefix = profile
    providers: list[Any] = ["CPUExecutionProvider"]
    if device.startswith("cuda"):
        providers = [
            (
                "CUDAExecutionProvider",
                {"enable_cuda_graph": "1" if device == "cuda-graph" else "0"},
            ),
            "CPUExecutionProvider",
        ]
    return runtime.session(path, options, providers, with_library=library)


class Generator:
    """Greedy generation through one ORT session: the prompt in one run, then one token per
    run, through IO binding: the outputs stay in ORT's buffers and the present keys and
    values are bound as the next run's past as they are; only the last row of logits is read."""

    def __init__(
        self,
        path: str,
        library: bool,
        config: Config,
        device: str = "cpu",
        profile: str | None = None,
    ):
        import onnxruntime as ort

        self.session = _session(path, library, config.threads, device, profile)
        self.config = config
        self.device = "cuda" if device.startswith("cuda") else "cpu"
        types = {i.name: i.type for i in self.session.get_inputs()}
        self.dtype = np.float16 if types[past_names(1)[0]] == "tensor(float16)" else np.float32
        self.empty = {
            name: ort.OrtValue.ortvalue_from_numpy(
                np.zeros((1, config.kv_heads, 0, config.head_dim), self.dtype), self.device
            )
            for name in past_names(config.layers)
        }
        self.outputs = [o.name for o in self.session.get_outputs()]

    def generate(self, prompt: list[int], new_tokens: int) -> tuple[list[int], float, list[float]]:
        """(tokens, prefill seconds, seconds of each further step)."""
        return collect(self.steps(prompt, new_tokens))

    def steps(self, prompt: list[int], new_tokens: int) -> Iterator[tuple[int, float]]:
        """Generates one token per ``next()``: (the token, the seconds its step took)."""
        binding = self.session.io_binding()
        past = dict(self.empty)
        ids = np.asarray([prompt], np.int64)
        total = len(prompt)
        pasts = past_names(self.config.layers)
        for _ in range(new_tokens):
            started = clock()
            binding.clear_binding_inputs()
            binding.clear_binding_outputs()
            binding.bind_cpu_input("input_ids", ids)
            binding.bind_cpu_input("attention_mask", np.ones((1, total), np.int64))
            for name in pasts:
                binding.bind_ortvalue_input(name, past[name])
            for name in self.outputs:
                binding.bind_output(name, self.device)
            self.session.run_with_iobinding(binding)
            values = binding.get_outputs()
            logits = values[0].numpy()[0, -1]
            token = int(np.argmax(logits))
            past = dict(zip(pasts, values[1:]))
            yield token, clock() - started
            ids = np.asarray([[token]], np.int64)
            total += 1


def collect(steps: Iterator[tuple[int, float]]) -> tuple[list[int], float, list[float]]:
    """(tokens, prefill seconds, seconds of each further step) of a whole generation, from a
    generator's ``steps``."""
    tokens, seconds = [], []
    for token, elapsed in steps:
        tokens.append(token)
        seconds.append(elapsed)
    return tokens, seconds[0], seconds[1:]
