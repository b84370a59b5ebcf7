"""``onnxnorm bench e2e``: a tiny decoder through the whole command (every variant, the genai
rows, the table, JSON and plot), the pieces it stands on, and its one-line argument errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from onnxnorm import cli
from onnxnorm.bench import e2e

TINY = [
    "--layers",
    "2",
    "--hidden",
    "64",
    "--vocab",
    "128",
    "--prompt",
    "8",
    "--new-tokens",
    "4",
    "--repeats",
    "1",
]


@pytest.mark.slow
def test_tiny_decoder_through_the_whole_command(tmp_path, capsys):
    pytest.importorskip("transformers")
    pytest.importorskip("onnxruntime_genai")
    out_json, out_png, keep = tmp_path / "e2e.json", tmp_path / "e2e.png", tmp_path / "models"
    argv = [
        "bench",
        "e2e",
        "--models",
        "llama",
        "--dtypes",
        "float32",
        "--genai",
        "fp32",
        *TINY,
        "--keep",
        str(keep),
    ]
    status = cli.main([*argv, "--json", str(out_json), "--plot", str(out_png)])
    assert status == 0
    out = capsys.readouterr().out
    assert "#### llama, float32, onnxruntime, cpu" in out
    assert "#### llama, float32, onnxruntime-genai, cpu" in out
    assert "| variant | nodes | norm ops | prefill ms |" in out
    data = json.loads(out_json.read_text())
    assert data["complete"] is True
    assert data["config"] == {
        "layers": 2,
        "hidden": 64,
        "vocab": 128,
        "prompt": 8,
        "new_tokens": 4,
        "repeats": 1,
        "threads": 2,
    }
    assert {"date", "cpu", "onnxruntime", "torch", "transformers", "load_average"} <= set(
        data["environment"]
    )
    ort_group, genai_group = data["groups"]
    assert list(ort_group["variants"]) == list(e2e.DEFAULT_VARIANTS)
    assert list(genai_group["variants"]) == list(e2e.GENAI_VARIANTS)
    config = e2e.Config(**data["config"])
    want = _torch_greedy(e2e.hf_model("llama", config), config.prompt_ids(), 4)
    assert ort_group["variants"]["export"]["tokens"] == want
    for group in data["groups"]:
        assert group["tokens_identical"] is True
        tokens = [v["tokens"] for v in group["variants"].values()]
        assert all(t == tokens[0] and len(t) == 4 for t in tokens)
        for name, v in group["variants"].items():
            assert v["prefill_ms"] > 0 and v["decode_ms_p90"] >= v["decode_ms_median"] > 0, name
            assert len(v["generation_s_samples"]) == 1 and v["tokens_per_s"] > 0
            assert (
                0 <= v["norm_share"]["all"] <= 1 and v["peak_rss_mib"] > v["baseline_rss_mib"] > 0
            )
    v = ort_group["variants"]
    # the fused variants hold onnxnorm ops (5 norms of a 2-layer Llama: 2 per layer and the
    # final one; the residual adds go into Skip ops when fused from the graph), the others none
    assert v["onnxnorm-fused"]["norm_ops"] == {"onnxnorm.SkipRMSNorm": 4, "onnxnorm.RMSNorm": 1}
    assert v["onnxnorm-export"]["norm_ops"] == {"onnxnorm.RMSNorm": 5}
    assert v["onnxnorm-ort"]["norm_ops"] == {
        "com.microsoft.SkipSimplifiedLayerNormalization": 4,
        "ai.onnx.SimplifiedLayerNormalization": 1,
    }
    assert v["export"]["norm_ops"] == {}
    assert set(ort_group["gains"]) == set(e2e.ONNXNORM_VARIANTS) & set(e2e.DEFAULT_VARIANTS)
    assert set(ort_group["gains"]["onnxnorm-fused"]) == set(e2e.DEFAULT_VARIANTS) - {
        "onnxnorm-fused"
    }
    # every group times a second session of its first variant beside the others: the noise
    for group, first in ((ort_group, "export"), (genai_group, "genai")):
        control = group["control"]
        assert control["variant"] == first and control["same_tokens"] is True
        assert 0 < control["min"] <= control["median"] <= control["max"]
        assert 0 < control["decode_min"] <= control["decode_median"] <= control["decode_max"]
        assert f"- control, {first} over a second session of itself, decode steps: " in out
    assert "| control: the first variant vs itself, decode |" in out
    g = genai_group["variants"]
    assert g["genai+onnxnorm"]["norm_ops"] == {"onnxnorm.SkipRMSNorm": 4, "onnxnorm.RMSNorm": 1}
    assert not any(k.startswith("onnxnorm.") for k in g["genai"]["norm_ops"])
    assert set(genai_group["gains"]["genai+onnxnorm"]) == {"genai"}
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out_png.stat().st_size > 10000

    # the kept models are used again by a run of the same sizes, refused by one of others
    made = {p: p.stat().st_mtime_ns for p in keep.rglob("*.onnx")}
    assert len(made) == 6 + 2 and cli.main([*argv, "--prepare-only"]) == 0
    assert {p: p.stat().st_mtime_ns for p in keep.rglob("*.onnx")} == made
    capsys.readouterr()
    assert cli.main([*argv[:-2], "--layers", "3", "--keep", str(keep)]) == 1
    assert capsys.readouterr().err.strip() == (
        f"onnxnorm: error: --keep {keep}: holds models made for another configuration "
        "(e2e-config.json); choose another folder"
    )


#: the fused quantized decoder's ops: a 2-layer Llama has 5 norms (2 per layer and the final
#: one), each read by quantized MatMuls (q/k/v, gate/up, the LM head): each becomes the norm's
#: quantized form, the first without a residual add, the others with it
QUANTIZED_FUSED = {
    "dynamic": (
        {
            "onnxnorm.RMSNormDynamicQuantizeLinear": 1,
            "onnxnorm.SkipRMSNormDynamicQuantizeLinear": 4,
        },
        "DynamicQuantizeLinear",
    ),
    "static": (
        {"onnxnorm.RMSNormQuantizeLinear": 1, "onnxnorm.SkipRMSNormQuantizeLinear": 4},
        "QuantizeLinear",
    ),
}


@pytest.mark.slow
def test_quantized_decoder_through_the_whole_command(tmp_path, capsys):
    pytest.importorskip("transformers")
    import onnx

    out_json, out_png, keep = tmp_path / "e2e.json", tmp_path / "e2e.png", tmp_path / "models"
    argv = [
        "bench",
        "e2e",
        "--models",
        "llama",
        "--dtypes",
        "float32",
        "--genai",
        "none",
        "--quantize",
        "dynamic,static",
        *TINY,
        "--keep",
        str(keep),
    ]
    assert cli.main([*argv, "--json", str(out_json), "--plot", str(out_png)]) == 0
    out = capsys.readouterr().out
    data = json.loads(out_json.read_text())
    assert data["complete"] is True
    assert set(data["quantizations"]) == {"dynamic", "static"}
    assert list(data["quantized_variants"]) == list(e2e.QUANT_VARIANTS)
    assert [(g["quantization"], g["engine"], g["dtype"]) for g in data["groups"]] == [
        ("dynamic", "onnxruntime", "float32"),
        ("static", "onnxruntime", "float32"),
    ]
    folder = keep / "llama-float32-cpu-quantized"
    for group in data["groups"]:
        kind = group["quantization"]
        assert f"#### llama, float32, {kind} 8-bit quantization, onnxruntime, cpu" in out
        v = group["variants"]
        assert list(v) == list(e2e.QUANT_VARIANTS)
        # the quantized model holds decomposed norms and ONNX's quantizers; --target fused
        # turns the 5 norms and the quantizer after each into one op, --target ort into ORT's
        # norm ops followed by the same quantizers
        norm_ops, quantizer = QUANTIZED_FUSED[kind]
        assert v["quantized"]["norm_ops"] == {}
        assert v["onnxnorm-fused"]["norm_ops"] == norm_ops
        before = v["quantized"]["quantizers"][quantizer]
        assert v["onnxnorm-fused"]["quantizers"] == {quantizer: before - 5}
        assert v["onnxnorm-ort"]["norm_ops"] == {
            "com.microsoft.SkipSimplifiedLayerNormalization": 4,
            "ai.onnx.SimplifiedLayerNormalization": 1,
        }
        assert v["onnxnorm-ort"]["quantizers"] == {quantizer: before}
        fused = onnx.load(folder / f"{kind}-onnxnorm-fused.onnx", load_external_data=False)
        assert {n.domain for n in fused.graph.node if n.op_type in e2e.NORM_OPS} == {"onnxnorm"}
        # the profile counts each quantizer of a norm's output as norm(+quantize) time
        quantized = onnx.load(folder / f"{kind}.onnx", load_external_data=False)
        assert (
            sum(
                n.op_type == quantizer
                for n in quantized.graph.node
                if n.name in e2e.norm_node_names(quantized)
            )
            == 5
        )
        # every variant that runs generates the quantized model's tokens, or the report says
        # from which token it departs
        reference = v["quantized"]["tokens"]
        assert len(reference) == 4 and v["quantized"]["tokens_identical"] is True
        for name, s in v.items():
            if "error" in s:  # a tool that fails on the quantized model is a row that says so
                assert name == "ort-optimizer" and f"| {name} |  |  | n/a: " in out
                continue
            assert s["prefill_ms"] > 0 and s["decode_ms_p90"] >= s["decode_ms_median"] > 0, name
            assert s["tokens_per_s"] > 0 and len(s["generation_s_samples"]) == 1
            assert (
                0 <= s["norm_share"]["all"] <= 1 and s["peak_rss_mib"] > s["baseline_rss_mib"] > 0
            )
            if s["tokens"] == reference:
                assert s["tokens_identical"] is True and "first_difference" not in s
            else:
                first = next(i for i, (a, b) in enumerate(zip(s["tokens"], reference)) if a != b)
                assert s["tokens_identical"] is False and s["first_difference"] == first
                assert f"| NO (from token {first}) |" in out
        assert group["tokens_identical"] == all(s.get("tokens_identical", True) for s in v.values())
        # the gain of each fused form over the quantized model as it is, with its spread
        gain = group["gains"]["onnxnorm-fused"]["quantized"]
        assert gain["min"] <= gain["median"] <= gain["max"] and gain["median"] > 0
        assert set(group["gains"]) == set(e2e.QUANT_ONNXNORM_VARIANTS)
    assert (
        "| onnxruntime | llama float32 dynamic 8-bit (cpu) | llama float32 static 8-bit (cpu) |"
        in out
    )
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # what was built is kept: a second run makes nothing again
    made = {p: p.stat().st_mtime_ns for p in keep.rglob("*.onnx")}
    assert len(list(folder.glob("*.json"))) == 2 * len(e2e.QUANT_VARIANTS)
    assert cli.main([*argv, "--prepare-only"]) == 0
    assert {p: p.stat().st_mtime_ns for p in keep.rglob("*.onnx")} == made


def test_quantized_groups_take_the_variants_named():
    assert e2e.quantized_variants(list(e2e.VARIANTS)) == list(e2e.QUANT_VARIANTS)
    assert e2e.quantized_variants(["export", "onnxnorm-fused"]) == ["quantized", "onnxnorm-fused"]


def test_the_package_names_are_its_modules():
    """The package's names (imported on first use) are those of its modules; the names the
    benchmark had as one module are gone."""
    from onnxnorm.bench.e2e import generation, groups

    assert e2e.collect is generation.collect and e2e.interleave is groups.interleave
    for name in dir(e2e):
        assert getattr(e2e, name) is not None, name
    for old in ("_collect", "_interleave", "add_parser", "with_cache"):
        assert not hasattr(e2e, old), old


@pytest.mark.slow
def test_qwen3_with_and_without_the_rotary_op(tmp_path, capsys):
    """Qwen3's Q/K norms and rotary: onnxnorm-fused holds one rotary node per layer, the same
    fusion without the stage rotary (onnxnorm-fused-norotary) RMSNorm nodes for them; both
    generate the tokens of the export."""
    pytest.importorskip("transformers")
    out_json = tmp_path / "e2e.json"
    variants = "export,onnxnorm-fused,onnxnorm-fused-norotary"
    argv = ["bench", "e2e", "--models", "qwen3", "--dtypes", "float32", "--genai", "none"]
    argv += ["--variants", variants, "--devices", "cpu", *TINY, "--json", str(out_json)]
    assert cli.main(argv) == 0
    assert "#### qwen3, float32, onnxruntime, cpu" in capsys.readouterr().out
    (group,) = json.loads(out_json.read_text())["groups"]
    v = group["variants"]
    assert list(v) == variants.split(",")
    assert v["onnxnorm-fused"]["norm_ops"]["onnxnorm.RMSNormRotary"] == 2
    unrotated = v["onnxnorm-fused-norotary"]["norm_ops"]
    assert "onnxnorm.RMSNormRotary" not in unrotated and unrotated["onnxnorm.RMSNorm"] == 5
    assert group["tokens_identical"] is True


def _torch_greedy(model, prompt: list[int], new_tokens: int) -> list[int]:
    import torch

    model.generation_config.eos_token_id = None  # the benchmark's loop never stops early
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False)
    return out[0, len(prompt) :].tolist()


@pytest.mark.slow
def test_generation_loop_matches_torch_greedy_generation(tmp_path):
    """The loop every variant runs (prefill, then the present fed back as past) generates the
    tokens torch's own greedy generation does (Gemma 2 here, the Llama export in the test of
    the whole command)."""
    pytest.importorskip("transformers")
    import onnx

    config = e2e.Config(layers=1, hidden=32, vocab=48, prompt=6, new_tokens=5)
    prompt = config.prompt_ids()
    for family in ("gemma2",):
        model = e2e.hf_model(family, config)
        path = tmp_path / f"{family}.onnx"
        onnx.save(e2e.export(model, config), path)
        tokens, prefill, steps = e2e.Generator(str(path), False, config).generate(prompt, 5)
        assert tokens == _torch_greedy(model, prompt, 5), family
        assert prefill > 0 and len(steps) == 4


def test_norm_share_counts_norm_ops_and_named_nodes_and_splits_decode():
    events = [
        {"cat": "Session", "name": "model_run", "ts": 0, "dur": 100},
        {
            "cat": "Node",
            "name": "a_kernel_time",
            "ts": 10,
            "dur": 30,
            "args": {"op_name": "MatMul"},
        },
        {
            "cat": "Node",
            "name": "n_kernel_time",
            "ts": 50,
            "dur": 10,
            "args": {"op_name": "RMSNorm"},
        },
        {"cat": "Session", "name": "model_run", "ts": 200, "dur": 100},
        {
            "cat": "Node",
            "name": "a_kernel_time",
            "ts": 210,
            "dur": 20,
            "args": {"op_name": "MatMul"},
        },
        {
            "cat": "Node",
            "name": "pow_kernel_time",
            "ts": 240,
            "dur": 20,
            "args": {"op_name": "Pow"},
        },
        {
            "cat": "Node",
            "name": "pow_fence_before",
            "ts": 240,
            "dur": 0,
            "args": {"op_name": "Pow"},
        },
    ]
    share = e2e.norm_share(events, {"pow"})
    assert share == {"all": pytest.approx(30 / 80), "decode": pytest.approx(0.5)}


def test_gains_are_paired_ratios_of_generation_times():
    a = e2e.Row(
        "onnxnorm-fused", {}, prefill=[1.0, 1.0], steps=[[1.0, 2.0], [3.0, 1.0]], tokens=[1]
    )
    b = e2e.Row("export", {}, prefill=[1.0, 1.0], steps=[[3.0, 2.0], [3.0, 3.0]], tokens=[1])
    g = e2e.gains({"onnxnorm-fused": a, "export": b}, ("onnxnorm-fused",))
    # per repetition: 6/4 and 7/5; decode only: 5/3 and 6/4; per step: 3, 1, 1, 3
    assert g == {
        "onnxnorm-fused": {
            "export": {
                "median": pytest.approx(1.45),
                "min": pytest.approx(1.4),
                "max": pytest.approx(1.5),
                "decode_median": pytest.approx((5 / 3 + 1.5) / 2),
                "decode_min": pytest.approx(1.5),
                "decode_max": pytest.approx(5 / 3),
                "step_median": pytest.approx(2.0),
            }
        }
    }
    summary = {"onnxnorm-fused": a.summary(), "export": b.summary()}
    assert e2e.verdict(summary, g, ("onnxnorm-fused",)) == {
        "onnxnorm-fused": "met: 1.583x export (1.500-1.667)"
    }
    assert summary["export"]["decode_s"] == 5.5
    assert summary["export"]["decode_ms_median"] == 3000.0
    assert np.isclose(summary["onnxnorm-fused"]["generation_s"], 4.5)


@pytest.mark.parametrize(
    "median, spread, word",
    [
        (1.0, None, "met"),
        (0.99, 0.02, "within noise"),
        (0.99, 0.005, "MISSED"),
        (0.99, None, "MISSED"),
    ],
)
def test_verdict_weighs_a_shortfall_against_the_control(median, spread, word):
    """Short of the fastest other variant by less than the control's own spread is "within
    noise"; the verdict is against the fastest other by median time, not the slower ones."""
    summary = {
        "export": {"decode_s": 2.0},
        "ort-optimizer": {"decode_s": 1.9},
        "onnxnorm-fused": {"decode_s": 1.9},
    }
    gain = {
        "onnxnorm-fused": {
            "export": {"decode_median": 2.0, "decode_min": 2.0, "decode_max": 2.0},
            "ort-optimizer": {"decode_median": median, "decode_min": 0.9, "decode_max": 1.1},
        }
    }
    got = e2e.verdict(summary, gain, ("onnxnorm-fused",), spread)
    assert got == {"onnxnorm-fused": f"{word}: {median:.3f}x ort-optimizer (0.900-1.100)"}
    # the noise is that of the decode ratios; the whole generation's (with the prefill) aside
    control = {
        "median": 1.0,
        "min": 0.5,
        "max": 1.5,
        "decode_median": 1.0,
        "decode_min": 0.97,
        "decode_max": 1.01,
    }
    assert e2e.noise(control) == pytest.approx(0.03)


