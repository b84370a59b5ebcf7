#!/usr/bin/env python3
"""Carries wheels to a GPU machine that reaches no package registry, in parts small enough for
each copy of the working tree sent there (tools/gpu_check.sh, docs/cuda.md).

Here, where pip reaches a registry:

    python tools/gpu_carry.py prepare                   # onnxruntime-gpu and onnxruntime-genai-cuda
    python tools/gpu_carry.py prepare --wheel PATH ...  # or wheels already at hand

downloads the wheels (default: onnxruntime-gpu 1.31.1 and onnxruntime-genai-cuda 0.18.0, for CUDA
13, CPython 3.12, manylinux x86-64: what that machine's torch pairs with), puts them in one
uncompressed tar (wheels are compressed already), cuts it into parts of at most --part-mib MiB
under build/carry/ (ignored by git, so each part travels only in the copy that names it) and
writes build/carry/manifest.json: the wheels' names, the tar's size and SHA-256, and each part's.
It prints the parts in the order the copies should carry them.

There, once every part has arrived (a machine keeps what earlier copies left in ignored
folders):

    python tools/gpu_carry.py install --target DIR

checks each part, joins them, checks the whole and installs the wheels with pip into DIR (no
index, no dependencies: numpy, protobuf and the CUDA libraries come from that machine's torch
environment). It exits 3 while parts are missing (naming them) and 1 when one is corrupt. Only
the standard library and pip: it runs before anything of onnxnorm is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEST = ROOT / "build" / "carry"
#: what the GPU machine pairs with (docs/cuda.md): Python 3.12, torch with CUDA 13 libraries
PACKAGES = ("onnxruntime-gpu==1.31.1", "onnxruntime-genai-cuda==0.18.0")
BUNDLE = "gpu-wheels.tar"
PYTHON_VERSION = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64")
#: a call sends at most 64 MiB: the working tree (a few MiB) and one part
PART_MIB = 56
MANIFEST = "manifest.json"
MISSING = 3


class CarryError(Exception):
    pass


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download(packages: list[str], folder: Path) -> list[Path]:
    """The wheels of ``packages`` for the GPU machine, downloaded into ``folder`` by pip."""
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
        "--python-version", PYTHON_VERSION, "--implementation", "cp", *platforms,
        "--dest", str(folder), *packages,
    ]  # fmt: skip
    subprocess.run(command, check=True)
    wheels = sorted(folder.glob("*.whl"))
    if len(wheels) != len(packages):
        raise CarryError(f"pip download left {len(wheels)} wheels for {len(packages)} packages")
    return wheels


def split(wheels: list[Path], dest: Path, part_mib: int = PART_MIB) -> dict:
    """Puts ``wheels`` into one tar and cuts it into parts of at most ``part_mib`` MiB in
    ``dest`` (removing the parts and manifest of an earlier run); writes the manifest and
    returns it."""
    if part_mib < 1:
        raise CarryError("--part-mib must be at least 1")
    names = [w.name for w in wheels]
    if len(set(names)) != len(names) or not all(n.endswith(".whl") for n in names):
        raise CarryError(f"not a list of distinct wheels: {', '.join(names)}")
    dest.mkdir(parents=True, exist_ok=True)
    for old in [*dest.glob("*.part*"), dest / MANIFEST]:
        old.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        bundle = Path(folder) / BUNDLE
        with tarfile.open(bundle, "w") as tar:
            for wheel in wheels:
                tar.add(wheel, arcname=wheel.name)
        size = part_mib << 20
        parts = []
        with open(bundle, "rb") as f:
            for index in range(1, 1 << 16):
                chunk = f.read(size)
                if not chunk:
                    break
                part = dest / f"{BUNDLE}.part{index:02d}"
                part.write_bytes(chunk)
                digest = hashlib.sha256(chunk).hexdigest()
                parts.append({"name": part.name, "size": len(chunk), "sha256": digest})
        manifest = {
            "wheels": names,
            "size": bundle.stat().st_size,
            "sha256": _sha256(bundle),
            "parts": parts,
        }
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def join(dest: Path, out_folder: Path) -> list[Path]:
    """The wheels put together from the parts in ``dest`` into ``out_folder``, every part and
    the whole checked against the manifest. CarryError (with exit code MISSING as its second
    argument where parts are missing) otherwise."""
    manifest_path = dest / MANIFEST
    if not manifest_path.is_file():
        raise CarryError(f"no {manifest_path}: run `prepare` first and carry the folder", MISSING)
    manifest = json.loads(manifest_path.read_text())
    missing = [p["name"] for p in manifest["parts"] if not (dest / p["name"]).is_file()]
    if missing:
        raise CarryError(
            f"{len(missing)} of {len(manifest['parts'])} parts not here yet: {', '.join(missing)}",
            MISSING,
        )
    bundle = out_folder / BUNDLE
    with open(bundle, "wb") as out:
        for part in manifest["parts"]:
            data = (dest / part["name"]).read_bytes()
            if len(data) != part["size"] or hashlib.sha256(data).hexdigest() != part["sha256"]:
                raise CarryError(f"{part['name']} is corrupt (size or SHA-256 differs)")
            out.write(data)
    if _sha256(bundle) != manifest["sha256"]:
        raise CarryError("the joined parts' SHA-256 differs from the manifest's")
    with tarfile.open(bundle) as tar:
        if sorted(tar.getnames()) != sorted(manifest["wheels"]):
            raise CarryError(f"the parts hold {tar.getnames()}, not {manifest['wheels']}")
        tar.extractall(out_folder, filter="data")
    bundle.unlink()
    return [out_folder / name for name in manifest["wheels"]]


def install(dest: Path, target: Path) -> list[str]:
    """Joins the parts and installs their wheels into ``target`` with pip, offline; returns
    the wheels' names."""
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        wheels = join(dest, Path(folder))
        command = [
            sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
            "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(target),
            *map(str, wheels),
        ]  # fmt: skip
        subprocess.run(command, check=True)
        return [w.name for w in wheels]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python tools/gpu_carry.py", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--dest", type=Path, default=DEST, help="the parts' folder (build/carry)")
    sub = parser.add_subparsers(dest="command", required=True)
    prepare = sub.add_parser("prepare", help="download (or take --wheel) and cut into parts")
    prepare.add_argument(
        "--package",
        action="append",
        help=f"what pip downloads, repeatable (default: {' '.join(PACKAGES)})",
    )
    prepare.add_argument(
        "--wheel", type=Path, action="append", help="a wheel at hand, repeatable (no download)"
    )
    prepare.add_argument("--part-mib", type=int, default=PART_MIB, help="MiB per part (56)")
    put = sub.add_parser("install", help="check, join and pip-install the carried wheel")
    put.add_argument("--target", type=Path, required=True, help="the folder pip installs into")
    args = parser.parse_args(argv)
    try:
        if args.command == "prepare":
            with tempfile.TemporaryDirectory() as folder:
                if args.wheel and args.package:
                    raise CarryError("give --wheel or --package, not both")
                wheels = args.wheel or download(args.package or list(PACKAGES), Path(folder))
                manifest = split(wheels, args.dest, args.part_mib)
            rel = args.dest.resolve()
            rel = rel.relative_to(ROOT) if rel.is_relative_to(ROOT) else rel
            print(
                f"{', '.join(manifest['wheels'])}: {manifest['size'] / 2**20:.1f} MiB in ", end=""
            )
            print(f"{len(manifest['parts'])} parts; carry one per call, with the manifest:")
            for i, part in enumerate(manifest["parts"]):
                print(f"  call {i + 1}: {rel / MANIFEST} {rel / part['name']}")
        else:
            print(f"installed {', '.join(install(args.dest, args.target))} into {args.target}")
    except CarryError as e:
        print(f"gpu_carry: {e.args[0]}", file=sys.stderr)
        return e.args[1] if len(e.args) > 1 else 1
    except subprocess.CalledProcessError as e:
        print(f"gpu_carry: pip failed ({e.returncode})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
