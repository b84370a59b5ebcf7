"""Tiny Hugging Face models for the benchmarks, the tests and ``models/``, built from configs in
code with seeded random weights (nothing is downloaded), and what is made from them:

    config = hf.config("gemma2", hidden=64, heads=4, sliding_window=32)
    model = hf.model(config)                      # Gemma2ForCausalLM, its norm weights random
    norm = hf.norms.build(hf.norms.norm_classes()[0])  # a norm class of transformers alone
    proto = hf.export_with_cache(model, limit=28)  # past keys and values as inputs and outputs
    hf.save_checkpoint(model, folder)             # save_pretrained, with a word-level tokenizer
    hf.genai_build(folder, out, "int4")           # onnxruntime-genai's model builder
    hf.quantize(src, dst, "static", feeds)        # ONNX Runtime's QDQ quantization of the MatMuls

Norm weights start at 1 (Gemma's ``1 + weight`` at 0), which would hide a wrong scale or offset:
:func:`model` sets them with :func:`randomize_norms`, the one way they are randomized.

The names are defined in the package's modules and all importable from the package itself:
``families`` (the family table, configs and models), ``weights`` (the norm weights),
``cache`` (the KV-cache export), ``genai`` (the tokenizer, checkpoints and onnxruntime-genai's
model builder), ``quantization`` (ONNX Runtime's quantization), ``norms`` (the norm classes of
the installed transformers) and ``generic`` (tiny configs of the families ``FAMILIES`` does not
list).

Each function imports what it uses (torch, transformers, tokenizers, onnxruntime's quantization,
onnxruntime-genai); a missing one is a :class:`~onnxnorm.errors.MissingDependency` naming the
extra that provides it. Importing this package loads none of them.
"""

from __future__ import annotations

from onnxnorm.testing.hf import cache, families, genai, generic, norms, quantization, weights
from onnxnorm.testing.hf.cache import (
    cache_export_args,
    export_with_cache,
    past_names,
    present_names,
    with_cache,
)
from onnxnorm.testing.hf.families import (
    FAMILIES,
    Family,
    config,
    family_of,
    model,
    short_chunks,
)
from onnxnorm.testing.hf.genai import (
    TOKEN_IDS,
    genai_build,
    qwen3_5_for_genai,
    save_checkpoint,
    tokenizer,
)
from onnxnorm.testing.hf.quantization import quantize
from onnxnorm.testing.hf.weights import LOW, WIDTH, is_norm, randomize_norms, scale_offset

__all__ = [
    "FAMILIES",
    "Family",
    "LOW",
    "TOKEN_IDS",
    "WIDTH",
    "cache_export_args",
    "config",
    "export_with_cache",
    "family_of",
    "genai_build",
    "is_norm",
    "model",
    "cache",
    "families",
    "genai",
    "generic",
    "norms",
    "quantization",
    "weights",
    "past_names",
    "present_names",
    "quantize",
    "qwen3_5_for_genai",
    "randomize_norms",
    "save_checkpoint",
    "scale_offset",
    "short_chunks",
    "tokenizer",
    "with_cache",
]
