"""Writes docs/fusion.md: onnxnorm's fusion against ONNX Runtime's transformers optimizer and
onnxscript's ort_fusions on the corpus (models/corpus.py), and the speed and peak memory of the
three on a decoder of a few hundred MB.

    python tools/fusion_page.py [-o docs/fusion.md] [--models M,...] [--exporters E,...]
        [--no-timing] [--large FOLDERS [--runs N]] [--json OUT]

For every corpus model and exporter: the norm calls of the torch model, and per tool the norms
it fused (a Skip op counts one norm and one residual add, a Sandwich op two norms and one add),
the residual adds absorbed, whether it failed, and parity (max abs error of the optimized model
against the original in onnxruntime on generated inputs); each tool is run by models/compare.py.
A measured page, minutes long and dated: not part of `make generate` (tools/generate.py's
MEASURED).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # models/

from models import compare, corpus  # noqa: E402 - after the repository root is on the path


def corpus_rows(names, exporters, folder: Path, log=print) -> list[dict]:
    rows = []
    for name in names:
        for exporter in exporters:
            row = {"model": name, "exporter": exporter}
            try:
                model, calls = corpus.export(name, exporter)
            except Exception as error:  # noqa: BLE001
                row["export_error"] = str(error).strip().splitlines()[0][:80]
                rows.append(row)
                continue
            path = folder / f"{name}_{exporter}.onnx"
            onnx.save(model, path)
            row["norm_calls"] = calls
            row["exported_ops"] = compare.count(model)[0]
            for tool, run in (
                ("onnxnorm", lambda: compare.run_onnxnorm(model, path)),  # noqa: B023 - called in this iteration
                ("ort", lambda: compare.run_ort(model, path, name)),  # noqa: B023 - called in this iteration
                ("onnxscript", lambda: compare.run_onnxscript(model, path)),  # noqa: B023 - called in this iteration
            ):
                try:
                    started = time.perf_counter()
                    optimized = run()
                    row[f"{tool}_s"] = time.perf_counter() - started
                    row[f"{tool}_norms"], row[f"{tool}_adds"] = compare.count(optimized)
                    row[f"{tool}_parity"] = compare.parity(model, optimized)
                except Exception as error:  # noqa: BLE001 - a tool's failure is a result
                    row[f"{tool}_error"] = f"{type(error).__name__}: {str(error).strip()[:70]}"
            log(json.dumps(row))
            rows.append(row)
    return rows


# --- speed and memory of the pass ----------------------------------------------------------------

TIMED = {
    # the fuse command itself, its options parsed by its own parser (every option at its
    # default, as a user who names none gets it)
    "onnxnorm fuse": (
        "from onnxnorm import cli; a = cli.parser('fuse').parse_args(['fuse', SRC, '-o', DST]); "
        "rc = a.run(a)"
    ),
    "ORT transformers optimizer": (
        "from onnxruntime.transformers.optimizer import optimize_model; "
        "m = optimize_model(SRC, model_type='gpt2', num_heads=0, hidden_size=0, opt_level=0); "
        "m.save_model_to_file(DST, use_external_data_format=EXT); rc = 0"
    ),
    "onnxscript optimize_for_ort": (
        "import os, onnx_ir as ir; from onnxscript.rewriter.ort_fusions import optimize_for_ort; "
        "m = ir.load(SRC); m, _ = optimize_for_ort(m); "
        "ir.save(m, DST, external_data=os.path.basename(DST) + '.data' if EXT else None); rc = 0"
    ),
}


#: the peak resident set of this process (VmHWM): unlike ru_maxrss, not inherited from the
#: parent that forked it
_PEAK = (
    "def _peak():\n"
    "    for line in open('/proc/self/status'):\n"
    "        if line.startswith('VmHWM:'):\n"
    "            return int(line.split()[1]) / 1024\n"
)


def timed(code: str, src: Path, dst: Path, external: bool = False) -> tuple[float, float]:
    """(seconds, peak RSS MiB) of ``code`` in a fresh interpreter, imports excluded from the
    time (they are the same for every run of a tool and small against the pass); ``external``:
    the output is written with external data."""
    script = (
        _PEAK + "import sys, time, logging, warnings; warnings.simplefilter('ignore'); "
        "logging.disable(logging.WARNING); "
        "import onnx, onnx_ir, onnxscript, onnxruntime, numpy; "
        f"SRC, DST, EXT = {str(src)!r}, {str(dst)!r}, {external!r}; "
        "t = time.perf_counter(); "
        f"{code}; t = time.perf_counter() - t; "
        "print('RESULT', t, _peak()); "
        "sys.exit(rc)"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=3600
    )
    if result.returncode == -9:
        raise RuntimeError("killed (SIGKILL: the kernel's out-of-memory killer)")
    if result.returncode != 0:
        raise RuntimeError(
            result.stderr.strip().splitlines()[-1]
            if result.stderr.strip()
            else f"exit {result.returncode}"
        )
    line = [x for x in result.stdout.splitlines() if x.startswith("RESULT")][-1]
    _, seconds, peak = line.split()
    return float(seconds), float(peak)


def _import_baseline() -> float:
    script = (
        _PEAK + "import onnx, onnx_ir, onnxscript, onnxruntime, numpy; "
        "import onnxnorm.fusion, onnxruntime.transformers.optimizer; print(_peak())"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    return float(result.stdout.strip().splitlines()[-1])


def timing_rows(folder: Path, log=print) -> tuple[list[dict], float, float]:
    path = corpus.decoder_export(folder)
    size = path.stat().st_size / 2**20
    baseline = _import_baseline()
    rows = []
    for tool, code in TIMED.items():
        row = {"tool": tool}
        try:
            row["seconds"], row["peak_mib"] = timed(code, path, folder / "out.onnx")
        except Exception as error:  # noqa: BLE001
            row["error"] = str(error)[:100]
        for leftover in folder.glob("out.onnx*"):
            leftover.unlink()
        log(json.dumps(row))
        rows.append(row)
    return rows, size, baseline


def filesystem(folder: Path) -> str:
    """The type of the file system ``folder`` lies on (the mount with the longest matching
    path in /proc/mounts), "unknown" where that cannot be read."""
    best, kind = "", "unknown"
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return kind
    path = str(folder.resolve())
    for line in mounts:
        fields = line.split()
        if len(fields) > 2:
            mount = fields[1].replace("\\040", " ")
            if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) > len(
                best
            ):
                best, kind = mount, fields[2]
    return kind


def large_timing(
    folders: list[Path],
    layers: int = 12,
    hidden: int = 2048,
    runs: int = 3,
    ort_runs: int = 1,
    log=print,
) -> list[dict]:
    """The three tools on a decoder with its weights in external data (12 x 2048: 2.47 GB),
    exported once and copied to each of ``folders`` (on different file systems); per tool the
    median time of ``runs`` runs (ORT's optimizer: ``ort_runs``) and the highest peak RSS.
    Written data is flushed to disk (sync) between runs, so that no run pays for the last
    one's writeback."""
    import shutil
    import statistics

    blocks = []
    source = corpus.decoder_export(folders[0], layers, hidden, external=True)
    for folder in folders:
        path = folder / source.name
        if folder != folders[0]:
            for file in (source, Path(f"{source}.data")):
                shutil.copyfile(file, folder / file.name)
        size = (path.stat().st_size + Path(f"{path}.data").stat().st_size) / 2**20
        block = {
            "filesystem": filesystem(folder),
            "size_mib": size,
            "layers": layers,
            "hidden": hidden,
            "rows": [],
        }
        for tool, code in TIMED.items():
            row = {"tool": tool, "runs": []}
            try:
                for _ in range(ort_runs if tool.startswith("ORT") else runs):
                    seconds, peak = timed(code, path, folder / "out.onnx", external=True)
                    row["runs"].append(seconds)
                    row["peak_mib"] = max(peak, row.get("peak_mib", 0.0))
                    for leftover in folder.glob("out.onnx*"):
                        leftover.unlink()
                    os.sync()
                row["seconds"] = statistics.median(row["runs"])
            except Exception as error:  # noqa: BLE001
                row["error"] = str(error)[:100]
            for leftover in folder.glob("out.onnx*"):
                leftover.unlink()
            log(json.dumps({**row, "filesystem": block["filesystem"]}))
            block["rows"].append(row)
        blocks.append(block)
        if folder != folders[0]:
            for file in (path, Path(f"{path}.data")):
                file.unlink()
    for file in (source, Path(f"{source}.data")):
        file.unlink()
    return blocks


def _large_markdown(blocks: list[dict], baseline: float) -> list[str]:
    if not blocks:
        return []
    first = blocks[0]
    out = [
        "## Speed and memory on a decoder with external data",
        "",
        f"The same decoder with {first['layers']} layers of hidden {first['hidden']}, its "
        f"weights in external data ({first['size_mib'] * 2**20 / 1e9:.2f} GB), run as above "
        "on each "
        "file system: the median of the runs shown, peak RSS the highest. The output's data "
        "file starts as the input's: on a file system that shares extents between files (XFS, "
        "btrfs: FICLONE, copy on write) no byte of the unchanged weights is copied and the "
        "output takes no space for them; elsewhere (ext4) the kernel copies the file "
        "(copy_file_range), and every tool's time is mostly the disk's. Either way the input "
        "is never written to. A tool killed for memory is shown so: ORT's optimizer holds the "
        "whole model in memory several times over.",
        "",
    ]
    for block in blocks:
        out += [
            f"**{block['filesystem']}**",
            "",
            "| tool | time (s) | runs (s) | peak RSS (MiB) | peak above imports (MiB) |",
            "|---|---:|---|---:|---:|",
        ]
        for row in block["rows"]:
            runs = ", ".join(f"{r:.2f}" for r in row["runs"])
            if "error" in row:
                out.append(f"| {row['tool']} | fails: {row['error']} | {runs} | | |")
            else:
                out.append(
                    f"| {row['tool']} | {row['seconds']:.2f} | {runs} | "
                    f"{row['peak_mib']:.0f} | {row['peak_mib'] - baseline:.0f} |"
                )
        ok = [r for r in block["rows"] if "error" not in r]
        mine = [r["seconds"] for r in ok if r["tool"] == "onnxnorm fuse"]
        others = [r["seconds"] for r in ok if r["tool"] != "onnxnorm fuse"]
        if mine and others:
            out += [
                "",
                f"onnxnorm is {min(others) / mine[0]:.1f}x faster than the faster of "
                "the other two.",
            ]
        out.append("")
    return out


# --- docs/fusion.md -------------------------------------------------------------------------------


def _memory_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def _cell(row: dict, tool: str) -> tuple[str, str, str]:
    if f"{tool}_error" in row:
        return "fails", "", row[f"{tool}_error"].replace("|", "/")
    return str(row[f"{tool}_norms"]), str(row[f"{tool}_adds"]), row[f"{tool}_parity"]


def markdown(rows, timing, size, baseline, large=()) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    out = [
        "# Fusion: onnxnorm against ORT's transformers optimizer and onnxscript's ort_fusions",
        "",
        f"Generated by `python tools/fusion_page.py` on {now}; {compare.versions()}; "
        f"{os.cpu_count()} CPU cores, {_memory_gib():.0f} GiB of memory.",
        "",
        "## How the pass works",
        "",
        "`onnxnorm fuse model.onnx -o fused.onnx [--target function|fused|ort|onnx] [--verify] "
        "[--json report.json]`; in Python `onnxnorm.fusion.fuse(model, target)`, and "
        "`onnxnorm.fusion.rules()` as an onnxscript `RewriteRuleSet` for other pipelines.",
        "",
        "1. **norms** (`norms.py`, `absorb.py`, `norm_ops.py`): a *core* rule finds the "
        "float32 statistics and normalization (`x / sqrt(mean(x^2) + eps)`, `(x - mean) / "
        "sqrt(mean((x - mean)^2) + eps)`; `Pow` or `Mul`, `Div` or `Reciprocal`/`Div(1, .)`, "
        "axes as attribute or input) and writes an onnxnorm node without Scale; *absorb* rules "
        "then take the following `Mul` by a weight (Scale), `Mul` by `w + c` (Scale with "
        "`scale_offset = c`: Gemma), `Add` of a weight (Bias) and the `Cast` pair around a "
        "float32 computation. Each absorb fixes the rounding order it proves: arithmetic in "
        "float16/bfloat16 after the rounding is order A (Llama, T5), float32 arithmetic rounded "
        "once by the final Cast is order B (Gemma, Cohere). Single ops become catalogue ops too "
        "(`norm_ops.py`): LayerNormalization (order B, as "
        "PyTorch and ORT compute it), RMSNormalization (order A, as PyTorch's rms_norm), ORT's "
        "SimplifiedLayerNormalization and com.microsoft SkipLayerNormalization / "
        "SkipSimplifiedLayerNormalization. Spellings of other tools (`standard.py`): ONNX's own "
        "function body of LayerNormalization as onnx's function expansion writes it (Flatten to "
        "rows, `E[x^2] - E[x]^2`, Reshape back; also after constant folding), tf2onnx's Keras "
        "LayerNorm (the scale folded into the reciprocal, `x * s + (beta - mean * s)`); the "
        "expansion of RMSNormalization is found by the core rule. Where that function body's "
        "statistics are used (its Mean / InvStdDev are graph outputs or read by other nodes), "
        "it becomes one standard LayerNormalization with those outputs, for every target (the "
        "report says so; its exactness: `tests/fusion/test_standard_expansion.py`). Statistics "
        "over several trailing axes (`axis` 0 to rank - 1) are fused with that axis.",
        "2. **sandwich**, **skip**, **xbias** (`residual.py`): norm -> add -> norm becomes a "
        "Sandwich op; the Add before a norm a Skip op (with Sum when the sum is used again: "
        "Pre-Norm; without: Post-Norm); `alpha * r + f` a Skip op with `alpha` (DeepNorm, float32 "
        "only: in half precision the original rounds `alpha * r` first); a sublayer's bias Add "
        "before a Skip op its XBias (float32 only, for the same reason). A residual Add in "
        "float16 cast to float32 before a norm that is cast back is a Skip op of the float16 "
        "sum; where the norm stays in float32 the report says why it cannot be one op.",
        "3. **BatchNormalization** folded into the Conv/ConvTranspose/Gemm before it "
        "(onnxscript's rules) or into a MatMul with a 2-D product (BatchNorm1d after a Linear); "
        "any other is reported with the reason.",
        "4. **quantizers** (`quantized.py`): a fused LayerNorm / RMSNorm / Skip norm whose output "
        "goes straight into a per-tensor QuantizeLinear (static QDQ: the DequantizeLinear after "
        "it stays) or, through a Cast to float32 for a float16 / bfloat16 X, into a "
        "DynamicQuantizeLinear becomes the norm's quantized op (`RMSNormQuantizeLinear`, "
        "`SkipRMSNormDynamicQuantizeLinear`, ...). QuantizeLinear's zero point gives Y's type: "
        "uint8, int8 or float8 e4m3fn (what ORT's `quantize_static` writes for "
        "`QuantType.QFLOAT8E4M3FN`, opset 19 or newer); the fused op quantizes to float8 as "
        "QuantizeLinear's default `saturate = 1` does (+-448 for what lies beyond, round half to "
        "even). A QuantizeLinear to float8 with `saturate = 0` is left, and the report says why: "
        "the fused op always saturates, and without saturation ONNX Runtime's CPU conversion "
        "departs from the ONNX specification for values in [480, 496), which it turns into 448 "
        "where the specification gives NaN, so no fused kernel could match both.",
        "5. **lowering** (`lowering.py`) to the target. `ort`: LayerNormalization / "
        "SimplifiedLayerNormalization with Scale and Bias where that is bit-exact (float32; "
        "ORT's kernels round once, order B, which measured bit for bit), Skip ops for float32, "
        "otherwise the unit-scale op in float32 followed by the catalogue's own arithmetic; "
        "`onnx`: the same with LayerNormalization (opset 17) and RMSNormalization (opset 23), "
        "the catalogue's function body inlined below those opsets. Every target is written in "
        "the ops of the model's own opset, from 7 (`function`: bodies without CastLike below "
        "15, with the attribute values in the body below 12); a node whose body the opset "
        "cannot hold (bfloat16 below 13, ...) is written without one, with the reason, or the "
        "model is converted to the oldest opset that can (`--upgrade-opset`).",
        "",
        "",
        "Grouped gated norms (Mamba2, Nemotron-H, Bamba, GraniteMoeHybrid, Falcon-H1) also fuse "
        "with dynamic batch and sequence dims: the group reshapes' targets, computed from `Shape` "
        "nodes (TorchScript's `Shape`/`Gather`/`Div`/`Concat`, the dynamo exporter's `Shape(start,"
        " end)` and `Concat` with constants, `Slice`, 0 and -1 dims), are evaluated over symbolic "
        "dims, so the view back is proved to restore X's shape without ONNX Runtime's symbolic "
        "inference; a grouped view that the dynamo exporter's optimizer merged with the view "
        "before it (Falcon-H1's per-head scan output viewed as whole rows) becomes the op of that "
        "tensor reshaped to the output's shape (`tests/fusion/test_gated_dynamic.py`).",
        "",
        "A rule fires only when it can prove the semantics: float32 statistics, the mean over "
        "trailing axes with keepdims, scalar constant epsilon and exponent, Scale/Bias a suffix "
        "of X's shape, residual operands of provably equal shape (ORT's symbolic shape inference "
        "helps where onnx's leaves dims unknown), intermediate values used by the match alone. "
        "Every rule reports what it found, fused and skipped with the reason (`--json`). Before "
        "anything is written, ONNX Runtime is shown to load the fused model (without reading a "
        "weight); faults of the input that ONNX Runtime tolerates are mended and listed "
        "(docs/reliability.md, Models from the wild).",
        "",
        "Large models: the CLI reads the model without its external data (tensors under 1 KiB "
        "excepted), the fused graph is serialized without the input's unchanged weights, and "
        "the output is written through temporary files renamed into place. Its data file "
        "`<output>.data` starts as the input's data file, so the unchanged weights keep their "
        "offsets: shared with the input where the file system can (FICLONE: XFS, btrfs; copy on "
        "write, so writing either file never changes the other), else copied by the kernel "
        "(copy_file_range); ranges no tensor uses become holes, and only new tensors are "
        "written. Weights inside the input file are streamed into the output (copy_file_range).",
        "",
        "Gated, grouped and L2 norms of hybrid and linear-attention models (the stage **gated**, "
        "`gated.py` and `l2.py`; Gemma 3n's `Pow(., -0.5)` spelling in the norm core): "
        "[fusion-gated.md](fusion-gated.md), with the families' table.",
        "",
        "Q/K norms and their rotary (the stage **rotary**, `rotary.py`): a per-head norm (or "
        "OLMo 2's norm of the whole projection, through its view to heads) and the rotary "
        "after it, `x * cos + partner(x) * sin` with the partner any chain of Slice, Split, "
        "Neg, Concat, Unsqueeze and Reshape on the last axis that evaluates to `rotate_half` "
        "or to the interleaved pairs (partial rotary: the Concat with the rest of each head), "
        "through the Transpose between them, the angles unsqueezed at the head axis or folded "
        "into constants, become one `RMSNormRotary` / `LayerNormRotary` / `L2NormRotary` "
        "node; then a layer's Q node and K node (projections of the same hidden state, the "
        "same angles and attributes) become one node with both. A rotation computed in "
        "float32 on a float16/bfloat16 Q (the Cast pair of OLMo 2 and Cohere in half "
        "precision) is taken with `rotary_in_t = 0`. Tested on Qwen3, Gemma 3, OLMo 2, Cohere "
        "and Phi with both exporters (`tests/fusion/test_rotary_fusion.py`). The other orders "
        "and spellings follow; what is left is onnxruntime-genai's GroupQueryAttention with "
        "its own rotary (a near miss on purpose, below).",
        "",
        "Rotary first, then the norm (the same stage; Llama 4, nanochat): a norm op whose X "
        "is the decomposed rotary of Q, through a Transpose of the heads between the two or "
        "before the rotary (nanochat's, `layout = 2`) and through the Cast back of a rotation "
        "in float32 (Llama 4's, `rotary_in_t = 0`), becomes the rotary op with `rotary_first "
        "= 1`; the pairing keys on every attribute, so a rotary-first Q never joins a "
        "norm-first K. A partner that is minus a rotation's (nanochat's `rotate_half`, "
        "`cat(x2, -x1)`: the rotation by minus the angle), in either order, becomes the op's "
        "rotation of minus Sin: constant angles as one negated initializer that Q's and K's "
        "node share, other angles through a Neg node; negating a float is exact, and in "
        "float16 the fused node gives onnx's reference evaluation of the original bit for bit "
        "but for rare ties (ONNX Runtime 1.32's CPU provider does not round each step of a "
        "float16 Mul and Add chain, so the original there differs from both by a unit in the "
        "last place in up to 40% of the values). Llama 4 itself does not export: its rotary "
        "multiplies complex numbers, and torch 2.13's dynamo exporter has no translation of "
        "`aten.unsqueeze` on a complex tensor, TorchScript none of `aten::polar` nor of "
        "complex inputs; its attention written out in real arithmetic (`x * cos + pairs(x) * "
        "sin`, float32 angles, then the weightless norm) fuses from both exporters, as does "
        "transformers' NanoChat (`tests/fusion/test_rotary_first.py`). Where onnx's shape "
        "inference leaves a last dim unknown (TorchScript's flatten of the stacked pairs), "
        "the rules read ONNX Runtime's symbolic shapes.",
        "",
        "RotaryEmbedding nodes (the same stage, `rotary_nodes.py`): a norm op and ONNX "
        "Runtime's `com.microsoft` RotaryEmbedding or ONNX's (opset 23) after it become the "
        "rotary op as well, then Q and K one node. That is what onnxruntime-genai's model "
        "builder writes for a Q/K-norm model whose rotation is a node of its own (Qwen3 in "
        "float16 for the CPU or DirectML: `SimplifiedLayerNormalization` over [batch, seq * "
        "heads, head] rows, a Reshape back to [batch, seq, heads * head], RotaryEmbedding), "
        "and what lowering a rotary op to `ort` or `onnx` writes. Taken: the 3-D input with "
        "`num_heads` (layout 0 with `head_size`) and the 4-D [batch, heads, seq, head] one "
        "(layout 1, or 2 through the Transpose after the norm); caches gathered by position "
        "ids, or ONNX's per-token caches; partial and interleaved rotations; a norm over the "
        "whole token (`per_head = 0`); a float32 rotation between Casts. ONNX Runtime's CPU "
        "kernels of both ops rotate float16 in float32 and round once, so the node gets "
        "`rotary_in_t = 0`; measured on the hand-built forms of "
        "`tests/fusion/test_rotary_nodes.py` at 4 x 256 tokens with three seeds (4.7M float16 "
        "values, onnxruntime 1.32 CPU), the fused node gives ONNX Runtime's values bit for "
        "bit but for 0.005% (where the norm's output is a unit apart), float32 within 1e-6. "
        "Left with the reason: `scale` other than 1, `is_packed_batching = 1`, position ids "
        "of one element (ONNX Runtime's offset added to each token's index), caches whose "
        "width is not `rotary_embedding_dim / 2`, a head size the attributes leave unclear, a "
        "norm whose rows are neither the heads nor the tokens. A model lowered to `ort` or "
        "`onnx` fuses back into the same rotary op (the lowering's unit Scale, a "
        "ConstantOfShape of ones, is taken as no Scale, so the weights' Mul joins the norm). "
        "Q and K pair behind ONNX Runtime's quantized projections as well (MatMulNBits of "
        "onnxruntime-genai's int4 models).",
        "",
        "GroupQueryAttention's own rotary (`rotary_gqa.py`, reported as a near miss) and its "
        "norm inputs (`gqa_writer.py`, `--for ort-cuda`). onnxruntime-genai's model builder "
        "writes Qwen3's Q/K norms (CPU float32 and int4; CUDA float16 with "
        "`fuse_qk_norm_gqa=false`) as `Reshape [0, -1, head]`, `SimplifiedLayerNormalization` "
        "(axis -1, `stash_type` 1, the weight in the model's type), `Reshape [0, -1, heads * "
        "head]`, into `com.microsoft GroupQueryAttention` with `do_rotary = 1`, `cos_cache` / "
        "`sin_cache` of [max length, head / 2] and no `position_ids` (CUDA float16 by "
        "default: no norm nodes, the weights are GroupQueryAttention's `q_norm_weight` / "
        "`k_norm_weight`). The norms become RMSNorm nodes and the rotation stays in "
        "GroupQueryAttention. Moving it into the rotary op would be exact: without "
        "`position_ids` and `query_seqlens` GroupQueryAttention's schema puts row s of S new "
        "tokens at `max(seqlens_k + 1 - S, 0) + s`, and a node with those positions computed "
        "in the graph and `do_rotary = 0` gives ONNX Runtime's CPU results bit for bit in "
        "float16, within a float32 unit in the last place in float32 (first, padded, decode "
        "and mixed steps, `tests/fusion/test_rotary_gqa.py`). It is not worth it: on a 2-core "
        "CPU (32 query and 8 key heads of 128) it saved nothing in a decode step and 1-4 % of "
        "the norm and attention time of 8- to 128-token steps; on CUDA the rotation is part "
        "of GroupQueryAttention's KV-append kernel; and every runtime without the library "
        "would get a norm op, a RotaryEmbedding and a position subgraph for a rotation "
        "GroupQueryAttention does anyway. Written `--for ort-cuda`, the per-head RMSNorms "
        "before a GroupQueryAttention instead become its `q_norm_weight` / `k_norm_weight` "
        "and `qk_norm_epsilon` (the RMSNorm nodes would otherwise keep ONNX Runtime's own "
        "fusion of these norms, which looks for SimplifiedLayerNormalization, from matching), "
        "where its CUDA kernel computes the same norm: float16 or bfloat16, rounding order B, "
        "per head, no bias, the weight (plus offset) exactly a [head] tensor of Q's type, "
        "equal epsilons, `do_rotary = 1`, an unquantized cache; the other norms stay the "
        "library's op, with the reason (docs/design.md, section 4). Not run on a GPU yet: "
        "`tools/gpu_check.sh`, step `gqa`.",
        "",
        "## Corpus",
        "",
        "Tiny random-weight transformers models built from configs in code "
        "(`onnxnorm.testing.hf`: 2 layers, hidden 32, random norm weights) and decoder blocks "
        "of `onnxnorm.nn.decoder` with their norms spelled out, exported with both PyTorch "
        "exporters (dynamo: opset 18 with its optimizer; TorchScript: opset 17). *Norm calls* "
        "are counted from the torch model with forward hooks. Per tool: the norms that end as "
        "one op (a Skip op holds one norm and one residual add, a Sandwich op two norms and one "
        "add; LayerNormalization ops the exporter already wrote count for every tool), the "
        "residual adds absorbed, and parity: the optimized model against the original in "
        "onnxruntime (CPU) on generated inputs, max abs error, `ok` within 1e-4.",
        "",
        "ORT's optimizer runs with `opt_level=0` and the model type nearest to each family "
        "(bert, gpt2, t5, gpt_neox, qwen3, phi; gpt2 for the other decoders). onnxscript runs "
        "`optimize_for_ort` with its defaults. onnxnorm runs `fuse(model, 'function')`.",
        "",
        "| model | exporter | norm calls | exported as ops | onnxnorm norms | adds | parity "
        "| ORT opt. norms | adds | parity | onnxscript norms | adds | parity |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|---|---:|---:|---|",
    ]
    totals = {t: [0, 0] for t in ("onnxnorm", "ort", "onnxscript")}
    calls = 0
    for row in rows:
        if "export_error" in row:
            out.append(
                f"| {row['model']} | {row['exporter']} | export fails: "
                f"{row['export_error']} | | | | | | | | | | |"
            )
            continue
        calls += row["norm_calls"]
        cells = []
        for tool in totals:
            n, a, p = _cell(row, tool)
            cells += [n, a, p]
            if n.isdigit():
                totals[tool][0] += int(n)
                totals[tool][1] += int(a)
        out.append(
            f"| {row['model']} | {row['exporter']} | {row['norm_calls']} | "
            f"{row['exported_ops']} | " + " | ".join(cells) + " |"
        )
    out.append(
        f"| **total** | | **{calls}** | | **{totals['onnxnorm'][0]}** | "
        f"**{totals['onnxnorm'][1]}** | | **{totals['ort'][0]}** | **{totals['ort'][1]}** "
        f"| | **{totals['onnxscript'][0]}** | **{totals['onnxscript'][1]}** | |"
    )
    out += [
        "",
        "Where onnxnorm absorbs fewer adds than there are norms, no Skip op can take the add: "
        "the first norm reads the embeddings; parallel blocks (GPT-NeoX, Falcon, Cohere) feed "
        "two norms from one sum; OPT reshapes the sum to 2-D before its norms; BLOOM's first "
        "layer normalizes the embedding norm's output; the encoders' first norm reads the "
        "embeddings plus position embeddings of batch 1, an Add that broadcasts over the batch "
        "(reported with its dims). CLIP vision's last norm reads the pooled token, which these "
        "exports do not return: it is not in the graph.",
        "",
    ]
    if timing:
        out += [
            "## Speed and memory of the pass",
            "",
            f"A Llama-style decoder of `onnxnorm.nn.decoder` (8 layers, hidden 1024, weights "
            f"inside the file: {size:.0f} MiB), exported with the dynamo exporter. Each tool "
            "runs in a fresh interpreter; time is the pass (load, optimize, save), imports "
            f"excluded; peak RSS is the process's VmHWM (imports alone: {baseline:.0f} MiB)."
            " The target: onnxnorm at least 5x faster than the faster other tool, and its peak "
            "memory above the imports at most 1.5x the file.",
            "",
            "| tool | time (s) | peak RSS (MiB) | peak above imports / file size |",
            "|---|---:|---:|---:|",
        ]
        for row in timing:
            if "error" in row:
                out.append(f"| {row['tool']} | fails: {row['error']} | | |")
            else:
                out.append(
                    f"| {row['tool']} | {row['seconds']:.2f} | {row['peak_mib']:.0f} | "
                    f"{(row['peak_mib'] - baseline) / size:.2f} |"
                )
        ok = [r for r in timing if "error" not in r]
        mine = [r for r in ok if r["tool"] == "onnxnorm fuse"]
        others = [r["seconds"] for r in ok if r["tool"] != "onnxnorm fuse"]
        if mine and others:
            out += [
                "",
                f"onnxnorm is {min(others) / mine[0]['seconds']:.1f}x faster than the "
                "faster of the other two.",
            ]
        out.append("")
    out += _large_markdown(list(large), baseline)
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python tools/fusion_page.py", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--models", default=",".join([*corpus.ENTRIES, *corpus.ENCODERS]))
    parser.add_argument("--exporters", default="dynamo,torchscript")
    parser.add_argument("--no-timing", action="store_true")
    parser.add_argument(
        "--large",
        metavar="FOLDERS",
        help="also time the tools on a 2.47 GB external-data decoder in each of "
        "these folders (comma-separated; e.g. one on ext4, one on XFS)",
    )
    parser.add_argument("--runs", type=int, default=3, help="runs per tool for --large")
    parser.add_argument("-o", "--output", default="docs/fusion.md")
    parser.add_argument("--json", help="also write the raw rows as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        rows = corpus_rows(args.models.split(","), args.exporters.split(","), folder)
        timing, size, baseline = ([], 0.0, 0.0) if args.no_timing else timing_rows(folder)
        large = (
            large_timing([Path(f) for f in args.large.split(",")], runs=args.runs)
            if args.large
            else []
        )
        if large and not baseline:
            baseline = _import_baseline()
    Path(args.output).write_text(markdown(rows, timing, size, baseline, large))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "corpus": rows,
                    "timing": timing,
                    "size_mib": size,
                    "import_mib": baseline,
                    "large": large,
                },
                indent=2,
            )
        )
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
