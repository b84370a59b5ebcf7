"""``onnxnorm bench e2e``: greedy generation with a KV cache, as users run a decoder, for every
way of getting its norms into ONNX Runtime.

A Llama-style decoder (``LlamaForCausalLM``) and a Gemma-2-style sandwich decoder
(``Gemma2ForCausalLM``) are built from configs in code with seeded random weights (nothing is
downloaded; the vocabulary is small, see :class:`Config`) and exported by
``torch.onnx.export(dynamo=True)`` with their past keys and values as inputs and the present
ones as outputs. Each variant of the model then generates ``new_tokens`` tokens after a
``prompt``-token prompt, greedily (numpy argmax), through one loop that is the same for every
variant:

- ``export``: the exported model as it is;
- ``ort-optimizer``: ONNX Runtime's transformers optimizer (``optimize_model``);
- ``onnxscript``: onnxscript's ``ort_fusions.optimize_for_ort``;
- ``onnxnorm-ort``: ``onnxnorm fuse --target ort`` (ONNX Runtime's own norm ops);
- ``onnxnorm-fused``: ``onnxnorm fuse --target fused``, run with the onnxnorm library;
- ``onnxnorm-export``: ``onnxnorm.export(model, ..., mode="fused", convert=True)`` from the
  torch model, run with the onnxnorm library.

The loop runs the prompt once (the prefill, which yields the first token), then one token at a
time, binding the present keys and values the last run returned (ORT's own buffers, through IO
binding, never copied) as the next run's past. All variants run in one process, ``repeats``
times, their sessions opened anew each time in a shuffled order, and generate in lockstep (step
k of every variant before step k + 1 of any, in a shuffled order; genai's by whole
generations), every step timed; beside them a second session of the group's first variant (the
control) shows what the timing's own noise is. Apart from the timed runs, one profiled
generation per variant (ORT's profiler) gives the share of node time spent in norm kernels,
and one generation per variant in a fresh interpreter gives its peak resident memory.

The same is measured through onnxruntime-genai: its model builder's folders (fp32 and int4)
of the same configs before and after ``onnxnorm genai``, generating with genai's own loop.

With ``--quantize dynamic,static`` the exported decoder is quantized by ONNX Runtime's own
tools (``quantize_dynamic``, and ``quantize_static`` in QDQ format calibrated on a few
generated prompts; the MatMuls only, as a user quantizes a decoder), and each quantized model
is measured by the same loop as it is, after ORT's transformers optimizer, and after ``onnxnorm
fuse --target ort`` / ``--target fused``, which turns each norm and the quantizer after it into
one quantized onnxnorm op (``RMSNormDynamicQuantizeLinear``, ``SkipRMSNormQuantizeLinear``, ...).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

FAMILIES = ("llama", "gemma2")
DTYPES = ("float32", "float16")
#: variant -> what a user runs to get it
VARIANTS = {
    "export": "torch.onnx.export(dynamo=True), as it is",
    "ort-optimizer": "onnxruntime.transformers.optimizer.optimize_model(model_type='gpt2', "
                     "num_heads=0, hidden_size=0, opt_level=0)",
    "onnxscript": "onnxscript.rewriter.ort_fusions.optimize_for_ort",
    "onnxnorm-ort": "onnxnorm fuse --target ort",
    "onnxnorm-fused": "onnxnorm fuse --target fused (+ the onnxnorm library)",
    "onnxnorm-export": "onnxnorm.export(model, mode='fused', convert=True) (+ the library)",
}
ONNXNORM_VARIANTS = ("onnxnorm-ort", "onnxnorm-fused", "onnxnorm-export")
GENAI_PRECISIONS = ("fp32", "int4")
GENAI_VARIANTS = {"genai": "the model builder's folder, as it is",
                  "genai+onnxnorm": "onnxnorm genai (+ the library, registered in genai_config.json)"}
DEVICES = ("cpu", "cuda", "cuda-graph")
#: quantization -> what makes it (``none``: the float export, the variants above)
QUANTIZATIONS = {
    "dynamic": "onnxruntime.quantization.quantize_dynamic(src, dst, op_types_to_quantize=['MatMul'])",
    "static": "onnxruntime.quantization.quantize_static(src, dst, reader, "
              "quant_format=QuantFormat.QDQ, op_types_to_quantize=['MatMul']), calibrated on "
              "4 generated prompts",
}
#: variant of a quantized group -> what a user runs to get it (from the quantized model)
QUANT_VARIANTS = {
    "quantized": "the quantized export, as it is",
    "ort-optimizer": "optimize_model(quantized, model_type='gpt2', num_heads=0, hidden_size=0, "
                     "opt_level=0)",
    "onnxnorm-ort": "onnxnorm fuse --target ort of the quantized model",
    "onnxnorm-fused": "onnxnorm fuse --target fused of the quantized model (+ the onnxnorm library)",
}
QUANT_ONNXNORM_VARIANTS = ("onnxnorm-ort", "onnxnorm-fused")
#: prompts (of the benchmark's prompt length, other ids) that calibrate static quantization
CALIBRATION_PROMPTS = 4
#: ONNX's quantizers: those that read a norm's output count as norm time in the profile
QUANTIZERS = ("QuantizeLinear", "DynamicQuantizeLinear")

#: op types whose kernels count as norm time in the profile
NORM_OPS = frozenset({
    "LayerNorm", "RMSNorm", "SkipLayerNorm", "SkipRMSNorm", "SandwichLayerNorm", "SandwichRMSNorm",
    "LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization",
    "SkipLayerNormalization", "SkipSimplifiedLayerNormalization",
    # onnxnorm's quantized forms: the norm and its quantizer in one kernel
    *(f"{norm}{quantizer}" for norm in ("LayerNorm", "RMSNorm", "SkipLayerNorm", "SkipRMSNorm")
      for quantizer in QUANTIZERS)})
#: tokens generated in the profiled pass (the prefill and the first decode steps: every decode
#: step runs the same nodes, a little longer each)
PROFILED_TOKENS = 32
#: torch module classes whose exported nodes count as norm time (the dynamo exporter records
#: the module path of each node in its metadata)
NORM_CLASSES = ("RMSNorm", "LayerNorm")


@dataclasses.dataclass(frozen=True)
class Config:
    """The decoders' size and the generation. The vocabulary is small (random weights, no
    tokenizer of a real model): the LM head is a small part of each step, where a real model's
    32k-256k rows make it a large one, the same for every variant."""

    layers: int = 8
    hidden: int = 1024
    vocab: int = 2048
    prompt: int = 512
    new_tokens: int = 128
    repeats: int = 5
    threads: int = 2

    @property
    def head_dim(self) -> int:
        return 64 if self.hidden >= 512 else 16

    @property
    def heads(self) -> int:
        return self.hidden // self.head_dim

    @property
    def kv_heads(self) -> int:
        return max(1, self.heads // 4)

    @property
    def intermediate(self) -> int:
        return self.hidden * 11 // 4

    @property
    def max_length(self) -> int:
        return self.prompt + self.new_tokens

    def check(self) -> None:
        from onnxnorm._io import OnnxNormError

        for name in ("layers", "prompt", "new_tokens", "repeats", "threads"):
            if getattr(self, name) < 1:
                raise OnnxNormError(f"--{name.replace('_', '-')} must be at least 1")
        if self.hidden < 32 or self.hidden % 16:
            raise OnnxNormError("--hidden must be a multiple of 16, at least 32")
        if self.vocab < 8:
            raise OnnxNormError("--vocab must be at least 8")
        widths = {self.hidden, self.intermediate, self.kv_heads * self.head_dim}
        if self.vocab in widths:
            # onnxruntime-genai's model builder takes the first Linear of vocabulary width for
            # the LM head
            raise OnnxNormError(f"--vocab must differ from the widths of the decoder's linear layers "
                                f"({', '.join(map(str, sorted(widths)))})")

    def prompt_ids(self) -> list[int]:
        """The prompt: fixed pseudo-random token ids (no end-of-text id among them)."""
        rng = np.random.default_rng(1)
        return [int(t) for t in rng.integers(3, self.vocab, self.prompt)]


# --------------------------------------------------------------------------------------------
# models


def hf_config(family: str, config: Config):
    import transformers

    common = dict(vocab_size=config.vocab, hidden_size=config.hidden,
                  num_hidden_layers=config.layers, num_attention_heads=config.heads,
                  num_key_value_heads=config.kv_heads, intermediate_size=config.intermediate,
                  head_dim=config.head_dim, max_position_embeddings=max(2048, 2 * config.max_length),
                  bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    if family == "llama":
        return transformers.LlamaConfig(**common)
    # Gemma 2's local layers see a window larger than any sequence here, so every layer's cache
    # holds the whole sequence (the sandwich norms, soft-capping and the rest are Gemma 2's)
    return transformers.Gemma2Config(**common, sliding_window=max(2048, 2 * config.max_length),
                                     query_pre_attn_scalar=config.head_dim)


def hf_model(family: str, config: Config, dtype: str = "float32"):
    """``LlamaForCausalLM`` / ``Gemma2ForCausalLM`` with seeded random weights; the norm weights
    random too (their initial ones, 1 or Gemma's 0, would hide a wrong scale)."""
    import torch
    import transformers

    hf = hf_config(family, config)
    hf._attn_implementation = "eager"
    cls = {"llama": transformers.LlamaForCausalLM, "gemma2": transformers.Gemma2ForCausalLM}[family]
    torch.manual_seed(0)
    model = cls(hf).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__.endswith("RMSNorm"):
                low = -0.4 if family == "gemma2" else 0.6  # Gemma scales by 1 + w
                module.weight.copy_(torch.rand(module.weight.shape, generator=generator) * 0.8 + low)
    return model.to(getattr(torch, dtype))


def past_names(layers: int) -> list[str]:
    return [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]


def present_names(layers: int) -> list[str]:
    return [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]


def _with_cache(model):
    """The model as a function of (input_ids, attention_mask, *past) returning (logits,
    *present), the form a KV-cache export has."""
    import torch
    from transformers import DynamicCache

    hf = model.config

    class WithCache(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, *past):
            cache = DynamicCache(config=hf)
            for i in range(hf.num_hidden_layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                             past_key_values=cache, use_cache=True)
            present = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
            return (out.logits, *present)

    return WithCache().eval()


def _export_args(model, config: Config):
    import torch

    dtype = next(model.parameters()).dtype
    past, seq = 3, 4
    ids = torch.randint(3, config.vocab, (1, seq), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(1, past + seq, dtype=torch.int64)
    cache = [torch.randn(1, config.kv_heads, past, config.head_dim, dtype=dtype)
             for _ in range(2 * config.layers)]
    dim = torch.export.Dim
    limit = max(4096, 2 * config.max_length)
    p, s, t = (dim("past_sequence_length", max=limit), dim("sequence_length", max=limit),
               dim("total_sequence_length", max=2 * limit))
    shapes = ({1: s}, {1: t}, tuple({2: p} for _ in cache))
    names = ["input_ids", "attention_mask"] + past_names(config.layers)
    return (ids, mask, *cache), shapes, names, ["logits"] + present_names(config.layers)


def export(model, config: Config):
    """The KV-cache decoder as ``torch.onnx.export(dynamo=True)`` writes it."""
    import torch

    from onnxnorm.nn.exporter import quiet_export

    args, shapes, inputs, outputs = _export_args(model, config)
    with quiet_export(), torch.no_grad():
        program = torch.onnx.export(_with_cache(model), args, input_names=inputs,
                                    output_names=outputs, dynamo=True, opset_version=18,
                                    optimize=True, dynamic_shapes=shapes)
    return program.model_proto


def export_onnxnorm(model, config: Config):
    """The same through ``onnxnorm.export(mode="fused", convert=True)``."""
    import torch

    import onnxnorm

    args, shapes, inputs, outputs = _export_args(model, config)
    with torch.no_grad():
        return onnxnorm.export(_with_cache(model), args, mode="fused", convert=True,
                               dynamic_shapes=shapes, input_names=inputs, output_names=outputs)


def _quietly(fn: Callable[[], Any]) -> Any:
    import contextlib
    import io
    import logging
    import warnings

    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return fn()
    finally:
        logging.disable(logging.NOTSET)


def make_variants(model, config: Config, folder: Path, names: list[str],
                  log: Callable[[str], None] = print) -> dict[str, dict[str, Any]]:
    """Writes every variant's model into ``folder``: name -> {"path", "library", "prepare_s",
    node counts} or {"error"} where the tool fails. What a variant's ``<name>.json`` in
    ``folder`` records (an earlier run's, see ``--keep``) is used as it is."""
    import onnx

    from onnxnorm.fusion import fuse

    source = folder / "export.onnx"
    exported: list = []

    def plain():
        if not exported:
            started = time.perf_counter()
            exported.append(export(model, config))
            onnx.save(exported[0], source)
            log(f"  exported in {time.perf_counter() - started:.0f} s")
        return exported[0]

    def ort_optimizer(path):
        from onnxruntime.transformers.optimizer import optimize_model

        plain()
        optimize_model(str(source), model_type="gpt2", num_heads=0, hidden_size=0,
                       opt_level=0).save_model_to_file(str(path))

    def onnxscript(path):
        import onnx_ir as ir
        from onnxscript.rewriter.ort_fusions import optimize_for_ort

        plain()
        optimized, _ = optimize_for_ort(ir.load(str(source)))
        ir.save(optimized, str(path))

    makers = {
        "export": lambda path: plain(),
        "ort-optimizer": ort_optimizer,
        "onnxscript": onnxscript,
        "onnxnorm-ort": lambda path: onnx.save(fuse(plain(), "ort")[0], path),
        "onnxnorm-fused": lambda path: onnx.save(fuse(plain(), "fused")[0], path),
        "onnxnorm-export": lambda path: onnx.save(export_onnxnorm(model, config), path),
    }
    paths = {name: source if name == "export" else folder / f"{name}.onnx" for name in names}
    return _make(folder, names, makers, paths, ("onnxnorm-fused", "onnxnorm-export"), "", log)


def _make(folder: Path, names: list[str], makers: dict[str, Callable[[Path], Any]],
          paths: dict[str, Path], library: tuple[str, ...], prefix: str,
          log: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """Makes each variant's model with its maker (unless ``folder`` holds its record,
    ``<prefix><name>.json``, from an earlier run): name -> {"path", "library", "prepare_s",
    node counts} or {"error"}."""
    import onnx

    variants: dict[str, dict[str, Any]] = {}
    for name in names:
        record = folder / f"{prefix}{name}.json"
        if record.is_file():
            variants[name] = json.loads(record.read_text())
            continue
        path = paths[name]
        started = time.perf_counter()
        try:
            _quietly(lambda: makers[name](path))
        except Exception as error:  # noqa: BLE001 - a tool's failure is a result
            variants[name] = {"error": f"{type(error).__name__}: {_first_line(error)}"}
            log(f"  {prefix}{name}: fails ({variants[name]['error']})")
        else:
            variants[name] = {"path": str(path), "library": name in library,
                              "prepare_s": time.perf_counter() - started,
                              **node_counts(onnx.load(path, load_external_data=False))}
        record.write_text(json.dumps(variants[name]))
    return variants


def calibration_feeds(config: Config, dtype: str = "float32") -> list[dict[str, np.ndarray]]:
    """Static quantization's calibration data: prefills of ``CALIBRATION_PROMPTS`` prompts of
    the benchmark's length with other pseudo-random ids than its prompt, the cache empty."""
    feeds = []
    for i in range(CALIBRATION_PROMPTS):
        ids = np.random.default_rng(100 + i).integers(3, config.vocab, (1, config.prompt))
        feed = {"input_ids": ids.astype(np.int64),
                "attention_mask": np.ones((1, config.prompt), np.int64)}
        feed.update({name: np.zeros((1, config.kv_heads, 0, config.head_dim), dtype)
                     for name in past_names(config.layers)})
        feeds.append(feed)
    return feeds


def quantize(source: Path, destination: Path, quantization: str, config: Config,
             dtype: str = "float32") -> None:
    """``source`` quantized by ONNX Runtime's tool (``QUANTIZATIONS``) into ``destination``
    (written under another name first, so a killed run leaves no half model there)."""
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, quantize_dynamic,
                                          quantize_static)

    partial = destination.with_name(f".{destination.stem}.partial.onnx")
    if quantization == "dynamic":
        quantize_dynamic(str(source), str(partial), op_types_to_quantize=["MatMul"])
    else:
        class Prompts(CalibrationDataReader):
            def __init__(self):
                self.feeds = iter(calibration_feeds(config, dtype))

            def get_next(self):
                return next(self.feeds, None)

        quantize_static(str(source), str(partial), Prompts(), quant_format=QuantFormat.QDQ,
                        op_types_to_quantize=["MatMul"])
    os.replace(partial, destination)


def make_quantized(model, config: Config, folder: Path, quantization: str, names: list[str],
                   dtype: str = "float32", log: Callable[[str], None] = print
                   ) -> dict[str, dict[str, Any]]:
    """Writes the variants of the quantized export into ``folder`` (``QUANT_VARIANTS``), as
    :func:`make_variants` does: the float export (``export.onnx``, shared by the
    quantizations), ``<quantization>.onnx``, ``<quantization>-<variant>.onnx`` and their
    records ``<quantization>-<variant>.json``."""
    import onnx

    from onnxnorm.fusion import fuse

    source, quantized = folder / "export.onnx", folder / f"{quantization}.onnx"

    def plain():
        if not source.is_file():
            started = time.perf_counter()
            partial = folder / ".export.partial.onnx"
            onnx.save(export(model, config), partial)
            os.replace(partial, source)
            log(f"  exported in {time.perf_counter() - started:.0f} s")

    def quantized_model(path=None):
        if not quantized.is_file():
            plain()
            started = time.perf_counter()
            quantize(source, quantized, quantization, config, dtype)
            log(f"  {quantization} quantization in {time.perf_counter() - started:.0f} s")

    def ort_optimizer(path):
        from onnxruntime.transformers.optimizer import optimize_model

        quantized_model()
        optimize_model(str(quantized), model_type="gpt2", num_heads=0, hidden_size=0,
                       opt_level=0).save_model_to_file(str(path))

    def fused(target):
        def make(path):
            quantized_model()
            onnx.save(fuse(onnx.load(quantized), target)[0], path)
        return make

    makers = {"quantized": quantized_model, "ort-optimizer": ort_optimizer,
              "onnxnorm-ort": fused("ort"), "onnxnorm-fused": fused("fused")}
    paths = {name: quantized if name == "quantized" else folder / f"{quantization}-{name}.onnx"
             for name in names}
    return _make(folder, names, makers, paths, ("onnxnorm-fused",), f"{quantization}-", log)


def _first_line(error: BaseException) -> str:
    for line in str(error).strip().splitlines():
        if line.strip():
            return line.strip()[:200]
    return type(error).__name__


def node_counts(model) -> dict[str, Any]:
    """Nodes of the main graph, its norm ops by type (onnxnorm's quantized forms among them)
    and ONNX's quantizers by type (those left outside a norm op)."""
    norms: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type in NORM_OPS:
            key = f"{node.domain or 'ai.onnx'}.{node.op_type}"
            norms[key] = norms.get(key, 0) + 1
    quantizers: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type in QUANTIZERS and node.domain in ("", "ai.onnx"):
            quantizers[node.op_type] = quantizers.get(node.op_type, 0) + 1
    return {"nodes": len(model.graph.node), "norm_ops": norms, "quantizers": quantizers}


def norm_node_names(model) -> set[str]:
    """Names of the nodes that compute a norm: norm ops, the exporter's nodes recorded as
    coming from a norm module (the decomposed norms), and quantizers of a norm's output."""
    names = set()
    for node in model.graph.node:
        if node.op_type in NORM_OPS:
            names.add(node.name)
            continue
        for prop in node.metadata_props:
            if prop.key == "pkg.torch.onnx.class_hierarchy" and any(
                    part.strip(" '\"").endswith(NORM_CLASSES) for part in prop.value.strip("[]").split(",")):
                names.add(node.name)
                break
    # a quantizer that reads a norm's output (through a Cast to float32 in a half-precision
    # graph): the part of norm(+quantize) that the unfused graph runs as a node of its own
    outputs = {o: node for node in model.graph.node for o in node.output}

    def from_norm(value: str) -> bool:
        producer = outputs.get(value)
        if producer is not None and producer.op_type == "Cast":
            producer = outputs.get(producer.input[0])
        return producer is not None and bool(producer.name) and producer.name in names
    names |= {node.name for node in model.graph.node
              if node.op_type in QUANTIZERS and node.input and from_norm(node.input[0])}
    return names


# --------------------------------------------------------------------------------------------
# the generation loop (ONNX Runtime)


def _session(path: str, library: bool, threads: int, device: str, profile: str | None = None):
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
        providers = [("CUDAExecutionProvider",
                      {"enable_cuda_graph": "1" if device == "cuda-graph" else "0"}),
                     "CPUExecutionProvider"]
    return runtime.session(path, options, providers, with_library=library)


class Generator:
    """Greedy generation through one ORT session: the prompt in one run, then one token per
    run, through IO binding: the outputs stay in ORT's buffers and the present keys and
    values are bound as the next run's past as they are; only the last row of logits is read."""

    def __init__(self, path: str, library: bool, config: Config, device: str = "cpu",
                 profile: str | None = None):
        import onnxruntime as ort

        self.session = _session(path, library, config.threads, device, profile)
        self.config = config
        self.device = "cuda" if device.startswith("cuda") else "cpu"
        types = {i.name: i.type for i in self.session.get_inputs()}
        self.dtype = np.float16 if types[past_names(1)[0]] == "tensor(float16)" else np.float32
        self.empty = {name: ort.OrtValue.ortvalue_from_numpy(
            np.zeros((1, config.kv_heads, 0, config.head_dim), self.dtype), self.device)
            for name in past_names(config.layers)}
        self.outputs = [o.name for o in self.session.get_outputs()]

    def generate(self, prompt: list[int], new_tokens: int) -> tuple[list[int], float, list[float]]:
        """(tokens, prefill seconds, seconds of each further step)."""
        return _collect(self.steps(prompt, new_tokens))

    def steps(self, prompt: list[int], new_tokens: int) -> Iterator[tuple[int, float]]:
        """Generates one token per ``next()``: (the token, the seconds its step took)."""
        binding = self.session.io_binding()
        past = dict(self.empty)
        ids = np.asarray([prompt], np.int64)
        total = len(prompt)
        pasts = past_names(self.config.layers)
        for _ in range(new_tokens):
            started = time.perf_counter()
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
            yield token, time.perf_counter() - started
            ids = np.asarray([[token]], np.int64)
            total += 1


def _collect(steps: Iterator[tuple[int, float]]) -> tuple[list[int], float, list[float]]:
    """(tokens, prefill seconds, seconds of each further step) of a whole generation."""
    tokens, seconds = [], []
    for token, elapsed in steps:
        tokens.append(token)
        seconds.append(elapsed)
    return tokens, seconds[0], seconds[1:]


# --------------------------------------------------------------------------------------------
# onnxruntime-genai


def _tokenizer(vocab: int):
    """A word-level tokenizer of ``vocab`` entries ("t3" ...), which the model builder saves
    into the folder; the benchmark feeds token ids and never tokenizes text."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {"<unk>": 0, "<s>": 1, "</s>": 2}
    words.update({f"t{i}": i for i in range(3, vocab)})
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>",
                                   bos_token="<s>", eos_token="</s>", pad_token="<unk>")


def genai_folders(model, config: Config, precisions: list[str], folder: Path, device: str,
                  log: Callable[[str], None] = print) -> dict[str, dict[str, Any]]:
    """The model builder's folders of ``model`` (saved with save_pretrained) and their
    ``onnxnorm genai`` copies: "<precision> <variant>" -> {"path", ...} or {"error"}."""
    import onnx

    from onnxnorm.genai import convert

    record = folder / "genai.json"  # what an earlier run with --keep made here
    found: dict[str, dict[str, Any]] = json.loads(record.read_text()) if record.is_file() else {}
    todo = [p for p in precisions if any(f"{p} {v}" not in found for v in GENAI_VARIANTS)]
    checkpoint = folder / "hf"
    if todo:
        if getattr(model.config, "sliding_window", None):
            # onnxruntime-genai's KV cache holds the generation's length, and its CPU attention
            # wants the window within it; a window of that length still covers every sequence
            model.config.sliding_window = config.max_length
        _quietly(lambda: (model.save_pretrained(checkpoint),
                          _tokenizer(config.vocab).save_pretrained(checkpoint)))
    provider = "cuda" if device.startswith("cuda") else "cpu"
    for precision in todo:
        built = folder / f"genai-{precision}"
        shutil.rmtree(built, ignore_errors=True)
        try:
            _quietly(lambda: _build(checkpoint, built, precision, provider))
            config_path = built / "genai_config.json"
            genai_config = json.loads(config_path.read_text())
            decoder = genai_config["model"]["decoder"]
            decoder["session_options"]["intra_op_num_threads"] = config.threads
            decoder["session_options"]["inter_op_num_threads"] = 1
            if device == "cuda-graph":
                decoder["session_options"]["provider_options"] = [{"cuda": {"enable_cuda_graph": "1"}}]
            config_path.write_text(json.dumps(genai_config, indent=4))
        except Exception as error:  # noqa: BLE001 - the builder's failure is a result
            for variant in GENAI_VARIANTS:
                found[f"{precision} {variant}"] = {"error": f"model builder: {_first_line(error)}"}
            log(f"  genai {precision}: the model builder fails ({_first_line(error)})")
            record.write_text(json.dumps(found))
            continue
        fused = folder / f"genai-{precision}-onnxnorm"
        shutil.rmtree(fused, ignore_errors=True)
        try:
            _quietly(lambda: convert(built, fused))
        except Exception as error:  # noqa: BLE001
            found[f"{precision} genai+onnxnorm"] = {"error": f"onnxnorm genai: {_first_line(error)}"}
            fused = None
        for variant, path in (("genai", built), ("genai+onnxnorm", fused)):
            if path is None:
                continue
            proto = onnx.load(path / "model.onnx", load_external_data=False)
            found[f"{precision} {variant}"] = {"path": str(path), **node_counts(proto)}
        record.write_text(json.dumps(found))
    return {key: value for key, value in found.items() if key.split()[0] in precisions}


def _build(checkpoint: Path, folder: Path, precision: str, provider: str) -> None:
    from onnxruntime_genai.models import builder

    cache = folder.parent / f".{folder.name}.cache"
    options = builder.parse_extra_options(None, str(checkpoint), str(folder), precision, provider,
                                          str(cache), [])
    builder.create_model(None, str(checkpoint), str(folder), precision, provider, str(cache),
                         **options)
    shutil.rmtree(cache, ignore_errors=True)


class GenaiGenerator:
    """Greedy generation with onnxruntime-genai's own loop: ``append_tokens`` runs the prompt,
    the first ``generate_next_token`` picks the first token from its logits, each further one
    runs the model on the last token and picks the next."""

    def __init__(self, folder: str, config: Config):
        import onnxruntime_genai as og

        self.og = og
        self.model = og.Model(og.Config(folder))
        self.config = config

    def generate(self, prompt: list[int], new_tokens: int) -> tuple[list[int], float, list[float]]:
        return _collect(self.steps(prompt, new_tokens))

    def steps(self, prompt: list[int], new_tokens: int) -> Iterator[tuple[int, float]]:
        og = self.og
        params = og.GeneratorParams(self.model)
        # the KV cache always holds the whole generation's length (a shorter one would be
        # smaller than Gemma 2's window, which the CPU attention refuses); the loop stops early
        length = max(self.config.max_length, len(prompt) + new_tokens)
        params.set_search_options(max_length=length, min_length=length, do_sample=False)
        generator = og.Generator(self.model, params)
        started = time.perf_counter()
        generator.append_tokens(np.asarray([prompt], np.int32))
        generator.generate_next_token()
        yield int(generator.get_next_tokens()[0]), time.perf_counter() - started
        for _ in range(new_tokens - 1):
            if generator.is_done():
                break
            started = time.perf_counter()
            generator.generate_next_token()
            yield int(generator.get_next_tokens()[0]), time.perf_counter() - started


# --------------------------------------------------------------------------------------------
# measuring


def norm_share(events: list[dict], names: set[str]) -> dict[str, float]:
    """The share of node time in norm kernels, overall and in the decode steps (every run
    after the first), from ORT's profile events."""
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                  if e.get("cat") == "Session" and e.get("name") == "model_run")
    first_end = runs[0][1] if runs else float("inf")
    totals = {"all": [0.0, 0.0], "decode": [0.0, 0.0]}
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        node = e["name"][: -len("_kernel_time")]
        is_norm = e.get("args", {}).get("op_name") in NORM_OPS or node in names
        for key in ("all", "decode") if e["ts"] > first_end else ("all",):
            totals[key][0] += e["dur"] if is_norm else 0
            totals[key][1] += e["dur"]
    return {key: (norm / total if total else float("nan")) for key, (norm, total) in totals.items()}


def _profile_ort(variant: dict[str, Any], config: Config, prompt: list[int], device: str,
                 folder: Path) -> dict[str, float]:
    import onnx

    generator = Generator(variant["path"], variant["library"], config, device,
                          profile=str(folder / "profile"))
    generator.generate(prompt, min(config.new_tokens, PROFILED_TOKENS))
    path = generator.session.end_profiling()
    with open(path) as f:
        events = json.load(f)
    os.remove(path)
    return norm_share(events, norm_node_names(onnx.load(variant["path"], load_external_data=False)))


def _profile_genai(folder: str, config: Config, prompt: list[int], work: Path) -> dict[str, float]:
    """Norm share of a genai folder: a copy whose decoder session writes ORT's profile (genai
    takes the prefix relative to the working directory)."""
    copy = work / f"profiled-{Path(folder).name}"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(folder, copy)
    path = copy / "genai_config.json"
    genai_config = json.loads(path.read_text())
    genai_config["model"]["decoder"]["session_options"]["enable_profiling"] = "genai_profile"
    path.write_text(json.dumps(genai_config, indent=4))
    here = os.getcwd()
    os.chdir(copy)
    try:
        generator = GenaiGenerator(str(copy), config)
        generator.generate(prompt, min(config.new_tokens, PROFILED_TOKENS))
        del generator
        import gc

        gc.collect()
    finally:
        os.chdir(here)
    profiles = sorted(copy.glob("genai_profile*.json"))
    if not profiles:
        raise RuntimeError("onnxruntime-genai wrote no profile")
    with open(profiles[-1]) as f:
        events = json.load(f)
    shutil.rmtree(copy, ignore_errors=True)
    return norm_share(events, set())


def _peak_memory(kind: str, path: str, library: bool, config: Config, device: str) -> dict[str, float]:
    """Peak resident memory (VmHWM, MiB) of a fresh interpreter that loads the variant and
    generates once, and its resident memory before loading the model (the interpreter,
    numpy and onnxruntime)."""
    payload = json.dumps({"kind": kind, "path": path, "library": library, "device": device,
                          "config": dataclasses.asdict(config)})
    result = subprocess.run([sys.executable, "-c", "import sys; from onnxnorm.bench import e2e; "
                             "e2e._memory_child(sys.argv[1])", payload],
                            capture_output=True, text=True, timeout=3600)
    lines = [line for line in result.stdout.splitlines() if line.startswith("PEAK ")]
    if result.returncode != 0 or not lines:
        raise RuntimeError(_first_line(RuntimeError(result.stderr.strip().splitlines()[-1]
                                                    if result.stderr.strip() else "no result")))
    _, before, peak = lines[-1].split()
    return {"peak_rss_mib": float(peak), "baseline_rss_mib": float(before)}


def _vm(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _memory_child(payload: str) -> None:
    job = json.loads(payload)
    config = Config(**job["config"])
    import onnxruntime  # noqa: F401 - counted in the baseline

    if job["kind"] == "genai":
        import onnxruntime_genai  # noqa: F401
    before = _vm("VmRSS")
    if job["kind"] == "genai":
        generator: Any = GenaiGenerator(job["path"], config)
    else:
        generator = Generator(job["path"], job["library"], config, job["device"])
    generator.generate(config.prompt_ids(), config.new_tokens)
    print(f"PEAK {before:.1f} {_vm('VmHWM'):.1f}", flush=True)


@dataclasses.dataclass
class Row:
    """One variant of one group: its samples and what was measured beside them."""

    variant: str
    info: dict[str, Any]
    prefill: list[float] = dataclasses.field(default_factory=list)
    steps: list[list[float]] = dataclasses.field(default_factory=list)
    tokens: list[int] | None = None
    tokens_stable: bool = True
    error: str | None = None

    @property
    def totals(self) -> list[float]:
        return [p + sum(s) for p, s in zip(self.prefill, self.steps)]

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: v for k, v in self.info.items() if k != "path"}
        if self.error or not self.prefill:
            out["error"] = self.error or out.get("error")
            return out
        decode = [t for rep in self.steps for t in rep]
        totals = self.totals
        decode_s = statistics.median([sum(s) for s in self.steps]) if decode else None
        out.update({
            "prefill_ms": 1e3 * statistics.median(self.prefill),
            "prefill_ms_range": [1e3 * min(self.prefill), 1e3 * max(self.prefill)],
            "decode_ms_median": 1e3 * statistics.median(decode) if decode else None,
            "decode_ms_p90": 1e3 * float(np.percentile(decode, 90)) if decode else None,
            "generation_s": statistics.median(totals),
            "decode_s": decode_s,
            "generation_s_range": [min(totals), max(totals)],
            "tokens_per_s": len(self.tokens or []) / statistics.median(totals),
            "decode_tokens_per_s": (len(decode) / len(self.steps)) / decode_s if decode else None,
            "generation_s_samples": totals,
            "tokens": self.tokens, "tokens_stable": self.tokens_stable,
        })
        return out


#: the suffix of the control: a second session of a group's first variant (the export, the
#: quantized model, genai's folder), timed like every variant and compared with the first
CONTROL = " (again)"


def _interleave(rows: dict[str, Row], make: dict[str, Callable[[], Any]], config: Config,
                prompt: list[int], log: Callable[[str], None], lockstep: bool = True) -> None:
    """``repeats`` times: opens every variant's generator anew, in a shuffled order (seeded,
    new every repetition), generates once untimed with each (a short warm-up), then every
    variant generates; with ``lockstep``, step k (the prefill, then each token) of every
    variant runs before step k + 1 of any, in a shuffled order new every step (so that no
    variant always runs after the same one): a load that comes and goes on the machine falls
    on every variant alike. Without it, each variant generates whole in turn (in a shuffled
    order): for sessions whose threads keep spinning after a run, where the next variant's step
    would compete with them. The sessions are opened anew because the order of opening shows:
    of sessions of one model in one process, the one opened last decoded fastest (1-6 %)."""
    order = random.Random(0)
    for rep in range(config.repeats):
        generators: dict[str, Any] = {}
        for name in order.sample(list(make), len(make)):
            if rows[name].error:  # a variant that could not run is not tried again
                continue
            try:
                generators[name] = make[name]()
                generators[name].generate(prompt, min(4, config.new_tokens))
            except Exception as error:  # noqa: BLE001 - a variant that cannot run is a result
                rows[name].error = f"does not run: {type(error).__name__}: {_first_line(error)}"
                log(f"  {name}: {rows[name].error}")
                generators.pop(name, None)
        names = list(generators)
        made: dict[str, list[tuple[int, float]]] = {name: [] for name in names}
        if lockstep:
            running = {name: generators[name].steps(prompt, config.new_tokens) for name in names}
            while running:
                for name in order.sample(names, len(names)):
                    if name not in running:
                        continue
                    step = next(running[name], None)
                    if step is None:
                        del running[name]
                    else:
                        made[name].append(step)
        else:
            for name in order.sample(names, len(names)):
                made[name] = list(generators[name].steps(prompt, config.new_tokens))
        generators.clear()
        for name, steps in made.items():
            tokens = [token for token, _ in steps]
            row = rows[name]
            if row.tokens is not None and tokens != row.tokens:
                row.tokens_stable = False
            row.tokens = tokens
            row.prefill.append(steps[0][1])
            row.steps.append([seconds for _, seconds in steps[1:]])
        log(f"  repetition {rep + 1}/{config.repeats}: " + ", ".join(
            f"{n} {rows[n].totals[-1]:.2f} s" for n in made))


def paired(a: Row, b: Row) -> dict[str, float]:
    """How much faster ``a`` is than ``b`` (above 1: ``a`` is faster), from the repetitions,
    in each of which both generated: the ratios of their generation times (b / a) as
    ``median``, ``min``, ``max``; of their decode steps' total times as ``decode_median``,
    ``decode_min``, ``decode_max``; ``step_median``: the median over every step of every
    repetition of the ratio of the two step times."""
    ratios = [y / x for x, y in zip(a.totals, b.totals)]
    decode = [sum(sb) / sum(sa) for sa, sb in zip(a.steps, b.steps) if sum(sa)]
    steps = [y / x for sa, sb in zip(a.steps, b.steps) for x, y in zip(sa, sb) if x]
    out = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
    if decode:
        out.update(decode_median=statistics.median(decode), decode_min=min(decode),
                   decode_max=max(decode), step_median=statistics.median(steps))
    return out


def gains(rows: dict[str, Row], mine: tuple[str, ...]) -> dict[str, dict[str, dict[str, float]]]:
    """For each of ``mine``: its speed-up over each other variant (:func:`paired`)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name in mine:
        a = rows.get(name)
        if a is None or not a.prefill:
            continue
        out[name] = {other: paired(a, b) for other, b in rows.items()
                     if other != name and b.prefill}
    return out


def noise(control: dict[str, float] | None) -> float | None:
    """The timing's own noise in a group: how far from 1 the control's per-repetition ratios
    of decode times to its twin reach (0.012: 1.2 %)."""
    if not control or "decode_min" not in control:
        return None
    return max(abs(control["decode_max"] - 1), abs(1 - control["decode_min"]))


def verdict(summary: dict[str, dict[str, Any]], gain: dict[str, dict[str, dict[str, float]]],
            mine: tuple[str, ...], spread: float | None = None) -> dict[str, str]:
    """Per onnxnorm variant, against the fastest other (non-onnxnorm) variant by median decode
    time, from the per-repetition ratios of decode times (the prefill, one step, is reported
    apart): "met" when their median is at least 1; else "within noise" when it is short of 1
    by no more than ``spread`` (:func:`noise`), else "MISSED"; each with the median and
    min-max."""
    others = [(s["decode_s"], n) for n, s in summary.items() if n not in mine and s.get("decode_s")]
    out = {}
    for name in mine:
        if name not in gain or not others:
            continue
        who = min(others)[1]
        g = gain[name].get(who, {})
        if "decode_median" not in g:
            continue
        ratio = f"{g['decode_median']:.3f}x {who} ({g['decode_min']:.3f}-{g['decode_max']:.3f})"
        if g["decode_median"] >= 1:
            out[name] = f"met: {ratio}"
        elif spread is not None and 1 - g["decode_median"] <= spread:
            out[name] = f"within noise: {ratio}"
        else:
            out[name] = f"MISSED: {ratio}"
    return out


def run_group(rows: dict[str, Row], make: dict[str, Callable[[], Any]], profile: dict[str, Callable[[], dict]],
              memory: dict[str, Callable[[], dict]], config: Config, prompt: list[int], mine: tuple[str, ...],
              log: Callable[[str], None], lockstep: bool = True) -> dict[str, Any]:
    """Times the group's variants and a control (:data:`CONTROL`) (``lockstep``: see
    :func:`_interleave`), profiles them, measures their memory, compares their tokens with
    the first variant's."""
    first = next(iter(make), None)
    twin = f"{first}{CONTROL}"
    if first is not None:
        rows = {**rows, twin: Row(twin, {})}
        make = {**make, twin: make[first]}
    _interleave(rows, make, config, prompt, log, lockstep)
    control = rows.pop(twin, None)
    if control is not None and control.prefill and rows[first].prefill:
        control_gain = {**paired(rows[first], control),
                        "same_tokens": control.tokens == rows[first].tokens}
    else:
        control_gain = None
    for name, fn in profile.items():
        if rows[name].prefill:
            try:
                rows[name].info["norm_share"] = fn()
            except Exception as error:  # noqa: BLE001
                rows[name].info["norm_share_error"] = _first_line(error)
    for name, fn in memory.items():
        if rows[name].prefill:
            try:
                rows[name].info.update(fn())
            except Exception as error:  # noqa: BLE001
                rows[name].info["memory_error"] = _first_line(error)
    summary = {name: row.summary() for name, row in rows.items()}
    reference = next((r.tokens for r in rows.values() if r.tokens is not None), None)
    for name, row in rows.items():
        if row.tokens is not None:
            summary[name]["tokens_identical"] = row.tokens == reference and row.tokens_stable
            if row.tokens != reference:
                summary[name]["first_difference"] = next(
                    (i for i, (x, y) in enumerate(zip(row.tokens, reference)) if x != y),
                    min(len(row.tokens), len(reference)))
    gain = gains(rows, mine)
    return {"timing": "lockstep" if lockstep else "whole generations",
            "variants": summary, "gains": gain,
            "control": None if control_gain is None else {"variant": first, **control_gain},
            "targets": verdict(summary, gain, mine, noise(control_gain)),
            "tokens_identical": all(s.get("tokens_identical", True) for s in summary.values()
                                    if "tokens" in s)}


