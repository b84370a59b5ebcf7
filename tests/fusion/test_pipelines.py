"""Models as deployment pipelines make them (models/pipelines.py): onnxruntime-genai's model
builder, ONNX Runtime's quantization, float16 converters and transformers optimizer, onnxsim and
onnxslim, KV-cache decoders from the dynamo exporter. Every norm that can be fused exactly is
fused, with parity (and, for genai folders, the same generated tokens with onnxnorm's kernels
shown to run); where one cannot, the report says why; onnxnorm fuses at least as many norms and
residual adds as ORT's transformers optimizer and onnxscript's ort_fusions."""

from __future__ import annotations

import collections
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

pytest.importorskip("transformers")
pytest.importorskip("onnxruntime_genai")

from models import compare, pipelines
from onnxnorm.fusion import fuse
from onnxnorm.fusion.verify import verify
from onnxnorm.genai import convert, dim_sizes, generate, read_config

pytestmark = pytest.mark.slow

ONNXNORM_KERNELS = {
    "RMSNorm",
    "SkipRMSNorm",
    "LayerNorm",
    "SkipLayerNorm",
    "SandwichRMSNorm",
    "SandwichLayerNorm",
}
#: (norms, residual adds) per genai model: every norm (Qwen3 adds its Q/K norms, Gemma 2 its
#: post-sublayer norms; Phi-2 has one LayerNorm per parallel block) and every residual add the
#: builder already fused into a Skip op
GENAI_COUNTS = {"llama": (5, 4), "qwen3": (9, 4), "gemma2": (9, 4), "phi3": (5, 4), "phi": (3, 2)}


