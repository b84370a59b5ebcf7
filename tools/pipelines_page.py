"""Writes docs/pipelines.md: onnxnorm, ONNX Runtime's transformers optimizer and onnxscript's
ort_fusions on the models deployment pipelines make (models/pipelines.py builds them), the page's
prose from tools/pipelines.md.in.

    python tools/pipelines_page.py [-o docs/pipelines.md]

A measured page, minutes long and dated: not part of `make generate` (tools/generate.py's
MEASURED).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import sys
import tempfile
import warnings
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # models/

from models import compare, pipelines  # noqa: E402 - after the repository root is on the path

# --- measuring ----------------------------------------------------------------------------------


def _tools(model: onnx.ModelProto, folder: Path, sizes=None) -> dict:
    """norms, adds and parity (or the error) of onnxnorm, ORT's optimizer and onnxscript."""
    from onnxnorm.fusion import fuse

    path = folder / "input.onnx"
    onnx.save(model, path)
    row = {}
    runs = {
        "onnxnorm": lambda: fuse(model)[0],
        "ort": lambda: compare.run_ort(model, path, "llama"),
        "onnxscript": lambda: compare.run_onnxscript(model, path),
    }
    for tool, run in runs.items():
        try:
            with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                optimized = run()
        except Exception as error:  # noqa: BLE001 - a tool's failure is a result
            row[f"{tool}_error"] = f"{type(error).__name__}: {str(error).strip()[:60]}"
            continue
        row[f"{tool}_norms"], row[f"{tool}_adds"] = compare.count(optimized)
        row[f"{tool}_parity"] = compare.parity(model, optimized, sizes=sizes)
    return row


def measure_sources(names=None, log=print) -> list[dict]:
    rows = []
    for name in names or pipelines.SOURCES:
        with tempfile.TemporaryDirectory() as tmp:
            model = pipelines.SOURCES[name][1](Path(tmp))
            sizes = {"past_sequence_length": 3} if "KV" in name else None
            row = {"source": name, **_tools(model, Path(tmp), sizes)}
        log(json.dumps(row))
        rows.append(row)
    return rows


def measure_genai(
    families=pipelines.GENAI_FAMILIES, precisions=pipelines.GENAI_PRECISIONS, log=print
) -> list[dict]:
    from onnxnorm.genai import convert, dim_sizes, generate, read_config

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for family in families:
            for precision in precisions:
                folder = pipelines.genai_folder(family, precision, root)
                out = root / f"{family}_{precision}_onnxnorm"
                report = convert(folder, out)
                want, have = (
                    generate(f, pipelines.PROMPT, pipelines.NEW_TOKENS) for f in (folder, out)
                )
                kernels = pipelines.profiled_kernels(out)
                model = onnx.load(folder / "model.onnx", load_external_data=False)
                row = {
                    "family": family,
                    "precision": precision,
                    "norms": report.norms,
                    "adds": report.residual_adds,
                    "tokens_equal": want == have,
                    "tokens": len(have),
                    "onnxnorm_kernels": sum(
                        v
                        for k, v in kernels.items()
                        if k
                        in (
                            "RMSNorm",
                            "SkipRMSNorm",
                            "LayerNorm",
                            "SkipLayerNorm",
                            "SandwichRMSNorm",
                        )
                    ),
                }
                # the past (the KV cache's capacity) must cover Gemma 2's sliding window (16)
                sizes = dim_sizes(read_config(folder), model, past=16)
                full = onnx.load(folder / "model.onnx")
                row.update(_tools(full, root, sizes))
                log(json.dumps(row))
                rows.append(row)
    return rows


def _file_parity(original: Path, optimized: Path) -> str:
    from onnxnorm.fusion.folder import verify_file

    try:
        checks = verify_file(original, optimized)
    except Exception as error:  # noqa: BLE001 - reported in the table
        text = str(error).strip().replace(f"{optimized}: ", "")  # no temporary paths
        return f"does not run ({text.splitlines()[0][:110]})"
    worst = max(c.max_abs for c in checks)
    return f"{'ok' if all(c.ok for c in checks) else 'MISMATCH'} ({worst:.1e})"


