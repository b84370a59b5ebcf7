"""The runs of ``onnxnorm bench fuse``: the decoders built, each tool run in a fresh interpreter
in turn, the medians printed as markdown tables (see the package's docstring)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from onnxnorm.bench.common import (
    cpu_name,
    load_average,
    short_error,
    table_row,
    table_rule,
    write_json,
)

#: what each tool imports before its pass is timed (the same in every run of it)
IMPORTS = {
    # onnxnorm fuse imports onnxruntime on every run (it proves that the output loads), as
    # ONNX Runtime's optimizer does before its pass
    "onnxnorm": "import onnxruntime, onnxnorm.cli, onnxnorm.fusion.files, onnxnorm.fusion.pipeline",
    "onnxscript": (
        "import onnx_ir as ir\nfrom onnxscript.rewriter.ort_fusions import optimize_for_ort"
    ),
    "ort": "from onnxruntime.transformers.optimizer import optimize_model",
}
#: each tool's pass: load SRC, optimize, save DST (with external data where EXT); ``rc`` its
#: exit status. onnxnorm runs its command line with every option at its default but ARGS.
PASSES = {
    "onnxnorm": (
        "import contextlib, io\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    rc = onnxnorm.cli.main(['fuse', SRC, '-o', DST, *ARGS])"
    ),
    "onnxscript": (
        "m = ir.load(SRC)\n"
        "m, _ = optimize_for_ort(m)\n"
        "ir.save(m, DST, external_data=os.path.basename(DST) + '.data' if EXT else None)\n"
        "rc = 0"
    ),
    "ort": (
        "m = optimize_model(SRC, model_type='gpt2', num_heads=0, hidden_size=0, opt_level=0)\n"
        "m.save_model_to_file(DST, use_external_data_format=EXT)\n"
        "rc = 0"
    ),
}
#: how the table names each tool
NAMES = {
    "onnxnorm": "onnxnorm fuse",
    "onnxscript": "onnxscript optimize_for_ort",
    "ort": "ORT transformers optimizer",
}

_CHILD = """\
import json, logging, os, sys, time, warnings
warnings.simplefilter("ignore")
logging.disable(logging.WARNING)
SRC, DST, EXT, ARGS = {src!r}, {dst!r}, {external!r}, {args!r}
{imports}
t0, c0 = time.perf_counter(), os.times()
{code}
t1, c1 = time.perf_counter(), os.times()
peak = 0.0
for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
        peak = int(line.split()[1]) / 1024
cpu = (c1.user - c0.user) + (c1.system - c0.system)
print("RESULT " + json.dumps(dict(seconds=t1 - t0, cpu=cpu, peak=peak)))
sys.exit(rc)
"""

#: the name of every output, beside the input (``--data reference`` needs its folder)
OUTPUT = "bench_fuse_out.onnx"


def last_line(text: str) -> str:
    """The last line of a child's error output that is not blank (a traceback's last line
    says what was raised), at most 200 characters."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:200] if lines else "no message"


def build_decoder(folder: Path, layers: int, hidden: int, external: bool) -> Path:
    """The Llama-style decoder of ``layers`` x ``hidden`` in ``folder`` (reused when there),
    exported in a child process, so that this one never holds its weights."""
    name = f"decoder_{layers}x{hidden}{'_external' if external else ''}.onnx"
    path = folder / name
    if path.is_file() and (not external or Path(f"{path}.data").is_file()):
        return path
    code = (
        "import sys, torch\n"
        "from onnxnorm.nn import decoder, families\n"
        "from onnxnorm.nn.exporter import quiet_export\n"
        "torch.manual_seed(0)\n"
        f"config = families.decoder_config('llama', hidden={hidden}, heads={hidden // 64}, "
        f"intermediate={hidden * 11 // 4}, layers={layers}, impl='decomposed')\n"
        "model = decoder.build(config)\n"
        "with quiet_export(), torch.no_grad():\n"
        f"    program = torch.onnx.export(model, (torch.randn(1, 16, {hidden}),), dynamo=True)\n"
        "del model\n"
        f"program.save({str(path)!r}, external_data={external!r})\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"exporting {name} failed: {last_line(result.stderr)}")
    return path


def filesystem(folder: Path) -> str:
    """The type of the file system ``folder`` is on (the longest mount point of /proc/mounts
    that holds it), "unknown" where that cannot be read."""
    path, best, kind = str(folder.resolve()), "", "unknown"
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return kind
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        mount = fields[1].replace("\\040", " ")
        inside = path == mount or path.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) > len(best):
            best, kind = mount, fields[2]
    return kind


def external_data(path: Path) -> bool:
    """Whether the model file ``path`` keeps tensors in external data files."""
    from onnxnorm._io import has_external_data, load_model

    return has_external_data(load_model(path, load_weights=False), path)