def _files(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def genai_root(tmp_path_factory):
    return tmp_path_factory.mktemp("genai")


def _ok(checks):
    assert checks and all(c.ok for c in checks), [str(c) for c in checks]


@pytest.mark.parametrize("precision", pipelines.GENAI_PRECISIONS)
@pytest.mark.parametrize("family", pipelines.GENAI_FAMILIES)
def test_genai_folder_generates_the_same_tokens_with_onnxnorm_kernels(
    genai_root, family, precision
):
    folder = pipelines.genai_folder(family, precision, genai_root)
    before = _files(folder)
    out = genai_root / f"{family}_{precision}_onnxnorm"
    report = convert(folder, out)
    assert _files(folder) == before, "the input folder was modified"
    assert (report.norms, report.residual_adds) == GENAI_COUNTS[family], str(report)
    model = onnx.load(out / "model.onnx", load_external_data=False)
    left = [n.op_type for n in model.graph.node if "LayerNormalization" in n.op_type]
    assert not left, left
    if family == "gemma2":  # each post-sublayer norm, its residual add and the next norm
        assert [n.op_type for n in model.graph.node].count("SandwichRMSNorm") == 4
    config = json.loads((out / "genai_config.json").read_text())
    assert (
        config["model"]["decoder"]["session_options"]["custom_ops_library"] == "libonnxnorm_ops.so"
        and (out / "libonnxnorm_ops.so").is_file()
    )
    want = generate(folder, pipelines.PROMPT, pipelines.NEW_TOKENS)
    have = generate(out, pipelines.PROMPT, pipelines.NEW_TOKENS)
    assert len(want) == pipelines.NEW_TOKENS and have == want
    kernels = pipelines.profiled_kernels(out)
    ran = {op: n for op, n in kernels.items() if op in ONNXNORM_KERNELS}
    # every fused node's kernel ran once per decoding step (one per generated token)
    nodes = [n for n in model.graph.node if n.domain == "onnxnorm"]
    assert sum(ran.values()) == len(nodes) * pipelines.NEW_TOKENS, kernels
    assert not any("LayerNormalization" in op for op in kernels), kernels
    # the decoder on its own: parity with ORT at a past length > 0
    original = onnx.load(folder / "model.onnx")
    sizes = dim_sizes(read_config(folder), original, past=16)
    _ok(verify(folder / "model.onnx", out / "model.onnx", sizes=sizes))
    # as many norms and adds in single ops as the other tools leave (the builder's contrib ops)
    # ORT's optimizer with the model type docs/pipelines.md uses (gpt2)
    for run in (
        lambda: compare.run_ort(original, folder / "model.onnx", "llama"),
        lambda: compare.run_onnxscript(original, folder / "model.onnx"),
    ):
        try:
            norms, adds = compare.count(run())
        except Exception:  # noqa: BLE001 - a tool that fails on the model fuses nothing
            continue
        assert norms <= GENAI_COUNTS[family][0] and adds <= GENAI_COUNTS[family][1]


def test_genai_target_onnx_has_no_contrib_norms(genai_root):
    """--target onnx turns the builder's contrib norm ops into standard ONNX (the opset-22
    model gets the catalogue's function bodies: RMSNormalization needs opset 23)."""
    folder = pipelines.genai_folder("llama", "fp32", genai_root)
    out = genai_root / "llama_onnx_target"
    report = convert(folder, out, target="onnx")
    model = onnx.load(out / "model.onnx", load_external_data=False)
    norms = [
        n.op_type
        for n in model.graph.node
        if "Normalization" in n.op_type or n.domain == "onnxnorm"
    ]
    assert not norms and report.library is None
    assert (
        "custom_ops_library"
        not in json.loads((out / "genai_config.json").read_text())["model"]["decoder"][
            "session_options"
        ]
    )
    sizes = dim_sizes(read_config(folder), onnx.load(folder / "model.onnx"), past=3)
    _ok(verify(folder / "model.onnx", out / "model.onnx", sizes=sizes))
    assert generate(out, pipelines.PROMPT, 8) == generate(folder, pipelines.PROMPT, 8)


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "onnxnorm", "genai", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_genai_command_and_bad_input(genai_root, tmp_path):
    folder = pipelines.genai_folder("phi3", "fp32", genai_root)
    before = _files(folder)
    out = tmp_path / "out"
    result = _cli(folder, "-o", out, "--verify", "--json", tmp_path / "r.json")
    assert result.returncode == 0, result.stderr
    assert "greedy generation of 32 tokens identical" in result.stdout
    assert json.loads((tmp_path / "r.json").read_text())["verify"]["identical"]
    assert _files(folder) == before

    result = _cli(folder, "-o", out)  # exists
    assert (
        result.returncode == 1
        and result.stderr.strip()
        == f"onnxnorm: error: {out} exists; pass --overwrite to replace it"
    )
    assert _cli(folder, "-o", out, "--overwrite").returncode == 0

    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "model.onnx").write_bytes((folder / "model.onnx").read_bytes())
    result = _cli(plain, "-o", tmp_path / "x")
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1
    assert "no genai_config.json, not an onnxruntime-genai model folder" in result.stderr
    assert not (tmp_path / "x").exists()

    result = _cli(folder, "-o", folder / "inside")
    assert result.returncode == 1 and "the input is never modified" in result.stderr
    assert _files(folder) == before


# --- the ONNX-model sources ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = pipelines.SOURCES[name][1](tmp_path_factory.mktemp("source"))
        return cache[name]

    return get


#: source -> the rules' note or skip every norm must carry ("" for none)
FUSED = {
    "dynamic MatMul quantization": "",
    "static QDQ, MatMul only": "",
    "float16, onnxconverter-common": "statistics computed in FLOAT16 in the original",
    "float16, ONNX Runtime": "statistics computed in FLOAT16 in the original",
    "float16, norms kept in float32": "",
    "ORT transformers optimizer": "",
    "onnxsim": "",
    "onnxslim": "",
}


@pytest.mark.parametrize("name", FUSED)
def test_source_fused_with_parity(built, name):
    model = built(name)
    fused, report = fuse(model)
    assert (report.norms, report.residual_adds) == (5, 4), str(report)
    assert not any(r.skips for r in report.rules), str(report)
    notes = [n.reason for r in report.rules for n in r.notes]
    if FUSED[name]:
        assert len(notes) == 5 and all(FUSED[name] in n for n in notes), str(report)
    else:
        assert not notes, str(report)
    onnx.checker.check_model(fused)
    _ok(verify(model, fused))
    if name.startswith("static"):
        # the DequantizeLinear nodes around the norms stay and still run; the QuantizeLinear
        # after each of the 4 norms that feed quantized MatMuls joins its norm
        # (tests/fusion/test_fusion_quantized.py)
        for op, joined in (("DequantizeLinear", 0), ("QuantizeLinear", 4)):
            assert (
                sum(n.op_type == op for n in fused.graph.node)
                == sum(n.op_type == op for n in model.graph.node) - joined
            )


