"""Models as deployment pipelines make them, for the pipeline tests and docs/pipelines.md
(written by tools/pipelines_page.py).

Every model is built from a config in code with random weights (``onnxnorm.testing.hf``);
nothing is downloaded. The sources:

- ``genai``: onnxruntime-genai's model builder (``onnxruntime_genai.models.builder``) run on a
  tiny transformers checkpoint saved with ``save_pretrained`` (with a word-level tokenizer),
  for Llama, Qwen3, Gemma 2, Phi-3 and Phi-2, in fp32, int4 and fp16 (the builder makes fp16
  for CUDA only; the folder is then pointed at the CPU provider, which runs it);
- ``quantized``: ONNX Runtime's dynamic MatMul quantization and static QDQ quantization
  (MatMul only: Q/DQ pairs around the norms; every op: pairs inside them) of the corpus Llama;
- ``float16``: onnxconverter-common's and ONNX Runtime's ``convert_float_to_float16(
  keep_io_types=True)`` of the corpus Llama, plainly and with the norms' nodes kept in float32
  (``node_block_list``: Cast islands around each norm);
- ``ort_optimized``: ONNX Runtime's transformers optimizer (contrib norm ops);
- ``simplified``: onnxsim and onnxslim;
- ``kv_cache``: a Llama decoder exported by ``torch.onnx.export(dynamo=True)`` with its past
  keys and values as inputs and outputs;
- ``optimum``: Optimum folders (``optimum-cli export onnx``) of Llama, Gemma 2, Qwen3, T5 and
  Whisper checkpoints, exported on an overlay with the older transformers optimum-onnx requires
  (``models/optimum_export.py``).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import onnx

from models import corpus

# --- onnxruntime-genai ------------------------------------------------------------------------

VOCAB = 200  # not the MLP width: the builder takes a Linear of vocabulary rows for the LM head
GENAI_FAMILIES = ("llama", "qwen3", "gemma2", "phi3", "phi")
GENAI_PRECISIONS = ("fp32", "int4", "fp16")
PROMPT = [1, 5, 9, 33, 17, 4, 77, 100]
NEW_TOKENS = 32


def genai_checkpoint(family: str, folder: Path) -> Path:
    """A tiny random-weight transformers checkpoint of ``family`` (save_pretrained), with a
    tokenizer, as the model builder reads it."""
    from onnxnorm.testing import hf

    extra = {
        # a sliding window the generation's KV cache covers (the CPU provider checks it)
        "gemma2": dict(sliding_window=16),
        "phi3": dict(original_max_position_embeddings=256),
        # Phi-2: LayerNorm, one norm per parallel block; head size 32, so that its partial
        # rotary embedding (half the head) meets GroupQueryAttention's multiple of 8
        "phi": dict(hidden=128, kv_heads=4),
    }.get(family, {})
    sizes = dict(
        vocab=VOCAB, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, max_positions=256
    )
    config = hf.config(family, **{**sizes, **extra}, **hf.TOKEN_IDS, tie_word_embeddings=False)
    model = hf.model(config)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf.save_checkpoint(model, folder)
    return folder


def genai_build(checkpoint: Path, precision: str, folder: Path) -> Path:
    """onnxruntime-genai's model builder on ``checkpoint``; fp16 is built for CUDA (the only
    provider the builder offers it for) and its config then names the CPU provider."""
    from onnxnorm.testing import hf

    provider = "cuda" if precision == "fp16" else "cpu"
    extra = ["fuse_qk_norm_gqa=false"] if precision == "fp16" else []
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        hf.genai_build(checkpoint, folder, precision, provider, extra)
    if precision == "fp16":
        path = folder / "genai_config.json"
        config = json.loads(path.read_text())
        config["model"]["decoder"]["session_options"]["provider_options"] = []
        path.write_text(json.dumps(config, indent=4))
    return folder


def genai_folder(family: str, precision: str, root: Path) -> Path:
    checkpoint = root / f"{family}_hf"
    if not (checkpoint / "config.json").exists():
        genai_checkpoint(family, checkpoint)
    return genai_build(checkpoint, precision, root / f"{family}_{precision}")


def profiled_copy(folder: Path, destination: Path) -> Path:
    """A copy of a genai folder whose decoder session writes ORT's profile (its prefix is
    taken relative to the working directory, so run it from ``destination``)."""
    shutil.copytree(folder, destination)
    path = destination / "genai_config.json"
    config = json.loads(path.read_text())
    config["model"]["decoder"]["session_options"]["enable_profiling"] = "onnxnorm_profile"
    path.write_text(json.dumps(config, indent=4))
    return destination


def profiled_kernels(folder: Path, prompt=PROMPT, new_tokens: int = NEW_TOKENS) -> dict[str, int]:
    """The op types of the kernels ORT ran while onnxruntime-genai generated from ``folder``
    (from ORT's profiler), with how often each ran."""
    import collections

    from onnxnorm.genai import generate

    with tempfile.TemporaryDirectory() as tmp:
        copy = profiled_copy(folder, Path(tmp) / "model")
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            generate(copy, prompt, new_tokens)
        finally:
            os.chdir(cwd)
        profiles = sorted(Path(tmp).glob("onnxnorm_profile*.json"))
        events = json.loads(profiles[-1].read_text())
    return dict(
        collections.Counter(
            e["args"]["op_name"]
            for e in events
            if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")
        )
    )


# --- ONNX models of the other sources -----------------------------------------------------------


def llama() -> onnx.ModelProto:
    """The corpus Llama (dynamo export), the model the other sources transform."""
    return corpus.export("llama", "dynamo")[0]


def quantized_dynamic(model: onnx.ModelProto, folder: Path) -> onnx.ModelProto:
    from onnxnorm.testing import hf

    src, out = folder / "float.onnx", folder / "dynamic.onnx"
    onnx.save(model, src)
    with contextlib.redirect_stderr(io.StringIO()):
        hf.quantize(src, out, "dynamic")
    return onnx.load(out)


def calibration_feeds(model: onnx.ModelProto, count: int = 4) -> list[dict]:
    """Static quantization's calibration data: ``count`` sets of generated inputs."""
    from onnxnorm.fusion.verify import generate_inputs

    return [generate_inputs(model, seed) for seed in range(count)]


def quantized_static(model: onnx.ModelProto, folder: Path, matmul_only: bool) -> onnx.ModelProto:
    """Static QDQ quantization calibrated on generated inputs: of the MatMuls only (Q/DQ pairs
    around the norms) or of every op the quantizer takes (pairs inside the norms)."""
    from onnxnorm.testing import hf

    src, out = folder / "float.onnx", folder / f"qdq_{'matmul' if matmul_only else 'all'}.onnx"
    onnx.save(model, src)
    with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf.quantize(src, out, "static", calibration_feeds(model), matmul_only=matmul_only)
    return onnx.load(out)


def norm_node_names(model: onnx.ModelProto) -> list[str]:
    """The nodes of each decomposed RMSNorm of a dynamo export (Pow to the Mul by the weight)."""
    consumers: dict[str, list] = {}
    producer = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
        for name in node.output:
            producer[name] = node
    names = []
    for node in model.graph.node:
        if node.op_type == "ReduceMean" and producer[node.input[0]].op_type == "Pow":
            chain = [producer[node.input[0]], node]
            for _ in range(5):  # Add eps, Sqrt, Reciprocal, Mul by x, Mul by the weight
                chain.append(consumers[chain[-1].output[0]][0])
            names += [n.name for n in chain]
    return names


def float16(
    model: onnx.ModelProto, converter: str, norms_in_float32: bool = False
) -> onnx.ModelProto:
    """``convert_float_to_float16(keep_io_types=True)`` of onnxconverter-common ("occ") or
    ONNX Runtime ("ort"); ``norms_in_float32`` keeps every norm's nodes in float32."""
    if converter == "occ":
        from onnxconverter_common.float16 import convert_float_to_float16
    else:
        from onnxruntime.transformers.float16 import convert_float_to_float16
    blocked = norm_node_names(model) if norms_in_float32 else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return convert_float_to_float16(model, keep_io_types=True, node_block_list=blocked)


def ort_optimized(model: onnx.ModelProto, folder: Path) -> onnx.ModelProto:
    """ONNX Runtime's transformers optimizer, saved and read back as its users do."""
    from onnxruntime.transformers.optimizer import optimize_model

    src, out = folder / "float.onnx", folder / "ort_optimized.onnx"
    onnx.save(model, src)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        optimize_model(
            str(src), model_type="gpt2", num_heads=0, hidden_size=0, opt_level=0
        ).save_model_to_file(str(out))
    return onnx.load(out)


def simplified(model: onnx.ModelProto, tool: str) -> onnx.ModelProto:
    if tool == "onnxsim":
        import onnxsim

        simple, ok = onnxsim.simplify(model)
        assert ok
        return simple
    import onnxslim

    return onnxslim.slim(model)


KV_LAYERS = 2
#: family -> config overrides of the KV-cache exports: Llama, Qwen3 (Q/K norms), Gemma 2
#: (sandwich norms, 1 + w scales, a sliding window the past stays inside), Phi-3 (fused QKV and
#: gate-up projections)
KV_FAMILIES = {
    "llama": {},
    "qwen3": {},
    "gemma2": {"sliding_window": 32},
    "phi3": {},
}


def kv_cache(family: str = "llama") -> onnx.ModelProto:
    """A 2-layer decoder of ``family`` with its KV cache as inputs
    (``past_key_values.N.key/value``) and outputs, exported by the dynamo exporter with dynamic
    sequence, past and total lengths."""
    from onnxnorm.testing import hf

    config = hf.config(
        family, vocab=corpus.VOCAB, layers=KV_LAYERS, kv_heads=1, **KV_FAMILIES[family]
    )
    return hf.export_with_cache(hf.model(config, "base"), limit=28)


#: source -> (what the user runs, builder(folder) -> model); the ONNX-model sources
SOURCES = {
    "dynamic MatMul quantization": (
        "quantize_dynamic(src, dst, op_types_to_quantize=['MatMul'])",
        lambda folder: quantized_dynamic(llama(), folder),
    ),
    "static QDQ, MatMul only": (
        "quantize_static(src, dst, reader, quant_format=QuantFormat.QDQ, "
        "op_types_to_quantize=['MatMul'])",
        lambda folder: quantized_static(llama(), folder, matmul_only=True),
    ),
    "static QDQ, every op": (
        "quantize_static(src, dst, reader, quant_format=QuantFormat.QDQ)",
        lambda folder: quantized_static(llama(), folder, matmul_only=False),
    ),
    "float16, onnxconverter-common": (
        "onnxconverter_common.float16.convert_float_to_float16(model, keep_io_types=True)",
        lambda folder: float16(llama(), "occ"),
    ),
    "float16, ONNX Runtime": (
        "onnxruntime.transformers.float16.convert_float_to_float16(model, keep_io_types=True)",
        lambda folder: float16(llama(), "ort"),
    ),
    "float16, norms kept in float32": (
        "convert_float_to_float16(model, keep_io_types=True, node_block_list=<the norms' nodes>)",
        lambda folder: float16(llama(), "occ", norms_in_float32=True),
    ),
    "ORT transformers optimizer": (
        "optimize_model(src, model_type='gpt2', num_heads=0, hidden_size=0, opt_level=0)",
        lambda folder: ort_optimized(llama(), folder),
    ),
    "onnxsim": ("onnxsim.simplify(model)", lambda folder: simplified(llama(), "onnxsim")),
    "onnxslim": ("onnxslim.slim(model)", lambda folder: simplified(llama(), "onnxslim")),
    "KV-cache decoder (dynamo)": (
        "torch.onnx.export(decoder_with_cache, (ids, mask, *past), dynamo=True, "
        "dynamic_shapes=...)",
        lambda folder: kv_cache(),
    ),
    **{
        f"KV-cache {family} (dynamo)": (
            f"the same with a {family} decoder",
            lambda folder, family=family: kv_cache(family),
        )
        for family in KV_FAMILIES
        if family != "llama"
    },
}


# --- Optimum ----------------------------------------------------------------------------------

#: optimum-onnx (its only release) requires transformers < 4.58, older than this environment's;
#: these go to an overlay folder put before site-packages for the export only (torch, onnx
#: and the rest come from this environment)
OPTIMUM_PACKAGES = (
    "optimum-onnx==0.1.0",
    "optimum==2.1.0",
    "transformers==4.57.6",
    "huggingface_hub==0.36.2",
    "tokenizers==0.22.2",
    "requests==2.34.2",
    "charset-normalizer==3.5.3",
    "urllib3==2.8.0",
    "certifi==2026.10.19.post1",
)
OVERLAY = Path(__file__).resolve().parent.parent / "build" / "optimum-overlay"
#: family -> (the task optimum-cli is given, the files of its folder)
OPTIMUM_FAMILIES = {
    "llama": ("text-generation-with-past", ("model.onnx",)),
    "gemma2": ("text-generation-with-past", ("model.onnx",)),
    "qwen3": ("text-generation-with-past", ("model.onnx",)),
    "t5": (
        "text2text-generation-with-past",
        (
            "decoder_model.onnx",
            "decoder_model_merged.onnx",
            "decoder_with_past_model.onnx",
            "encoder_model.onnx",
        ),
    ),
    "whisper": (
        "automatic-speech-recognition-with-past",
        (
            "decoder_model.onnx",
            "decoder_model_merged.onnx",
            "decoder_with_past_model.onnx",
            "encoder_model.onnx",
        ),
    ),
}


def optimum_overlay(path: Path = OVERLAY) -> Path:
    """The overlay folder with :data:`OPTIMUM_PACKAGES` (``pip install --target``, no
    dependencies), installed once and reused while the list is unchanged."""
    import subprocess

    stamp = path / ".packages"
    wanted = "\n".join(OPTIMUM_PACKAGES)
    if stamp.is_file() and stamp.read_text() == wanted:
        return path
    shutil.rmtree(path, ignore_errors=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-deps",
            "--target",
            str(path),
            *OPTIMUM_PACKAGES,
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    stamp.write_text(wanted)
    return path


def optimum_folders(root: Path, families=tuple(OPTIMUM_FAMILIES)) -> dict[str, Path]:
    """Optimum folders of tiny random-weight checkpoints (``models/optimum_export.py``: what
    ``optimum-cli export onnx --model CKPT --task TASK OUT`` does), one per family, exported
    in one interpreter on the overlay; folders already there are reused."""
    import subprocess

    missing = [f for f in families if not (root / f / OPTIMUM_FAMILIES[f][1][0]).is_file()]
    if missing:
        overlay = optimum_overlay()
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([str(overlay), str(Path(__file__).resolve().parent.parent)]),
        )
        subprocess.run(
            [sys.executable, "-m", "models.optimum_export", str(root), *missing],
            check=True,
            env=env,
            stdout=subprocess.DEVNULL,
        )
    return {f: root / f for f in families}
