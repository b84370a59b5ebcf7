"""The build tools and build folders the tests that compile native code use."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def tool(name: str) -> str | None:
    """A build tool from this environment's bin folder (where pip installs cmake and ninja), else
    PATH."""
    return shutil.which(
        name, path=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    )


def package_build_with_tests(root: Path) -> Path | None:
    """The build folder of this tree's editable install when it builds the kernel tests too
    (``make install`` asks for them): the tests then link the kernel objects the installed
    library was built from, and nothing is compiled twice."""
    for cache in sorted((root / "build").glob("*/CMakeCache.txt")):
        text = cache.read_text(errors="replace")
        if (
            f"CMAKE_HOME_DIRECTORY:INTERNAL={root}\n" in text
            and "ONNXNORM_BUILD_TESTS:BOOL=ON\n" in text
            and "SKBUILD" in text
        ):
            return cache.parent
    return None