def test_float16_strict_precision_keeps_the_norms(built):
    model = built("float16, onnxconverter-common")
    _, report = fuse(model, strict_precision=True)
    assert report.norms == 0
    assert all(
        "computed in FLOAT16; onnxnorm computes them in FLOAT (strict precision)" in s.reason
        for s in report["RMSNorm (decomposed)"].skips
    )


def test_qdq_inside_the_norm_is_reported(built):
    model = built("static QDQ, every op")
    fused, report = fuse(model)
    row = report["RMSNorm (decomposed)"]
    assert (row.found, row.fused, row.skipped) == (5, 0, 5), str(report)
    for skip in row.skips:
        assert skip.reason.startswith(
            "QuantizeLinear/DequantizeLinear pairs inside the norm "
            "(after Add, after ReduceMean, on epsilon"
        )
        assert "between ReduceMean, Add and Sqrt" in skip.reason
    _ok(verify(model, fused))


def test_ort_optimized_to_standard_onnx(built, tmp_path):
    """--target onnx turns ORT's contrib norm ops into standard ONNX that runs anywhere: the
    catalogue's function bodies below opset 23, RMSNormalization from it."""
    model = built("ORT transformers optimizer")
    assert {n.op_type for n in model.graph.node} >= {
        "SkipSimplifiedLayerNormalization",
        "SimplifiedLayerNormalization",
    }
    lowered, _ = fuse(model, "onnx")
    assert not [n for n in lowered.graph.node if n.domain in ("com.microsoft", "onnxnorm")]
    assert "SimplifiedLayerNormalization" not in {n.op_type for n in lowered.graph.node}
    _ok(verify(model, lowered))
    opset23 = pipelines.ort_optimized(
        pipelines.corpus.export("llama", "dynamo", opset=23)[0], tmp_path
    )
    lowered, _ = fuse(opset23, "onnx")
    assert [n.op_type for n in lowered.graph.node].count("RMSNormalization") == 5
    assert not [n for n in lowered.graph.node if n.domain in ("com.microsoft", "onnxnorm")]
    _ok(verify(opset23, lowered))


#: KV-cache family -> (norms, residual adds, onnxnorm ops): every norm (Qwen3's Q/K norms
#: included: with their rotary, one node of Q and K per layer) and every residual add before a
#: norm; Gemma 2's post-sublayer norm, residual add and next norm are one Sandwich op each
KV_COUNTS = {
    "llama": (5, 4, {"RMSNorm": 1, "SkipRMSNorm": 4}),
    "qwen3": (9, 4, {"RMSNorm": 1, "RMSNormRotary": 2, "SkipRMSNorm": 4}),
    "gemma2": (9, 4, {"RMSNorm": 1, "SandwichRMSNorm": 4}),
    "phi3": (5, 4, {"RMSNorm": 1, "SkipRMSNorm": 4}),
}


def _kv_source(family):
    return "KV-cache decoder (dynamo)" if family == "llama" else f"KV-cache {family} (dynamo)"


@pytest.mark.parametrize("family", list(KV_COUNTS))
def test_kv_cache_decoder(built, family):
    model = built(_kv_source(family))
    names = [i.name for i in model.graph.input]
    assert names[2:] == [f"past_key_values.{i}.{kv}" for i in range(2) for kv in ("key", "value")]
    fused, report = fuse(model)
    norms, adds, ops = KV_COUNTS[family]
    assert (report.norms, report.residual_adds) == (norms, adds), str(report)
    assert not any(r.skips for r in report.rules), str(report)
    have = collections.Counter(n.op_type for n in fused.graph.node if n.domain == "onnxnorm")
    assert have == ops
    for past in (0, 3):
        checks = verify(model, fused, sizes={"past_sequence_length": past})
        _ok(checks)
        assert len(checks) == 5  # the hidden state and every present key and value


