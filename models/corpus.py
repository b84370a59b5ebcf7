"""The fusion corpus: tiny random-weight transformers models built from configs in code
(nothing is downloaded), exported with both PyTorch exporters, with the number of norm calls
counted from the torch model itself.

Used by the corpus tests and by tools/fusion_page.py (docs/fusion.md), which also times the
tools on :func:`decoder_export`'s larger decoder.
"""

from __future__ import annotations

import dataclasses
import io
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx

VOCAB = 96
SEQ = 7


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str
    build: Callable[[], Any]  # () -> (torch module, example inputs tuple, input names)
    #: per input, its dynamic dims (index -> name); empty: every dim static
    dynamic: tuple = ()


def _hf(family: str, model_name: str = "base", **overrides) -> Callable[[], Any]:
    """A tiny ``family`` model of onnxnorm.testing.hf (hidden 32, 2 layers, random norm
    weights), ``model_name`` its class (default: the family's model without LM head)."""

    def build():
        import torch

        from onnxnorm.testing import hf

        config = hf.config(family, vocab=VOCAB, **overrides)
        config.use_cache = False
        model = hf.model(config, model_name)
        cls = type(model).__name__
        ids = torch.randint(0, VOCAB, (1, SEQ), generator=torch.Generator().manual_seed(0))
        if cls == "T5Model":
            names = ["input_ids", "decoder_input_ids"]
            return _Outputs(model, names), (ids, ids[:, :5]), names
        if cls in ("BertModel", "T5EncoderModel"):
            return _Outputs(model, ["input_ids"]), (ids,), ["input_ids"]
        # an explicit mask, as LLM exports have: without it transformers looks for packed
        # sequences with torch.diff, which the TorchScript exporter cannot export
        names = ["input_ids", "attention_mask"]
        return _Outputs(model, names), (ids, torch.ones_like(ids)), names

    return build


def _outputs_class():
    import torch

    class Outputs(torch.nn.Module):
        """Calls a transformers model with keyword inputs and returns its last hidden state."""

        def __init__(self, model, names):
            super().__init__()
            self.model, self.names = model, names

        def forward(self, *inputs):
            return self.model(**dict(zip(self.names, inputs))).last_hidden_state

    return Outputs


def _Outputs(model, names):
    return _outputs_class()(model, names)


def _block() -> Callable[[], Any]:
    """A Llama-style decoder of onnxnorm.nn.decoder (the Llama family's norms, spelled out as
    Hugging Face writes them), hidden 32, 2 layers."""

    def build():
        from onnxnorm.nn import decoder, families

        config = families.decoder_config(
            "llama", hidden=32, heads=2, intermediate=64, layers=2, impl="decomposed"
        )
        model = decoder.build(config)
        return model, (decoder.example_input(config, batch=1, seq=SEQ),), ["x"]

    return build


#: onnxnorm.nn.decoder blocks with decomposed norms, in every norm position: (norm, position,
#: DecoderConfig overrides)
BLOCKS = {
    "block_rms_pre": ("rms", "pre", {"cast_before_scale": 1, "qk_norm": True}),
    "block_rms_post": ("rms", "post", {}),
    "block_rms_sandwich": ("rms", "sandwich", {"scale_offset": 1.0}),
    "block_rms_deepnorm": ("rms", "deepnorm", {}),
    "block_rms_reordered": ("rms", "reordered", {}),
    "block_layer_pre": ("layer", "pre", {"bias": True, "embedding_norm": True}),
    "block_layer_post": ("layer", "post", {"bias": True}),
    "block_layer_sandwich": ("layer", "sandwich", {"weight": False}),
    "block_layer_deepnorm": ("layer", "deepnorm", {"bias": True}),
}


def block_config(name: str):
    from onnxnorm.nn import decoder

    norm, position, overrides = BLOCKS[name]
    return decoder.DecoderConfig(
        hidden=32,
        heads=2,
        intermediate=64,
        layers=2,
        norm=norm,
        position=position,
        impl="decomposed",
        **overrides,
    )