class _Scripted:
    """A generator whose steps take no time: it records the order in which it was opened and
    in which its timed steps run (its untimed warm-up through ``generate`` is not recorded)."""

    def __init__(self, name: str, log: list, tokens: list[int], opened: list):
        self.name, self.log, self.tokens, self.warming = name, log, tokens, False
        opened.append(name)

    def generate(self, prompt, new_tokens):
        self.warming = True
        try:
            return e2e.collect(self.steps(prompt, new_tokens))
        finally:
            self.warming = False

    def steps(self, prompt, new_tokens):
        for k, token in enumerate(self.tokens[:new_tokens]):
            if not self.warming:
                self.log.append((self.name, k))
            yield token, 0.001 * (k + 1)


@pytest.mark.parametrize("lockstep", [True, False])
def test_variants_take_turns_by_step_or_by_generation(lockstep):
    log: list = []
    opened: list = []
    names = ["a", "b", "c", "d"]
    rows = {n: e2e.Row(n, {}) for n in names + ["broken"]}
    make = {n: (lambda n=n: _Scripted(n, log, [5, 6, 7, 8, 9, 10], opened)) for n in names}
    make["broken"] = lambda: 1 / 0
    config = e2e.Config(new_tokens=6, repeats=3)
    e2e.interleave(rows, make, config, [1, 2], lambda line: None, lockstep=lockstep)
    # every repetition opens every variant anew, in an order that changes (the broken one is
    # tried once)
    openings = [tuple(opened[i : i + 4]) for i in range(0, 12, 4)]
    assert len(opened) == 12 and all(sorted(o) == names for o in openings)
    assert len(set(openings)) > 1
    timed = log
    assert sorted(timed) == sorted([(n, k) for n in names for k in range(6)] * 3)
    chunks = [timed[i : i + 4] for i in range(0, len(timed), 4)]
    if lockstep:
        # step k of every variant before step k + 1 of any, in orders that change
        assert all(sorted(c) == [(n, i % 6) for n in names] for i, c in enumerate(chunks))
        orders = [tuple(n for n, _ in c) for c in chunks]
        assert len(set(orders)) > 6
        # no variant always runs right after the same one
        before = {n: {c[c.index(n) - 1] for c in orders if c.index(n)} for n in names}
        assert all(len(b) > 1 for b in before.values())
    else:
        # each generation whole, the variants in an order that changes between repetitions
        runs = [timed[i : i + 6] for i in range(0, len(timed), 6)]
        assert all(r == [(r[0][0], k) for k in range(6)] for r in runs)
        orders = [tuple(r[0][0] for r in runs[i : i + 4]) for i in range(0, 12, 4)]
        assert all(sorted(o) == names for o in orders) and len(set(orders)) > 1
    for n in names:
        assert rows[n].tokens == [5, 6, 7, 8, 9, 10] and rows[n].prefill == [0.001] * 3
        assert rows[n].steps == [[0.002, 0.003, 0.004, 0.005, 0.006]] * 3
    assert (
        rows["broken"].error.startswith("does not run: ZeroDivisionError")
        and not rows["broken"].prefill
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--models", "mistral"], "argument --models: unknown mistral"),
        (["--dtypes", "bfloat16"], "argument --dtypes: unknown bfloat16"),
        (["--variants", "onnxnorm"], "argument --variants: unknown onnxnorm"),
        (["--devices", "tpu"], "argument --devices: unknown tpu"),
        (["--quantize", "int4"], "argument --quantize: unknown int4"),
        (["--quantize", ","], "--quantize needs one or more of none, dynamic, static"),
        (["--genai", "none,fp32"], "--genai none cannot be combined with precisions"),
        (["--repeats", "0"], "--repeats must be at least 1"),
        (["--new-tokens", "0"], "--new-tokens must be at least 1"),
        (["--prompt", "-3"], "--prompt must be at least 1"),
        (["--hidden", "100"], "--hidden must be a multiple of 16, at least 32"),
        (
            ["--vocab", "1024"],
            "--vocab must differ from the widths of the decoder's linear layers (256, 1024, 2816)",
        ),
        (["--json", "/nonexistent-folder/run.json"], "folder /nonexistent-folder does not exist"),
        (["--plot", "/tmp"], "cannot write /tmp: it is a directory"),
        (
            ["--keep", "/nonexistent-folder/models"],
            "--keep /nonexistent-folder/models: folder /nonexistent-folder does not exist",
        ),
        (["--prepare-only"], "--prepare-only needs --keep FOLDER (where the models are kept)"),
        (["--keep", "/etc"], "--keep /etc: the folder is not empty and holds no e2e-config.json"),
    ],
)
def test_bad_arguments_are_one_line_errors(argv, message, capsys, tmp_path):
    try:
        status = cli.main(["bench", "e2e", *argv])
    except SystemExit as exit_:  # argparse's own errors
        status = exit_.code
    assert status != 0
    err = capsys.readouterr().err
    assert message in err.strip().splitlines()[-1] and "Traceback" not in err
    if not message.startswith("argument"):  # argparse's own errors come after its usage lines
        assert len(err.strip().splitlines()) == 1


def test_genai_takes_the_builders_float16_precision():
    """--genai fp16: the model builder's float16 folders (the CUDA provider's; norms wrapped in
    float32 casts by the builder), beside the default fp32 and int4."""
    parse = cli.parser("bench").parse_args
    assert parse(["bench", "e2e", "--genai", "fp16,int4"]).genai == ["fp16", "int4"]
    assert parse(["bench", "e2e"]).genai == ["fp32", "int4"]
