"""A tiny Hugging Face model on disk and onnxruntime-genai's model builder on it: a word-level
:func:`tokenizer` (its special tokens: :data:`TOKEN_IDS`), :func:`save_checkpoint` (the model
and its tokenizer, as the model builder and Optimum read a checkpoint), :func:`genai_build`
(the model builder) and :func:`qwen3_5_for_genai` (the architecture the builder takes for
Qwen3.5).

Each function imports what it uses (transformers, tokenizers, torch, onnxruntime-genai);
importing this module loads none of them.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

from onnxnorm._deps import require
from onnxnorm.testing.hf.weights import randomize_norms

#: the special tokens of :func:`tokenizer`, for a config whose model is saved with it
TOKEN_IDS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}


def qwen3_5_for_genai(hf_config, *, seed: int = 0):
    """``hf_config`` (a tiny ``config("qwen3_5")``) as the text model of a
    ``Qwen3_5ForConditionalGeneration`` with a one-block vision tower, its norm weights random:
    the architecture onnxruntime-genai's model builder takes for Qwen3.5 (it builds the text
    model; :func:`save_checkpoint` it, then :func:`genai_build`)."""
    transformers = require("transformers", "a tiny Hugging Face model")
    torch = require("torch", "a tiny Hugging Face model")
    vision = transformers.Qwen3_5VisionConfig(
        depth=1,
        hidden_size=16,
        intermediate_size=32,
        num_heads=2,
        out_hidden_size=hf_config.hidden_size,
        patch_size=4,
        num_position_embeddings=16,
    )
    composite = transformers.Qwen3_5Config(
        text_config=hf_config.to_dict(), vision_config=vision.to_dict()
    )
    composite.architectures = ["Qwen3_5ForConditionalGeneration"]
    torch.manual_seed(seed)
    built = transformers.Qwen3_5ForConditionalGeneration(composite).eval()
    return randomize_norms(built, seed + 1)


def tokenizer(vocab: int):
    """A word-level tokenizer of ``vocab`` entries: ``<unk>``, ``<s>``, ``</s>`` (ids 0, 1, 2:
    :data:`TOKEN_IDS`), then "t3" ... as a transformers fast tokenizer that ``save_pretrained``
    writes; the models are fed token ids, never text."""
    transformers = require("transformers", "a word-level tokenizer")
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {"<unk>": 0, "<s>": 1, "</s>": 2}
    words.update({f"t{i}": i for i in range(3, vocab)})
    built = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    built.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=built,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<unk>",
    )


def save_checkpoint(model, folder: str | Path) -> Path:
    """``model`` saved with ``save_pretrained`` into ``folder``, with a :func:`tokenizer` of its
    vocabulary: a checkpoint as onnxruntime-genai's model builder and Optimum read it."""
    folder = Path(folder)
    model.save_pretrained(folder)
    text = getattr(model.config, "get_text_config", lambda: model.config)()  # of a composite
    tokenizer(text.vocab_size).save_pretrained(folder)
    return folder


def genai_build(
    checkpoint: str | Path,
    folder: str | Path,
    precision: str,
    provider: str = "cpu",
    extra: Iterable[str] = (),
) -> Path:
    """onnxruntime-genai's model builder on ``checkpoint`` into ``folder`` (``precision``:
    fp32, int4, fp16, ...; ``extra``: its ``key=value`` extra options); its cache folder,
    beside ``folder``, is removed after."""
    require("onnxruntime_genai", "building an onnxruntime-genai folder")
    from onnxruntime_genai.models import builder

    folder = Path(folder)
    cache = folder.parent / f".{folder.name}.cache"
    options = builder.parse_extra_options(
        None, str(checkpoint), str(folder), precision, provider, str(cache), list(extra)
    )
    builder.create_model(
        None, str(checkpoint), str(folder), precision, provider, str(cache), **options
    )
    shutil.rmtree(cache, ignore_errors=True)
    return folder
