"""A folder written by ``onnxnorm genai`` names its library by a bare file name
(``custom_ops_library: libonnxnorm_ops.so``), which onnxruntime-genai looks up in the model's
folder before the working directory: the folder can be copied anywhere and run from anywhere.
Here it is moved, and generation runs from another directory holding a file of the same name
that is no library: the library mapped into the process is the folder's own, and the tokens are
the original's."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("transformers")
pytest.importorskip("onnxruntime_genai")

from models import pipelines
from onnxnorm.genai import convert, generate

pytestmark = pytest.mark.slow

_RUN = """
import json, sys
from onnxnorm.genai import generate
tokens = generate(sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]))
with open("/proc/self/maps") as f:
    mapped = sorted({line.split()[-1] for line in f if "libonnxnorm_ops" in line})
print(json.dumps({"tokens": tokens, "mapped": mapped}))
"""


def test_moved_folder_runs_its_own_library_from_another_directory(tmp_path):
    source = pipelines.genai_folder("llama", "fp32", tmp_path / "build")
    converted = tmp_path / "converted"
    report = convert(source, converted)
    assert report.library == "libonnxnorm_ops.so"
    config = json.loads((converted / "genai_config.json").read_text())
    assert (
        config["model"]["decoder"]["session_options"]["custom_ops_library"] == "libonnxnorm_ops.so"
    )
    deployed = tmp_path / "deploy" / "models" / "llama-onnxnorm"
    deployed.parent.mkdir(parents=True)
    shutil.move(converted, deployed)
    assert not converted.exists()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "libonnxnorm_ops.so").write_bytes(b"not a library")
    result = subprocess.run(
        [sys.executable, "-c", _RUN, str(deployed), json.dumps(pipelines.PROMPT), "16"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ran = json.loads(result.stdout.strip().splitlines()[-1])
    assert ran["mapped"] == [str((deployed / "libonnxnorm_ops.so").resolve())]
    want = generate(source, pipelines.PROMPT, 16)
    assert len(want) == 16 and ran["tokens"] == want