def ort_group(family: str, dtype: str, device: str, config: Config, variants: list[str],
              folder: Path, log: Callable[[str], None]) -> dict[str, Any]:
    model = hf_model(family, config, dtype)
    built = make_variants(model, config, folder, variants, log)
    result = _ort_rows(built, variants, config, device, folder, ONNXNORM_VARIANTS, log)
    return {"engine": "onnxruntime", "family": family, "dtype": dtype, "device": device, **result}


def quantized_variants(variants: list[str]) -> list[str]:
    """The variants of a quantized group: the quantized model as it is, and those of
    ``QUANT_VARIANTS`` that ``--variants`` names."""
    return ["quantized"] + [v for v in QUANT_VARIANTS if v != "quantized" and v in variants]


def quantized_group(family: str, dtype: str, device: str, config: Config, quantization: str,
                    variants: list[str], folder: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """The quantized export's variants (``QUANT_VARIANTS``); the tokens are compared with the
    quantized model's as it is, and the gains are those of onnxnorm's fused forms over it."""
    names = quantized_variants(variants)
    built = make_quantized(hf_model(family, config, dtype), config, folder, quantization, names,
                           dtype, log)
    result = _ort_rows(built, names, config, device, folder, QUANT_ONNXNORM_VARIANTS, log)
    return {"engine": "onnxruntime", "family": family, "dtype": dtype, "quantization": quantization,
            "device": device, **result}


def _ort_rows(built: dict[str, dict[str, Any]], variants: list[str], config: Config, device: str,
              folder: Path, mine: tuple[str, ...], log: Callable[[str], None]) -> dict[str, Any]:
    prompt = config.prompt_ids()
    rows = {name: Row(name, built[name], error=built[name].get("error")) for name in variants}
    ready = [n for n in variants if "path" in built[n]]
    make = {n: (lambda n=n: Generator(built[n]["path"], built[n]["library"], config, device)) for n in ready}
    profile = {n: (lambda n=n: _profile_ort(built[n], config, prompt, device, folder)) for n in ready}
    memory = {n: (lambda n=n: _peak_memory("ort", built[n]["path"], built[n]["library"], config, device))
              for n in ready}
    return run_group(rows, make, profile, memory, config, prompt, mine, log)


def genai_group(family: str, precision: str, device: str, config: Config, found: dict[str, dict],
                folder: Path, log: Callable[[str], None]) -> dict[str, Any]:
    prompt = config.prompt_ids()
    rows = {v: Row(v, dict(found[f"{precision} {v}"]), error=found[f"{precision} {v}"].get("error"))
            for v in GENAI_VARIANTS}
    ready = [v for v in GENAI_VARIANTS if "path" in rows[v].info]
    path = {v: rows[v].info["path"] for v in ready}
    make = {v: (lambda v=v: GenaiGenerator(path[v], config)) for v in ready}
    profile = {v: (lambda v=v: _profile_genai(path[v], config, prompt, folder)) for v in ready}
    memory = {v: (lambda v=v: _peak_memory("genai", path[v], True, config, device)) for v in ready}
    # genai's sessions keep their threads spinning after a run (no option stops that): its
    # variants take turns by whole generations
    result = run_group(rows, make, profile, memory, config, prompt, ("genai+onnxnorm",), log,
                       lockstep=False)
    dtype = {"fp32": "float32", "int4": "int4 (MatMulNBits), float32"}[precision]
    return {"engine": "onnxruntime-genai", "family": family, "dtype": dtype, "precision": precision,
            "device": device, **result}


# --------------------------------------------------------------------------------------------
# reporting


def environment(config: Config) -> dict[str, Any]:
    from onnxnorm.bench.kernels import environment as kernel_environment

    env = kernel_environment(config.threads)
    env.pop("warmup_seconds", None)
    env["loop"] = ("IO binding, outputs in ORT's buffers, present bound as the next past; "
                   "greedy numpy argmax on the last row of logits")
    for module in ("transformers", "onnx", "onnxscript", "onnxruntime_genai"):
        try:
            env[module] = __import__(module).__version__
        except ImportError:
            env[module] = None
    return env


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.1f}"