def _decoder_block(name: str) -> Callable[[], Any]:
    def build():
        from onnxnorm.nn import decoder

        config = block_config(name)
        model = decoder.build(config)
        return model, (decoder.example_input(config, batch=1, seq=SEQ),), ["x"]

    return build


def expected_adds(name: str) -> int | None:
    """The residual adds an onnxnorm.nn.decoder block's onnxnorm export fuses (None: not a
    block)."""
    if name not in BLOCKS:
        return None
    from onnxnorm.nn import decoder

    nodes = decoder.Decoder(block_config(name)).expected_nodes()
    return sum(n for op, n in nodes.items() if op.startswith(("Skip", "Sandwich")))


ENTRIES: dict[str, Entry] = {
    e.name: e
    for e in [
        Entry("llama", _hf("llama", kv_heads=1)),
        Entry("mistral", _hf("mistral", kv_heads=1)),
        Entry("qwen2", _hf("qwen2", kv_heads=1)),
        Entry("qwen3", _hf("qwen3", kv_heads=1)),
        Entry("gemma", _hf("gemma", kv_heads=1)),
        Entry("gemma2", _hf("gemma2", kv_heads=1)),
        Entry("gemma3", _hf("gemma3", kv_heads=1)),
        Entry("phi3", _hf("phi3", kv_heads=2)),
        Entry("gpt2", _hf("gpt2", n_embd=32, n_layer=2, n_head=2, n_positions=64)),
        Entry("gpt_neox", _hf("gpt_neox")),
        Entry("bert", _hf("bert")),
        Entry("t5", _hf("t5", d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2)),
        Entry("bloom", _hf("bloom", n_layer=2, n_head=2)),
        Entry("opt", _hf("opt", ffn_dim=64, word_embed_proj_dim=32)),
        Entry("falcon", _hf("falcon", new_decoder_architecture=False)),
        Entry("olmo", _hf("olmo", kv_heads=2)),
        Entry("cohere", _hf("cohere", kv_heads=2, use_qk_norm=True)),
        Entry("block_llama", _block()),
        *(Entry(name, _decoder_block(name)) for name in BLOCKS),
    ]
}


def _encoder(config_name: str, model_name: str, inputs: str, **overrides) -> Callable[[], Any]:
    """An encoder of transformers (text: token ids of BATCH x SEQ; vision: BATCH images of
    32 x 32 pixels in patches of 8; audio: BATCH log-mel spectrograms of 16 bins x 40 frames),
    hidden 32, 2 layers, random norm weights."""

    def build():
        import torch
        import transformers

        from onnxnorm.testing import hf

        model = hf.model(getattr(transformers, config_name)(**overrides), model_name)
        model = (model.get_encoder() if model_name == "WhisperModel" else model).eval()
        example = {
            "input_ids": lambda: torch.randint(0, VOCAB, (ENCODER_BATCH, SEQ)),
            "pixel_values": lambda: torch.randn(ENCODER_BATCH, 3, 32, 32),
            "input_features": lambda: torch.randn(ENCODER_BATCH, 16, 40),
        }[inputs]()
        return _Outputs(model, [inputs]), (example,), [inputs]

    return build


