"""Optimum folders from tiny random-weight checkpoints, for models/pipelines.py.

Runs in its own interpreter on the Optimum overlay (``models.pipelines.optimum_overlay``:
optimum-onnx with the transformers it requires, on top of this environment's torch and onnx),
as ``python -m models.optimum_export ROOT FAMILY...``. For each family it saves a checkpoint
with ``save_pretrained`` to ``ROOT/FAMILY_ckpt`` and exports it with Optimum's ``main_export``,
the function ``optimum-cli export onnx --model ROOT/FAMILY_ckpt --task TASK ROOT/FAMILY``
calls, into ``ROOT/FAMILY``. It imports nothing else of this repository.
"""

from __future__ import annotations

import contextlib
import io
import sys
import warnings
from pathlib import Path

VOCAB = 200


def _configs():
    import transformers

    decoder = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return {
        "llama": (
            "text-generation-with-past",
            transformers.LlamaForCausalLM,
            lambda: transformers.LlamaConfig(**decoder),
        ),
        "gemma2": (
            "text-generation-with-past",
            transformers.Gemma2ForCausalLM,
            lambda: transformers.Gemma2Config(**decoder, head_dim=16, sliding_window=16),
        ),
        "t5": (
            "text2text-generation-with-past",
            transformers.T5ForConditionalGeneration,
            lambda: transformers.T5Config(
                vocab_size=VOCAB,
                d_model=32,
                d_kv=16,
                d_ff=64,
                num_layers=2,
                num_decoder_layers=2,
                num_heads=2,
                decoder_start_token_id=0,
                pad_token_id=0,
                eos_token_id=1,
            ),
        ),
        # 1500 source positions: Optimum's dummy audio is 3000 mel frames long
        "whisper": (
            "automatic-speech-recognition-with-past",
            transformers.WhisperForConditionalGeneration,
            lambda: transformers.WhisperConfig(
                vocab_size=VOCAB,
                d_model=32,
                encoder_layers=2,
                decoder_layers=2,
                encoder_attention_heads=2,
                decoder_attention_heads=2,
                encoder_ffn_dim=64,
                decoder_ffn_dim=64,
                num_mel_bins=80,
                max_source_positions=1500,
                max_target_positions=64,
                decoder_start_token_id=1,
                pad_token_id=0,
                bos_token_id=1,
                eos_token_id=2,
                begin_suppress_tokens=None,
                suppress_tokens=None,
            ),
        ),
    }


def tokenizer():
    """A word-level tokenizer of :data:`VOCAB` tokens (t3 ... t199 after <unk>, <s>, </s>), as
    a transformers fast tokenizer that ``save_pretrained`` writes (models/pipelines.py's genai
    checkpoints use it too)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"t{i}": i for i in range(3, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<unk>",
    )


def _randomize_norms(model) -> None:
    """Norm weights start at 1 (Gemma's 1 + w at 0): random ones make parity meaningful."""
    import torch

    with torch.no_grad():
        for module in model.modules():
            if "Norm" in type(module).__name__:
                for p in module.parameters(recurse=False):
                    p.copy_(torch.randn_like(p) * 0.5 + (0.0 if p.abs().sum() == 0 else 1.0))


def export(root: Path, family: str) -> Path:
    import torch
    from optimum.exporters.onnx import main_export

    task, cls, config = _configs()[family]
    torch.manual_seed(0)
    model = cls(config()).eval()
    _randomize_norms(model)
    checkpoint = root / f"{family}_ckpt"
    model.save_pretrained(checkpoint)
    tokenizer().save_pretrained(checkpoint)  # Optimum copies it into the folder
    main_export(model_name_or_path=str(checkpoint), output=str(root / family), task=task)
    return root / family


def main(argv: list[str]) -> int:
    root, families = Path(argv[0]), argv[1:]
    root.mkdir(parents=True, exist_ok=True)
    for family in families:
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()) as err,
        ):
            warnings.simplefilter("ignore")
            try:
                export(root, family)
            except Exception:
                print(err.getvalue()[-4000:], file=sys.__stderr__)
                raise
        print(f"exported {family} to {root / family}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
