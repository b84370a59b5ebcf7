"""Resolves the test environments and writes their locks: the exact version of every package,
direct and transitive, that `make test` and CI install (requirements/*.in -> *.lock).

    python tools/lock.py            # resolve anew from the registries, write the locks
    python tools/lock.py --check    # write nothing; fail if an input names a package its
                                    # lock does not pin

`make lock` runs it, reinstalls the environments from the new locks and runs the suite; review
the locks' diff (what moved) before committing them. Each lock is one resolution of its inputs
(``pip install --dry-run --ignore-installed --report``: nothing is installed), so the packages
an environment gets are the ones pip would pick for it alone. A local version label (torch's
``+cpu``) is dropped: ``torch==2.13.0`` matches the CPU build this kind of machine carries as
well as the registry's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "requirements"
#: each lock and the inputs it resolves together: .venv and the environments the tests make
#: beside it (dev), and the live Triton tests' .venv-serve (serve)
LOCKS = {"dev.lock": ("dev.in", "extra.in"), "serve.lock": ("serve.in",)}
HEADER = """\
# A test environment, exact: every package, direct and transitive, that `make test` and CI
# install from requirements/{inputs}, as pip resolved them on {date}
# (Python {python}, {machine}). pip reads this file as constraints (-c).
# Written by tools/lock.py: run `make lock` to re-resolve it; do not edit by hand.
"""


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(path: Path) -> list[str]:
    """The normalized package names an input file requires."""
    names = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(normalized(re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line).group(0)))
    return names


def read_lock(path: Path) -> dict[str, str]:
    """Normalized name -> pinned version."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[normalized(name)] = version.strip()
    return pins


def resolve(inputs: tuple[str, ...]) -> dict[str, str]:
    """Normalized name -> version, as pip resolves ``inputs`` together now."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "pip", "--disable-pip-version-check", "install"]
        command += ["--dry-run", "--ignore-installed", "--quiet", "--report", str(report)]
        for name in inputs:
            command += ["-r", str(FOLDER / name)]
        subprocess.run(command, check=True)
        installed = json.loads(report.read_text())["install"]
    return {
        normalized(item["metadata"]["name"]): item["metadata"]["version"].split("+")[0]
        for item in installed
    }


def write(path: Path, inputs: tuple[str, ...], pins: dict[str, str]) -> None:
    text = HEADER.format(
        inputs=" and ".join(inputs),
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        python=platform.python_version(),
        machine=f"{platform.system()} {platform.machine()}",
    )
    text += "".join(f"{name}=={version}\n" for name, version in sorted(pins.items()))
    path.write_text(text)


def check() -> list[str]:
    """What the inputs require that their lock does not pin (or a lock that is missing)."""
    problems = []
    for lock, inputs in LOCKS.items():
        if not (FOLDER / lock).is_file():
            problems.append(f"requirements/{lock} is missing")
            continue
        pins = read_lock(FOLDER / lock)
        problems += [
            f"requirements/{lock} pins no {name} ({source})"
            for source in inputs
            for name in requirement_names(FOLDER / source)
            if name not in pins
        ]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; check the lock")
    args = parser.parse_args(argv)
    if args.check:
        problems = check()
        for problem in problems:
            print(f"{problem}: run `make lock`", file=sys.stderr)
        return 1 if problems else 0
    for lock, inputs in LOCKS.items():
        path = FOLDER / lock
        pins = resolve(inputs)
        old = read_lock(path) if path.is_file() else {}
        write(path, inputs, pins)
        for name in sorted(set(old) | set(pins)):
            if old.get(name) != pins.get(name):
                print(f"{lock}: {name} {old.get(name, '-')} -> {pins.get(name, '-')}")
        print(f"requirements/{lock}: {len(pins)} packages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