ENCODER_BATCH = 2
_TEXT = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=64,
)
_VISION = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    image_size=32,
    patch_size=8,
)
#: encoders (Post-Norm BERT; Pre-Norm ViT, CLIP, Whisper), exported with a dynamic batch and,
#: for text, a dynamic sequence: the residual adds' shapes are symbolic
ENCODERS: dict[str, Entry] = {
    e.name: e
    for e in [
        Entry(
            "bert_encoder",
            _encoder("BertConfig", "BertModel", "input_ids", **_TEXT),
            ({0: "batch", 1: "sequence"},),
        ),
        Entry("vit", _encoder("ViTConfig", "ViTModel", "pixel_values", **_VISION), ({0: "batch"},)),
        Entry(
            "clip_text",
            _encoder(
                "CLIPTextConfig",
                "CLIPTextModel",
                "input_ids",
                **_TEXT,
                pad_token_id=0,
                bos_token_id=1,
                eos_token_id=2,
            ),
            ({0: "batch", 1: "sequence"},),
        ),
        Entry(
            "clip_vision",
            _encoder("CLIPVisionConfig", "CLIPVisionModel", "pixel_values", **_VISION),
            ({0: "batch"},),
        ),
        Entry(
            "whisper_encoder",
            _encoder(
                "WhisperConfig",
                "WhisperModel",
                "input_features",
                vocab_size=VOCAB,
                d_model=32,
                encoder_layers=2,
                decoder_layers=2,
                encoder_attention_heads=2,
                decoder_attention_heads=2,
                encoder_ffn_dim=64,
                decoder_ffn_dim=64,
                num_mel_bins=16,
                max_source_positions=20,
                max_target_positions=32,
                pad_token_id=0,
                bos_token_id=1,
                eos_token_id=2,
                decoder_start_token_id=1,
            ),
            ({0: "batch"},),
        ),
    ]
}


def count_norm_calls(model, inputs) -> int:
    """How many times a norm module runs in one forward pass."""
    import torch

    calls = [0]

    def hook(*_):
        calls[0] += 1

    handles = [
        m.register_forward_hook(hook)
        for m in model.modules()
        if type(m).__name__.endswith("Norm") or isinstance(m, torch.nn.LayerNorm)
    ]
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for h in handles:
            h.remove()
    return calls[0]


def export(
    name: str, exporter: str, dtype: str = "float32", opset: int | None = None
) -> tuple[onnx.ModelProto, int]:
    """The model ``name`` exported with ``exporter`` ("dynamo" or "torchscript"), and the number
    of norm calls in its forward pass."""
    import torch

    from onnxnorm.nn.exporter import quiet_export

    entry = ENTRIES[name] if name in ENTRIES else ENCODERS[name]
    model, inputs, names = entry.build()
    if dtype != "float32":
        model = model.to(getattr(torch, dtype))
        inputs = tuple(i.to(getattr(torch, dtype)) if i.is_floating_point() else i for i in inputs)
    count = count_norm_calls(model, inputs)
    buffer = io.BytesIO()
    opset = opset or (18 if exporter == "dynamo" else 17)
    with quiet_export(), warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            program = torch.onnx.export(
                model,
                inputs,
                input_names=names,
                dynamo=True,
                opset_version=opset,
                optimize=True,
                dynamic_shapes=(entry.dynamic,) if entry.dynamic else None,
            )
            proto = program.model_proto
        else:
            torch.onnx.export(
                model,
                inputs,
                buffer,
                input_names=names,
                dynamo=False,
                opset_version=opset,
                dynamic_axes=dict(zip(names, entry.dynamic)) or None,
            )
            proto = onnx.load_from_string(buffer.getvalue())
    return proto, count


def decoder_export(
    folder: Path, layers: int = 8, hidden: int = 1024, external: bool = False
) -> Path:
    """A Llama-style decoder of :mod:`onnxnorm.nn.decoder` (the Llama family's norms, spelled
    out as Hugging Face writes them) exported with the dynamo exporter, its weights inside the
    file or (``external``) in ``<name>.onnx.data`` beside it."""
    import torch

    from onnxnorm.nn import decoder, families
    from onnxnorm.nn.exporter import quiet_export

    model = decoder.build(
        families.decoder_config(
            "llama",
            hidden=hidden,
            heads=hidden // 64,
            intermediate=hidden * 11 // 4,
            layers=layers,
            impl="decomposed",
        )
    )
    path = folder / f"decoder_{layers}x{hidden}{'_external' if external else ''}.onnx"
    with quiet_export(), torch.no_grad():
        program = torch.onnx.export(model, (torch.randn(1, 16, hidden),), dynamo=True)
    del model
    program.save(str(path), external_data=external)
    return path
