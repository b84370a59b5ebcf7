"""The KV-cache export of a tiny Hugging Face decoder: the model as a function of (input_ids,
attention_mask, *past) returning (logits, *present) (:func:`with_cache`), what its export takes
(:func:`cache_export_args`), and the export itself (:func:`export_with_cache`). The past and
present keys and values are named layer by layer (:func:`past_names`, :func:`present_names`).

Each function imports what it uses (torch, transformers); importing this module loads neither.
"""

from __future__ import annotations

import warnings
from typing import Any

from onnxnorm._deps import require


def past_names(layers: int) -> list[str]:
    """The KV-cache export's past key and value inputs, layer by layer."""
    return [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]


def present_names(layers: int) -> list[str]:
    """The KV-cache export's present key and value outputs, layer by layer."""
    return [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]


def with_cache(model):
    """A transformers decoder as a function of (input_ids, attention_mask, *past) returning
    (logits, or the last hidden state for a model without LM head, *present): the form of a
    KV-cache export, the past and present keys and values layer by layer."""
    torch: Any = require("torch", "a KV-cache export")  # (a module: its class is a base here)
    transformers = require("transformers", "a KV-cache export")
    hf_config = model.config

    class WithCache(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, *past):
            cache = transformers.DynamicCache(config=hf_config)
            for i in range(hf_config.num_hidden_layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                past_key_values=cache,
                use_cache=True,
            )
            present = [
                t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)
            ]
            first = out.logits if hasattr(out, "logits") else out.last_hidden_state
            return (first, *present)

    return WithCache().eval()


def cache_export_args(model, limit: int, past: int = 3, seq: int = 4, seed: int = 2):
    """What a KV-cache export of ``model`` takes: example inputs (a past of ``past`` positions
    and ``seq`` new token ids, drawn from ``seed``), dynamic shapes (past and new lengths up to
    ``limit``, the total up to twice that), input names and output names."""
    torch = require("torch", "a KV-cache export")
    hf_config = model.config
    dtype = next(model.parameters()).dtype
    heads = hf_config.num_attention_heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    layers = hf_config.num_hidden_layers
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, hf_config.vocab_size, (1, seq), generator=generator)
    mask = torch.ones(1, past + seq, dtype=torch.int64)
    cache = [
        torch.randn(1, kv_heads, past, head_dim, generator=generator).to(dtype)
        for _ in range(2 * layers)
    ]
    dim = torch.export.Dim
    p, s, t = (
        dim("past_sequence_length", max=limit),
        dim("sequence_length", max=limit),
        dim("total_sequence_length", max=2 * limit),
    )
    shapes = ({1: s}, {1: t}, tuple({2: p} for _ in cache))
    first = "logits" if model.get_output_embeddings() is not None else "last_hidden_state"
    return (
        (ids, mask, *cache),
        shapes,
        ["input_ids", "attention_mask"] + past_names(layers),
        [first] + present_names(layers),
    )


def export_with_cache(model, limit: int, opset: int = 18):
    """``model`` (:func:`with_cache`) exported by ``torch.onnx.export(dynamo=True)`` with its
    optimizer, its KV cache as inputs and outputs (:func:`cache_export_args`): the ModelProto."""
    torch = require("torch", "a KV-cache export")
    from onnxnorm.nn.exporter import quiet_export

    args, shapes, inputs, outputs = cache_export_args(model, limit)
    with quiet_export(), warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            with_cache(model),
            args,
            input_names=inputs,
            output_names=outputs,
            dynamo=True,
            opset_version=opset,
            optimize=True,
            dynamic_shapes=shapes,
        )
    return program.model_proto
