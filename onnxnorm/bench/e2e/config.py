"""``onnxnorm bench e2e``'s configuration: the decoders, dtypes, variants, quantizations and
devices it measures (what a user runs to get each variant), the quantizers and modules that
count as norm time (the norm ops: ``variants.NORM_OPS``, from the catalogue), the sizes
(:class:`Config`), and the stamp of a ``--keep`` folder. Imports nothing heavy: the command's
options come from here."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from onnxnorm import targets

FAMILIES = ("llama", "gemma2", "qwen3")
#: the decoders measured unless --models names others (Qwen3: its Q/K norms and their rotary,
#: with the variant onnxnorm-fused-norotary beside onnxnorm-fused)
DEFAULT_FAMILIES = ("llama", "gemma2")
DTYPES = ("float32", "float16")
#: variant -> what a user runs to get it
VARIANTS = {
    "export": "torch.onnx.export(dynamo=True), as it is",
    "ort-optimizer": "onnxruntime.transformers.optimizer.optimize_model(model_type='gpt2', "
    "num_heads=0, hidden_size=0, opt_level=0)",
    "onnxscript": "onnxscript.rewriter.ort_fusions.optimize_for_ort",
    "onnxnorm-ort": "onnxnorm fuse --target ort",
    "onnxnorm-fused": "onnxnorm fuse --target fused (+ the onnxnorm library)",
    "onnxnorm-fused-norotary": "the same without the fusion stage rotary "
    "(onnxnorm.fusion.without_stages('rotary'): the Q/K norms RMSNorm ops, the rotary as "
    "exported)",
    "onnxnorm-export": "onnxnorm.export(model, mode='fused', convert=True) (+ the library)",
}
ONNXNORM_VARIANTS = ("onnxnorm-ort", "onnxnorm-fused", "onnxnorm-fused-norotary", "onnxnorm-export")
#: the variants measured unless --variants names others
DEFAULT_VARIANTS = tuple(v for v in VARIANTS if v != "onnxnorm-fused-norotary")
GENAI_PRECISIONS = ("fp32", "int4")
#: every model builder precision the genai rows take (fp16: for the CUDA provider, where the
#: builder wraps its norms in float32 casts)
GENAI_CHOICES = ("fp32", "fp16", "int4")
GENAI_VARIANTS = {
    "genai": "the model builder's folder, as it is",
    "genai+onnxnorm": "onnxnorm genai (+ the library, registered in genai_config.json)",
}
DEVICES = ("cpu", "cuda", "cuda-graph")
#: runner of ``onnxnorm.deploy.runners`` -> the ``--for`` runtime (``onnxnorm.targets.RUNTIMES``)
#: whose output ``--runtime`` measures on it against the original export
RUNTIME_RUNNERS = targets.RUNTIME_OF
#: quantization -> what makes it (``none``: the float export, the variants above)
QUANTIZATIONS = {
    "dynamic": "onnxruntime.quantization.quantize_dynamic(src, dst, "
    "op_types_to_quantize=['MatMul'])",
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
    "onnxnorm-fused": "onnxnorm fuse --target fused of the quantized model "
    "(+ the onnxnorm library)",
}
QUANT_ONNXNORM_VARIANTS = ("onnxnorm-ort", "onnxnorm-fused")
#: prompts (of the benchmark's prompt length, other ids) that calibrate static quantization
CALIBRATION_PROMPTS = 4
#: ONNX's quantizers: those that read a norm's output count as norm time in the profile
QUANTIZERS = ("QuantizeLinear", "DynamicQuantizeLinear")

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
            raise OnnxNormError(
                f"--vocab must differ from the widths of the decoder's linear "
                f"layers ({', '.join(map(str, sorted(widths)))})"
            )

    def prompt_ids(self) -> list[int]:
        """The prompt: fixed pseudo-random token ids (no end-of-text id among them)."""
        import numpy as np

        rng = np.random.default_rng(1)
        return [int(t) for t in rng.integers(3, self.vocab, self.prompt)]


#: the file in a --keep folder that records the configuration its models were made for
STAMP = "e2e-config.json"


def stamp(config: Config) -> dict[str, Any]:
    """What a --keep folder's models depend on: the configuration but the repetitions."""
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
    stamp_file = folder / STAMP
    if stamp_file.is_file():
        if json.loads(stamp_file.read_text()) != stamp(config):
            raise OnnxNormError(
                f"--keep {keep}: holds models made for another configuration "
                f"({stamp_file.name}); choose another folder"
            )
    elif any(folder.iterdir()):
        raise OnnxNormError(f"--keep {keep}: the folder is not empty and holds no {STAMP}")