def _share(s: dict[str, Any]) -> str:
    share = s.get("norm_share")
    if not share:
        return "n/a"
    return f"{100 * share['all']:.1f}% ({100 * share['decode']:.1f}%)"


def _norm_ops(s: dict[str, Any]) -> str:
    ops = s.get("norm_ops") or {}
    if not ops:
        return "0"
    return ", ".join(f"{n} {k.split('.', 1)[1]}" for k, n in sorted(ops.items(), key=lambda kv: -kv[1]))


def markdown(groups: list[dict[str, Any]], config: Config) -> str:
    """One table per group (model, dtype, engine, device) and the gains of onnxnorm's
    variants with their spread."""
    lines = []
    for g in groups:
        lines += [f"#### {_title(g)}", "",
                  "| variant | nodes | norm ops | prefill ms | decode ms/token (median) | p90 | "
                  "tokens/s | generation s (min-max) | norm kernels (decode) | peak RSS MiB | "
                  "same tokens | target |",
                  "|---|---:|---|---:|---:|---:|---:|---|---|---:|---|---|"]
        for name, s in g["variants"].items():
            if "prefill_ms" not in s:
                reason = (s.get("error") or "")[:140].replace("|", "/")
                lines.append(f"| {name} | {s.get('nodes', '')} | {_norm_ops(s) if 'nodes' in s else ''} "
                             f"| n/a: {reason} | | | | | | | | |")
                continue
            same = "yes" if s.get("tokens_identical") else f"NO (from token {s.get('first_difference')})"
            lo, hi = s["generation_s_range"]
            peak = s.get("peak_rss_mib")
            lines.append(
                f"| {name} | {s['nodes']} | {_norm_ops(s)} | {_ms(s['prefill_ms'])} | "
                f"{_ms(s['decode_ms_median'])} | {_ms(s['decode_ms_p90'])} | {s['tokens_per_s']:.1f} | "
                f"{s['generation_s']:.2f} ({lo:.2f}-{hi:.2f}) | {_share(s)} | "
                f"{'n/a' if peak is None else f'{peak:,.0f}'} | {same} | {g['targets'].get(name, '')} |")
        lines.append("")
        for mine, over in g["gains"].items():
            lines.append(f"- {mine} speed-up, decode steps: {_ratios(over, 'decode_')}; "
                         f"whole generation: {_ratios(over)}")
        c = g.get("control")
        if c:
            lines.append(f"- control, {c['variant']} over a second session of itself, decode steps: "
                         f"{_ratio(c, 'decode_')}; whole generation: {_ratio(c)}"
                         + ("" if c["same_tokens"] else "; NOT the same tokens"))
        lines.append("")
    return "\n".join(lines)