def size_mib(path: Path) -> float:
    """The model file and the data files beside it named after it."""
    files = [path, *path.parent.glob(path.name + ".data")]
    return sum(f.stat().st_size for f in files if f.is_file()) / 2**20


def contenders(tools: Sequence[str], data: Sequence[str], external: bool, target: str | None):
    """(row name, tool, onnxnorm's arguments) for each run on one model: onnxnorm once per
    ``--data`` mode on a model with external data (``copy`` first), once on any other."""
    extra = ["--target", target] if target else []
    out = []
    for tool in tools:
        if tool == "onnxnorm":
            modes = sorted(set(data), key=["copy", "reflink", "link", "reference"].index)
            for mode in modes if external else ["copy"]:
                name = NAMES[tool] if mode == "copy" else f"{NAMES[tool]} --data {mode}"
                out.append((name, tool, [*extra, "--data", mode]))
        else:
            out.append((NAMES[tool], tool, []))
    return out


def _new_files(folder: Path, before: set[str]) -> list[Path]:
    return [folder / name for name in sorted(set(os.listdir(folder)) - before)]


def _under(gib: float | None) -> str:
    """Where a run was limited, the words saying so (a failure may be the limit's)."""
    return f" under the {gib:g} GiB limit" if gib is not None else ""


def _limit(gib: float | None):
    """A ``preexec_fn`` that caps the child's address space at ``gib`` GiB (None: no cap)."""
    if gib is None:
        return None

    def limit() -> None:
        import resource

        size = int(gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (size, size))

    return limit


def run_once(
    tool: str, source: Path, external: bool, args: list[str], memory_limit: float | None = None
) -> dict[str, Any]:
    """One run of ``tool`` on ``source`` in a fresh interpreter (its address space capped at
    ``memory_limit`` GiB): its pass's seconds and CPU seconds, the whole process's seconds, its
    peak RSS, the disk space its output's new files take; the output is then removed and
    written data flushed."""
    folder = source.parent
    before = set(os.listdir(folder))
    inputs = {os.stat(folder / name).st_ino for name in before}
    script = _CHILD.format(
        src=str(source),
        dst=str(folder / OUTPUT),
        external=external,
        args=args,
        imports=IMPORTS[tool],
        code=PASSES[tool],
    )
    started = time.perf_counter()
    try:
        result = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=3600,
            preexec_fn=_limit(memory_limit),
        )
        process = time.perf_counter() - started
        new = _new_files(folder, before)
        written = sum(
            p.stat().st_blocks * 512
            for p in new
            if p.is_file() and not p.is_symlink() and p.stat().st_ino not in inputs
        )
    finally:
        for path in _new_files(folder, before):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        os.sync()
    if "MemoryError" in result.stderr:
        raise RuntimeError("out of memory (MemoryError)" + _under(memory_limit))
    if result.returncode < 0:
        name = signal.Signals(-result.returncode).name
        why = " (the kernel's out-of-memory killer?)" if name == "SIGKILL" else ""
        raise RuntimeError(f"killed by {name}{why}" + _under(memory_limit))
    if result.returncode != 0 or "RESULT " not in result.stdout:
        raise RuntimeError(
            last_line(result.stderr) if result.stderr else f"exit {result.returncode}"
        )
    line = next(x for x in reversed(result.stdout.splitlines()) if x.startswith("RESULT "))
    row = json.loads(line[len("RESULT ") :])
    row.update(process=process, written_mib=written / 2**20)
    return row


def measure_model(
    source: Path,
    tools: Sequence[str],
    data: Sequence[str],
    target: str | None,
    repeats: int,
    log=print,
    memory_limit: float | None = None,
) -> dict[str, Any]:
    """Every contender on ``source``, ``repeats`` times in turns (the order rotated by one
    each time); per contender its runs and medians, or the error that stopped it."""
    from onnxnorm._storage.filesystem import clone_problem

    external = external_data(source)
    entries = contenders(tools, data, external, target)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in entries}
    errors: dict[str, str] = {}
    for repeat in range(repeats):
        shift = repeat % len(entries)
        for name, tool, args in entries[shift:] + entries[:shift]:
            if name in errors:
                continue
            try:
                runs[name].append(run_once(tool, source, external, args, memory_limit))
            except Exception as error:  # noqa: BLE001 - a tool's failure is a result
                errors[name] = short_error(error)
            log(
                f"  {source.name}: {name}, run {repeat + 1}: "
                + (errors[name] if name in errors else f"{runs[name][-1]['seconds']:.2f} s")
            )
    rows = []
    for name, tool, args in entries:
        row: dict[str, Any] = {"contender": name, "tool": tool, "args": args}
        if name in errors:
            row["error"] = errors[name]
        else:
            got = runs[name]
            row["runs"] = [r["seconds"] for r in got]
            for key in ("seconds", "cpu", "process", "written_mib"):
                row[key] = statistics.median(r[key] for r in got)
            row["peak_mib"] = max(r["peak"] for r in got)
        rows.append(row)
    return {
        "model": source.name,
        "path": str(source),
        "size_mib": size_mib(source),
        "external": external,
        "filesystem": filesystem(source.parent),
        "clones": clone_problem(source.parent / OUTPUT) is None,
        "rows": rows,
    }