@pytest.mark.parametrize("name", list(pipelines.SOURCES))
def test_at_least_as_many_as_other_tools(built, name, tmp_path):
    model = built(name)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    mine = compare.count(fuse(model)[0])
    for tool, run in (
        ("ort", lambda: compare.run_ort(model, path, "llama")),
        ("onnxscript", lambda: compare.run_onnxscript(model, path)),
    ):
        try:
            theirs = compare.count(run())
        except Exception:  # noqa: BLE001 - a tool that fails on the model fuses nothing
            continue
        assert mine[0] >= theirs[0] and mine[1] >= theirs[1], (tool, mine, theirs)


def test_fuse_verify_reads_the_genai_config(genai_root, tmp_path):
    """`onnxnorm fuse --verify` on a genai folder's model.onnx sizes the KV cache from
    genai_config.json (head size; a past that covers Gemma 2's sliding window)."""
    folder = pipelines.genai_folder("gemma2", "fp32", genai_root)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "onnxnorm",
            "fuse",
            folder / "model.onnx",
            "-o",
            tmp_path / "m.onnx",
            "--verify",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("verify: ") == 5 and "OVER" not in result.stdout


def test_docs_page_shows_what_the_tests_measure():
    """docs/pipelines.md (python tools/pipelines_page.py) holds the counts these tests assert."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "pipelines.md").read_text()
    for family, (norms, adds) in GENAI_COUNTS.items():
        for precision in pipelines.GENAI_PRECISIONS:
            assert f"| {family} | {precision} | {norms} | {adds} | ok (" in text, family
    assert "identical (32)" in text and "DIFFER" not in text and "MISMATCH" not in text
    expected = {_kv_source(family): counts[:2] for family, counts in KV_COUNTS.items()}
    for name in pipelines.SOURCES:
        norms, adds = expected.get(name, (0, 0) if name == "static QDQ, every op" else (5, 4))
        counts = f"{norms} | {adds}"
        assert f"| {name} | `{pipelines.SOURCES[name][0]}` | {counts} | ok (" in text, name
    assert "<!-- Optimum and Olive sections go here. -->" in text


def test_strict_precision_on_the_command_line(built, tmp_path):
    source = tmp_path / "fp16.onnx"
    onnx.save(built("float16, ONNX Runtime"), source)
    for flag, norms in (("--strict-precision", 0), (None, 5)):
        out, report = tmp_path / f"out{norms}.onnx", tmp_path / f"r{norms}.json"
        args = [sys.executable, "-m", "onnxnorm", "fuse", source, "-o", out, "--json", report]
        result = subprocess.run(
            args + ([flag] if flag else []), capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0, result.stderr
        assert json.loads(report.read_text())["norms"] == norms
        assert ("note " in result.stdout) == (flag is None)
        assert ("(strict precision)" in result.stdout) == (flag is not None)


def test_cuda_library_travels_only_with_cuda_sessions(genai_root, tmp_path):
    from onnxnorm import runtime
    from onnxnorm.errors import OnnxNormError

    folder = pipelines.genai_folder("llama", "fp32", genai_root)
    convert(folder, tmp_path / "cpu")
    assert not (tmp_path / "cpu" / "libonnxnorm_cuda_ops.so").exists()
    cuda = tmp_path / "cuda_in"
    pipelines.shutil.copytree(folder, cuda)
    config = json.loads((cuda / "genai_config.json").read_text())
    config["model"]["decoder"]["session_options"]["provider_options"] = [{"cuda": {}}]
    (cuda / "genai_config.json").write_text(json.dumps(config))
    convert(cuda, tmp_path / "cuda")
    try:
        runtime.library_path("cuda")
    except OnnxNormError:
        built = False
    else:
        built = True
    assert (tmp_path / "cuda" / "libonnxnorm_cuda_ops.so").exists() == built
