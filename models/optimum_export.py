"""Optimum folders from tiny random-weight checkpoints, for models/pipelines.py.

Runs in its own interpreter on the Optimum overlay (``models.pipelines.optimum_overlay``:
optimum-onnx with the transformers it requires, on top of this environment's torch and onnx),
as ``python -m models.optimum_export ROOT FAMILY...``. For each family it saves a checkpoint
with ``save_pretrained`` to ``ROOT/FAMILY_ckpt`` and exports it with Optimum's ``main_export``,
the function ``optimum-cli export onnx --model ROOT/FAMILY_ckpt --task TASK ROOT/FAMILY``
calls, into ``ROOT/FAMILY``. Of this repository it imports only the fixtures
``onnxnorm.testing.hf`` (the configs, the norm weights, the tokenizer), which import nothing
of onnxnorm that needs the newer transformers.
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

    from onnxnorm.testing import hf

    decoder = dict(vocab=VOCAB, kv_heads=1, **hf.TOKEN_IDS)
    return {
        "llama": (
            "text-generation-with-past",
            "LlamaForCausalLM",
            lambda: hf.config("llama", **decoder),
        ),
        "gemma2": (
            "text-generation-with-past",
            "Gemma2ForCausalLM",
            lambda: hf.config("gemma2", **decoder, sliding_window=16),
        ),
        # (its Q/K norms and their rotary: one rotary op of Q and K per layer once fused)
        "qwen3": (
            "text-generation-with-past",
            "Qwen3ForCausalLM",
            lambda: hf.config("qwen3", **decoder),
        ),
        "t5": (
            "text2text-generation-with-past",
            "T5ForConditionalGeneration",
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
            "WhisperForConditionalGeneration",
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


def export(root: Path, family: str) -> Path:
    from optimum.exporters.onnx import main_export

    from onnxnorm.testing import hf

    task, cls, config = _configs()[family]
    # transformers' default attention, as a checkpoint loaded by optimum-cli has it
    model = hf.model(config(), cls, attention=None)
    checkpoint = hf.save_checkpoint(model, root / f"{family}_ckpt")  # Optimum copies the tokenizer
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