def headline(block: dict[str, Any]) -> str:
    """onnxnorm's default and its fastest mode against the faster other tool."""
    done = [r for r in block["rows"] if "seconds" in r]
    others = [r for r in done if r["tool"] != "onnxnorm"]
    mine = [r for r in done if r["tool"] == "onnxnorm"]
    if not others or not mine:
        return ""
    other = min(others, key=lambda r: r["seconds"])
    default = next((r for r in mine if r["args"][-1] == "copy"), None)
    best = min(mine, key=lambda r: r["seconds"])
    parts = []
    if default is not None:
        parts.append(
            f"onnxnorm fuse (--data copy) {other['seconds'] / default['seconds']:.1f}x as fast "
            f"as the faster other tool ({other['contender']})"
        )
    if best is not default:
        parts.append(f"`{best['contender']}` {other['seconds'] / best['seconds']:.1f}x")
    return "; ".join(parts) + "."


def markdown(blocks: list[dict[str, Any]], env: dict[str, Any]) -> str:
    """The tables, one per model, under a line on the run."""
    versions = ", ".join(f"{k} {v}" for k, v in env["versions"].items())
    lines = [
        f"{env['date']}, {env['cpu']}, {env['cores']} cores, load average "
        f"{env['load_before']} before and {env['load_after']} after; {versions}; "
        f"medians of {env['repeats']} run(s)"
        + (
            f"; each run limited to {env['memory_limit_gib']:g} GiB"
            if env.get("memory_limit_gib")
            else ""
        ),
    ]
    for block in blocks:
        kind = "external data" if block["external"] else "weights inside the file"
        clones = "which clones files" if block["clones"] else "which cannot clone files"
        lines += [
            "",
            f"**{block['model']}**: {block['size_mib']:.0f} MiB, {kind}; "
            f"{block['filesystem']}, {clones}",
            "",
            table_row(
                [
                    "tool",
                    "pass s",
                    "runs (s)",
                    "CPU s",
                    "process s",
                    "peak RSS MiB",
                    "written MiB",
                ]
            ),
            table_rule("lrlrrrr"),
        ]
        for row in block["rows"]:
            if "error" in row:
                lines.append(
                    table_row([row["contender"], f"fails: {row['error']}", "", "", "", "", ""])
                )
                continue
            lines.append(
                table_row(
                    [
                        row["contender"],
                        f"{row['seconds']:.2f}",
                        ", ".join(f"{s:.2f}" for s in row["runs"]),
                        f"{row['cpu']:.2f}",
                        f"{row['process']:.2f}",
                        f"{row['peak_mib']:.0f}",
                        f"{row['written_mib']:.0f}",
                    ]
                )
            )
        if text := headline(block):
            lines += ["", text]
    return "\n".join(lines)


def environment(repeats: int, memory_limit: float | None = None) -> dict[str, Any]:
    """The date, machine and versions of a run."""
    import importlib.metadata

    versions = {}
    for name in ("onnxnorm", "onnx", "onnxruntime", "onnxscript", "onnx-ir", "torch", "numpy"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    versions["python"] = platform.python_version()
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "versions": versions,
        "repeats": repeats,
        "memory_limit_gib": memory_limit,
        "load_before": load_average(),
    }


def run(
    *,
    models: list[Path],
    cases: Sequence[str],
    sizes: dict[str, tuple[int, int]],
    tools: Sequence[str],
    data: Sequence[str],
    target: str | None,
    repeats: int,
    folder: Path | None,
    json_path: str | None,
    memory_limit: float | None = None,
    log=print,
) -> list[dict[str, Any]]:
    """The whole benchmark: the decoders built (in ``folder``, kept, or in a temporary folder,
    removed), each model measured, the tables printed, the JSON written."""
    env = environment(repeats, memory_limit)
    temporary = None
    if not models:
        if folder is None:
            temporary = folder = Path(tempfile.mkdtemp(prefix="onnxnorm-bench-fuse-"))
        folder.mkdir(parents=True, exist_ok=True)
    try:
        if not models:
            assert folder is not None
            for case in cases:
                layers, hidden = sizes[case]
                log(f"exporting the {case} decoder ({layers} x {hidden}) in {folder}")
                models.append(build_decoder(folder, layers, hidden, case == "external"))
        blocks = []
        for model in models:
            log(f"timing {model}")
            blocks.append(measure_model(model, tools, data, target, repeats, log, memory_limit))
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
    env["load_after"] = load_average()
    print(markdown(blocks, env))
    if json_path:
        write_json(json_path, {"environment": env, "models": blocks})
    return blocks