def measure_optimum(families=tuple(pipelines.OPTIMUM_FAMILIES), log=print) -> list[dict]:
    """Per file of each Optimum folder: what ``onnxnorm fuse DIR -o OUT`` (its
    :func:`~onnxnorm.fusion.folder.fuse_folder`) fused and its parity (a merged decoder: both
    branches), next to ORT's optimizer and onnxscript on the same file."""
    from onnxnorm.fusion.folder import fuse_folder

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for family, folder in pipelines.optimum_folders(root, families).items():
            report = fuse_folder(folder, root / f"{family}_onnxnorm")
            for result in report.files:
                path = folder / result.name
                row = {
                    "family": family,
                    "file": result.name,
                    "onnxnorm_norms": result.report.norms,
                    "onnxnorm_adds": result.report.residual_adds,
                    "onnxnorm_parity": result.parity().replace("max abs error ", ""),
                }
                for tool in ("ort", "onnxscript"):
                    out = root / f"{family}_{tool}_{result.name}"
                    try:
                        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                            warnings.simplefilter("ignore")
                            compare.optimize_file(tool, path, family, out)
                    except Exception as error:  # noqa: BLE001 - a tool's failure is a result
                        row[f"{tool}_error"] = f"{type(error).__name__}: {str(error).strip()[:60]}"
                        continue
                    row[f"{tool}_norms"], row[f"{tool}_adds"] = compare.count_all(onnx.load(out))
                    row[f"{tool}_parity"] = _file_parity(path, out)
                log(json.dumps(row))
                rows.append(row)
    return rows


# --- docs/pipelines.md ----------------------------------------------------------------------------


def _cells(row, tool):
    if f"{tool}_error" in row:
        return f"fails: {row[f'{tool}_error']}".replace("|", "/"), "", ""
    return str(row[f"{tool}_norms"]), str(row[f"{tool}_adds"]), row[f"{tool}_parity"]


TEMPLATE = Path(__file__).with_name("pipelines.md.in")


def _optimum_table(rows) -> str:
    lines = [
        "| model | file | onnxnorm norms | adds | parity | ORT opt. norms | adds | parity | "
        "onnxscript norms | adds | parity |",
        "|---|---|---:|---:|---|---:|---:|---|---:|---:|---|",
    ]
    for r in rows:
        cells = [c for tool in ("onnxnorm", "ort", "onnxscript") for c in _cells(r, tool)]
        lines.append(f"| {r['family']} | {r['file']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown(genai_rows, source_rows, optimum_rows=()) -> str:
    import onnxruntime_genai

    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    versions = f"onnxruntime-genai {onnxruntime_genai.__version__}, {compare.versions()}"
    genai = [
        "| model | precision | norms fused | adds absorbed | decoder parity (past 16) | "
        "32 greedy tokens | onnxnorm kernels run | ORT opt. norms / adds | onnxscript "
        "norms / adds |",
        "|---|---|---:|---:|---|---|---:|---|---|",
    ]
    for r in genai_rows:
        o, s = _cells(r, "ort"), _cells(r, "onnxscript")
        genai.append(
            f"| {r['family']} | {r['precision']} | {r['norms']} | {r['adds']} | "
            f"{_cells(r, 'onnxnorm')[2]} | "
            f"{'identical' if r['tokens_equal'] else 'DIFFER'} ({r['tokens']}) | "
            f"{r['onnxnorm_kernels']} | {o[0]} / {o[1]} | {s[0]} / {s[1]} |"
        )
    sources = [
        "| source | what was run | onnxnorm norms | adds | parity | ORT opt. norms | adds | "
        "parity | onnxscript norms | adds | parity |",
        "|---|---|---:|---:|---|---:|---:|---|---:|---:|---|",
    ]
    for r in source_rows:
        cells = [c for tool in ("onnxnorm", "ort", "onnxscript") for c in _cells(r, tool)]
        sources.append(
            f"| {r['source']} | `{pipelines.SOURCES[r['source']][0]}` | " + " | ".join(cells) + " |"
        )
    text = TEMPLATE.read_text()
    return (
        text.replace(
            "GENERATED", f"Generated by `python tools/pipelines_page.py` on {now}; {versions}."
        )
        .replace("GENAI_TABLE", "\n".join(genai))
        .replace("SOURCES_TABLE", "\n".join(sources))
        .replace("OPTIMUM_TABLE", _optimum_table(optimum_rows))
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python tools/pipelines_page.py", description=__doc__.splitlines()[0]
    )
    parser.add_argument("-o", "--output", default="docs/pipelines.md")
    args = parser.parse_args(argv)
    genai_rows = measure_genai()
    source_rows = measure_sources()
    optimum_rows = measure_optimum()
    Path(args.output).write_text(markdown(genai_rows, source_rows, optimum_rows))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