def _ratio(v: dict[str, float], key: str = "") -> str:
    """``1.012x (0.990-1.030)``: a ratio's median (min-max); ``key``: ``decode_`` or ``""``."""
    if f"{key}median" not in v:
        return "n/a"
    return f"{v[key + 'median']:.3f}x ({v[key + 'min']:.3f}-{v[key + 'max']:.3f})"


def _ratios(over: dict[str, dict[str, float]], key: str = "") -> str:
    return ", ".join(f"{other} {_ratio(v, key)}" for other, v in over.items())


def plot(groups: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(groups), 2, figsize=(12, 2.2 + 1.6 * len(groups) + 0.4 * max(
        len(g["variants"]) for g in groups)), squeeze=False)
    for (left, right), g in zip(axes, groups):
        names = [n for n, s in g["variants"].items() if "prefill_ms" in s]
        y = np.arange(len(names))
        for ax, key, label in ((left, "decode_ms_median", "decode ms/token (median; bar: p90)"),
                               (right, "prefill_ms", "prefill ms (median; bar: min-max)")):
            values = [g["variants"][n][key] for n in names]
            if key == "decode_ms_median":
                err = [[0] * len(names), [g["variants"][n]["decode_ms_p90"] - v for n, v in zip(names, values)]]
            else:
                err = [[v - g["variants"][n]["prefill_ms_range"][0] for n, v in zip(names, values)],
                       [g["variants"][n]["prefill_ms_range"][1] - v for n, v in zip(names, values)]]
            colors = ["tab:green" if n.startswith(("onnxnorm", "genai+")) else "tab:gray" for n in names]
            ax.barh(y, values, xerr=err, color=colors)
            ax.set_yticks(y, names)
            ax.invert_yaxis()
            ax.set_xlabel(label)
        left.set_title(_title(g), loc="left", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _title(g: dict[str, Any]) -> str:
    quantized = f", {g['quantization']} 8-bit quantization" if g.get("quantization") else ""
    return f"{g['family']}, {g['dtype']}{quantized}, {g['engine']}, {g['device']}"


def _column(g: dict[str, Any]) -> str:
    quantized = f" {g['quantization']} 8-bit" if g.get("quantization") else ""
    return f"{g['family']} {g.get('precision', g['dtype'])}{quantized} ({g['device']})"


def overview(groups: list[dict[str, Any]]) -> str:
    """One table per engine: a row per variant, a column per group; each cell the tokens per
    second of the whole generation and the median decode step. Below, the decode speed-up of
    the fastest onnxnorm variant over the fastest other one, and the control's (the group's
    first variant over a second session of itself), median (min-max) of the repetitions."""
    lines = []
    for engine in dict.fromkeys(g["engine"] for g in groups):
        mine = [g for g in groups if g["engine"] == engine]
        names = list(dict.fromkeys(n for g in mine for n in g["variants"]))
        lines += ["| " + engine + " | " + " | ".join(_column(g) for g in mine) + " |",
                  "|---|" + "---:|" * len(mine)]
        for name in names:
            cells = []
            for g in mine:
                s = g["variants"].get(name, {})
                cells.append(f"{s['tokens_per_s']:.1f} tok/s, {s['decode_ms_median']:.1f} ms"
                             if s.get("decode_ms_median") else "n/a")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        cells = ["n/a" if (best := _best_pair(g)) is None else _ratio(best, "decode_") for g in mine]
        lines.append("| fastest onnxnorm vs fastest other, decode | " + " | ".join(cells) + " |")
        cells = [_ratio(c, "decode_") if (c := g.get("control")) else "n/a" for g in mine]
        lines += ["| control: the first variant vs itself, decode | " + " | ".join(cells) + " |", ""]
    return "\n".join(lines)


def _best_pair(g: dict[str, Any]) -> dict[str, float] | None:
    """The gain of the group's fastest onnxnorm variant over its fastest other one (by median
    decode time)."""
    timed = {n: s["decode_s"] for n, s in g["variants"].items() if s.get("decode_s")}
    mine = [n for n in timed if n in g["gains"]]
    others = [n for n in timed if n not in g["gains"]]
    if not mine or not others:
        return None
    return g["gains"][min(mine, key=timed.get)][min(others, key=timed.get)]


def _write_json(path: str | None, env: dict[str, Any], config: Config, groups: list[dict[str, Any]],
                complete: bool = False) -> None:
    """Writes the results so far (after every group, so that a long run leaves what it
    measured; ``"complete": false`` until the last group is in)."""
    if not path:
        return
    with open(path, "w") as f:
        json.dump({"complete": complete, "environment": env, "config": dataclasses.asdict(config),
                   "variants": {**VARIANTS, **GENAI_VARIANTS}, "quantizations": QUANTIZATIONS,
                   "quantized_variants": QUANT_VARIANTS, "groups": groups}, f, indent=1)
        f.write("\n")


#: the file in a --keep folder that records the configuration its models were made for
STAMP = "e2e-config.json"


def _stamp(config: Config) -> dict[str, Any]:
    made = dataclasses.asdict(config)
    made.pop("repeats")
    return made


def check_keep(keep: str, config: Config) -> None:
    """A --keep folder must be new, empty, or hold models made for the same configuration."""
    from onnxnorm._io import OnnxNormError

    folder = Path(keep)
    if not folder.exists():
        if not folder.resolve().parent.is_dir():
            raise OnnxNormError(f"--keep {keep}: folder {folder.parent} does not exist")
        return
    if not folder.is_dir():
        raise OnnxNormError(f"--keep {keep}: not a folder")
    stamp = folder / STAMP
    if stamp.is_file():
        if json.loads(stamp.read_text()) != _stamp(config):
            raise OnnxNormError(f"--keep {keep}: holds models made for another configuration "
                                f"({stamp.name}); choose another folder")
    elif any(folder.iterdir()):
        raise OnnxNormError(f"--keep {keep}: the folder is not empty and holds no {STAMP}")


def run(families: list[str], dtypes: list[str], variants: list[str], config: Config,
        devices: list[str], genai: list[str], json_path: str | None = None,
        plot_path: str | None = None, keep: str | None = None, prepare_only: bool = False,
        log: Callable[[str], None] = print, quantize: tuple[str, ...] = ("none",)
        ) -> list[dict[str, Any]]:
    """Measures every group and prints the tables. ``keep``: the folder where the models are
    written and kept (models an earlier run made there are used again); ``prepare_only``: make
    the models there, measure nothing; ``quantize``: ``none`` (the float export's variants)
    and / or quantizations of ``QUANTIZATIONS`` (a group each)."""
    import onnxruntime as ort

    from onnxnorm.bench import kernels

    os.environ.setdefault("OMP_NUM_THREADS", str(config.threads))
    env = environment(config)
    log(f"# onnxnorm bench e2e — {env['date']}, {env['cpu']}, {env['cores']} cores, "
        f"{config.threads} threads, onnxruntime {env['onnxruntime']}, torch {env['torch']}, "
        f"transformers {env['transformers']}, load average {env['load_average']}")
    usable = []
    for device in devices:
        if device.startswith("cuda") and "CUDAExecutionProvider" not in ort.get_available_providers():
            log(f"# {device}: skipped, this onnxruntime has no CUDAExecutionProvider "
                f"(install onnxruntime-gpu on a machine with a GPU)")
            continue
        usable.append(device)
    groups: list[dict[str, Any]] = []
    root = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="onnxnorm-e2e-"))
    root.mkdir(parents=True, exist_ok=True)
    (root / STAMP).write_text(json.dumps(_stamp(config)))
    try:
        for family in families:
            for device in usable:
                for dtype in dtypes:
                    if device == "cuda-graph":
                        continue  # ORT's CUDA graphs need fixed shapes; this loop's past grows
                    if "none" in quantize:
                        log(f"{family} {dtype} onnxruntime {device}:")
                        folder = root / f"{family}-{dtype}-{device}"
                        folder.mkdir(exist_ok=True)
                        if prepare_only:
                            make_variants(hf_model(family, config, dtype), config, folder, variants, log)
                        else:
                            groups.append(ort_group(family, dtype, device, config, variants, folder, log))
                            _write_json(json_path, env, config, groups)
                        if not keep:
                            shutil.rmtree(folder, ignore_errors=True)
                    # the quantizations share one folder: one float export for all of them
                    folder = root / f"{family}-{dtype}-{device}-quantized"
                    for quantization in (q for q in quantize if q != "none"):
                        log(f"{family} {dtype} {quantization} 8-bit onnxruntime {device}:")
                        folder.mkdir(exist_ok=True)
                        if prepare_only:
                            make_quantized(hf_model(family, config, dtype), config, folder, quantization,
                                           quantized_variants(variants), dtype, log)
                            continue
                        groups.append(quantized_group(family, dtype, device, config, quantization,
                                                      variants, folder, log))
                        _write_json(json_path, env, config, groups)
                    if not keep:
                        shutil.rmtree(folder, ignore_errors=True)
                if genai:
                    log(f"{family} onnxruntime-genai {device}:")
                    folder = root / f"{family}-genai-{device}"
                    folder.mkdir(exist_ok=True)
                    found = genai_folders(hf_model(family, config), config, genai, folder, device, log)
                    for precision in genai if not prepare_only else ():
                        groups.append(genai_group(family, precision, device, config, found, folder, log))
                        _write_json(json_path, env, config, groups)
                    if not keep:
                        shutil.rmtree(folder, ignore_errors=True)
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    if prepare_only:
        log(f"# the models are in {root}")
        return groups
    env["load_average_after"] = kernels._load_average()
    log(f"# load average at the end {env['load_average_after']}")
    print(markdown(groups, config))
    print(overview(groups))
    _write_json(json_path, env, config, groups, complete=True)
    if plot_path:
        plot(groups, plot_path)
    return groups


