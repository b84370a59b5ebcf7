"""The scripts of tools/, which is no package, loaded as modules by the tests that run their
parts (tools/fusion_page.py's comparison and timing, ...)."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def load_tool(name: str) -> ModuleType:
    """tools/<name>.py as a module (loaded once per process)."""
    spec = importlib.util.spec_from_file_location(f"_tools_{name}", ROOT / "tools" / f"{name}.py")
    assert spec is not None and spec.loader is not None, name
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
