"""The decoders ``onnxnorm bench e2e`` measures: a Llama-style and a Gemma-2-style model of
transformers, built from configs in code with seeded random weights (nothing is downloaded), and
their KV-cache exports (``torch.onnx.export(dynamo=True)``, and ``onnxnorm.export`` with the
norms fused). torch and transformers are imported on use."""

from __future__ import annotations

from onnxnorm.bench.e2e_config import Config


def hf_config(family: str, config: Config):
    """The transformers config of ``family`` ("llama", "gemma2") at ``config``'s sizes."""
    import transformers

    common = dict(
        vocab_size=config.vocab,
        hidden_size=config.hidden,
        num_hidden_layers=config.layers,
        num_attention_heads=config.heads,
        num_key_value_heads=config.kv_heads,
        intermediate_size=config.intermediate,
        head_dim=config.head_dim,
        max_position_embeddings=max(2048, 2 * config.max_length),
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    if family == "llama":
        return transformers.LlamaConfig(**common)
    # Gemma 2's local layers see a window larger than any sequence here, so every layer's cache
    # holds the whole sequence (the sandwich norms, soft-capping and the rest are Gemma 2's)
    return transformers.Gemma2Config(
        **common,
        sliding_window=max(2048, 2 * config.max_length),
        query_pre_attn_scalar=config.head_dim,
    )


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
                weight = torch.rand(module.weight.shape, generator=generator) * 0.8 + low
                module.weight.copy_(weight)
    return model.to(getattr(torch, dtype))


def past_names(layers: int) -> list[str]:
    """The export's past key and value inputs, layer by layer."""
    return [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]


def present_names(layers: int) -> list[str]:
    """The export's present key and value outputs, layer by layer."""
    return [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]


def with_cache(model):
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
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                past_key_values=cache,
                use_cache=True,
            )
            present = [
                t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)
            ]
            return (out.logits, *present)

    return WithCache().eval()


def _export_args(model, config: Config):
    """Example inputs (a past of 3, 4 new tokens), dynamic shapes and names of an export."""
    import torch

    dtype = next(model.parameters()).dtype
    past, seq = 3, 4
    ids = torch.randint(3, config.vocab, (1, seq), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(1, past + seq, dtype=torch.int64)
    cache = [
        torch.randn(1, config.kv_heads, past, config.head_dim, dtype=dtype)
        for _ in range(2 * config.layers)
    ]
    dim = torch.export.Dim
    limit = max(4096, 2 * config.max_length)
    p, s, t = (
        dim("past_sequence_length", max=limit),
        dim("sequence_length", max=limit),
        dim("total_sequence_length", max=2 * limit),
    )
    shapes = ({1: s}, {1: t}, tuple({2: p} for _ in cache))
    names = ["input_ids", "attention_mask"] + past_names(config.layers)
    return (ids, mask, *cache), shapes, names, ["logits"] + present_names(config.layers)


def export(model, config: Config):
    """The KV-cache decoder as ``torch.onnx.export(dynamo=True)`` writes it."""
    import torch

    from onnxnorm.nn.exporter import quiet_export

    args, shapes, inputs, outputs = _export_args(model, config)
    with quiet_export(), torch.no_grad():
        program = torch.onnx.export(
            with_cache(model),
            args,
            input_names=inputs,
            output_names=outputs,
            dynamo=True,
            opset_version=18,
            optimize=True,
            dynamic_shapes=shapes,
        )
    return program.model_proto


def export_onnxnorm(model, config: Config):
    """The same through ``onnxnorm.export(mode="fused", convert=True)``."""
    import torch

    import onnxnorm

    args, shapes, inputs, outputs = _export_args(model, config)
    with torch.no_grad():
        return onnxnorm.export(
            with_cache(model),
            args,
            mode="fused",
            convert=True,
            dynamic_shapes=shapes,
            input_names=inputs,
            output_names=outputs,
        )