# --------------------------------------------------------------------------------------------
# the command


def add_parser(which) -> None:
    """Registers ``onnxnorm bench e2e`` (imports nothing optional)."""
    from onnxnorm.bench.cli import _csv

    e2e = which.add_parser(
        "e2e", help="generation with a KV cache: every way of fusing a decoder's norms, end to end",
        description="Exports a Llama-style and a Gemma-2-style decoder (random weights) with their "
                    "KV cache, makes every variant (the export as it is, ORT's transformers "
                    "optimizer, onnxscript's ort_fusions, onnxnorm fuse --target ort / fused, "
                    "onnxnorm.export --mode fused) and generates greedily with each in one run "
                    "in lockstep beside a control (a second session of the first variant); the "
                    "same through onnxruntime-genai before and "
                    "after onnxnorm genai; with --quantize, the same decoder quantized by ORT's "
                    "quantize_dynamic / quantize_static, as it is and after onnxnorm fuse. Prints "
                    "prefill and per-token latency, tokens/s, node counts, the share of norm "
                    "kernels, peak memory and whether the tokens agree.")
    e2e.add_argument("--models", type=_csv(FAMILIES), default=list(FAMILIES),
                     help="comma-separated decoders (default: llama,gemma2)")
    e2e.add_argument("--dtypes", type=_csv(DTYPES), default=list(DTYPES),
                     help="comma-separated dtypes of the exported decoders (default: float32,float16)")
    e2e.add_argument("--variants", type=_csv(tuple(VARIANTS)), default=list(VARIANTS),
                     help="comma-separated variants (default: all)")
    e2e.add_argument("--quantize", type=_csv(("none",) + tuple(QUANTIZATIONS)), default=["none"],
                     help="comma-separated quantizations of the exported decoder to measure, each a "
                          "group of its own: none (the float export and its --variants), dynamic "
                          "(quantize_dynamic), static (quantize_static, QDQ, calibrated on generated "
                          "prompts); the quantized model as it is, after ORT's optimizer and after "
                          "onnxnorm fuse --target ort / fused (default: none)")
    e2e.add_argument("--genai", type=_csv(GENAI_PRECISIONS + ("none",)), default=list(GENAI_PRECISIONS),
                     help="comma-separated model builder precisions for the onnxruntime-genai rows, "
                          "or none (default: fp32,int4)")
    e2e.add_argument("--devices", type=_csv(DEVICES + ("auto",)), default=["auto"],
                     help="cpu, cuda, cuda-graph (onnxruntime-gpu; CUDA graphs apply to the genai "
                          "rows) or auto: the CPU, and both CUDA rows where onnxruntime offers the "
                          "CUDA provider (default)")
    e2e.add_argument("--layers", type=int, default=Config.layers, help="decoder layers (default 8)")
    e2e.add_argument("--hidden", type=int, default=Config.hidden, help="hidden size (default 1024)")
    e2e.add_argument("--vocab", type=int, default=Config.vocab, help="vocabulary size (default 2048)")
    e2e.add_argument("--prompt", type=int, default=Config.prompt, help="prompt tokens (default 512)")
    e2e.add_argument("--new-tokens", type=int, default=Config.new_tokens,
                     help="tokens to generate (default 128)")
    e2e.add_argument("--repeats", type=int, default=Config.repeats,
                     help="repetitions of every variant's generation (default 5)")
    e2e.add_argument("--threads", type=int, default=Config.threads, help="intra-op threads (default 2)")
    e2e.add_argument("--keep", metavar="FOLDER",
                     help="write the models into this folder and keep them; a later run with the same "
                          "folder and sizes uses them again (their making is not timed)")
    e2e.add_argument("--prepare-only", action="store_true",
                     help="with --keep: make the models, measure nothing (a busy machine can make "
                          "them; the measuring run wants a quiet one)")
    e2e.add_argument("--json", metavar="PATH", help="write the results as JSON")
    e2e.add_argument("--plot", metavar="PATH", help="draw a PNG plot of the latencies")
    e2e.set_defaults(run=_run)


def _run(args) -> int:
    from onnxnorm._deps import require
    from onnxnorm._io import OnnxNormError, check_output

    config = Config(layers=args.layers, hidden=args.hidden, vocab=args.vocab, prompt=args.prompt,
                    new_tokens=args.new_tokens, repeats=args.repeats, threads=args.threads)
    config.check()
    genai = [] if "none" in args.genai else args.genai
    if "none" in args.genai and len(args.genai) > 1:
        raise OnnxNormError("--genai none cannot be combined with precisions")
    if not args.quantize:
        raise OnnxNormError("--quantize needs one or more of none, " + ", ".join(QUANTIZATIONS))
    if args.prepare_only and not args.keep:
        raise OnnxNormError("--prepare-only needs --keep FOLDER (where the models are kept)")
    if args.keep:
        check_keep(args.keep, config)
    for path in (args.json, args.plot):
        if path:
            check_output(path)
    if args.plot:
        require("matplotlib", "onnxnorm bench e2e --plot")
    require("torch", "onnxnorm bench e2e")
    require("transformers", "onnxnorm bench e2e")
    if genai:
        require("onnxruntime_genai", "onnxnorm bench e2e (the onnxruntime-genai rows; --genai none "
                                     "leaves them out)")
    devices = ["cpu", "cuda", "cuda-graph"] if "auto" in args.devices else args.devices
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("torch").setLevel(logging.ERROR)
    run(args.models, args.dtypes, args.variants, config, devices, genai, json_path=args.json,
        plot_path=args.plot, keep=args.keep, prepare_only=args.prepare_only,
        quantize=tuple(dict.fromkeys(args.quantize)))
    return 0
