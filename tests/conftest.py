import sys
from pathlib import Path

import numpy as np
import pytest

# models/ (reference blocks) is imported from the repository root
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
TESTS = ROOT / "tests"


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# The files that build wheels, native libraries, virtual environments or exported models go
# first, longest first, so that with one worker per core the many short files fill in beside them
# at the end instead of one long file running alone last (make test passes
# --no-loadscope-reorder, which keeps this order instead of sorting files by their number of
# tests, which put the one-test sanitizer file last). Each is named by its path under tests/.
_LONG_FILES = (
    "packaging/test_install.py",
    "kernels/test_sanitize.py",
    "cuda/test_cuda.py",
    "fusion/test_corpus.py",
    "fusion/test_gated.py",
    "fusion/test_pipelines.py",
    "bench/test_e2e.py",
    "fusion/test_optimum.py",
    "runtime/test_concurrency.py",
    "nn/test_encoders.py",
    "storage/test_large_files.py",
    "olive/test_olive.py",
    "storage/test_external_data.py",
    "fusion/test_conformance.py",
    "fusion/test_wild_models.py",
    "fusion/test_spellings.py",
)


def pytest_collection_modifyitems(config, items):
    def rank(item):
        path = item.path.resolve()
        name = path.relative_to(TESTS).as_posix() if path.is_relative_to(TESTS) else ""
        return _LONG_FILES.index(name) if name in _LONG_FILES else len(_LONG_FILES)

    items.sort(key=rank)  # stable: the order within a file is kept
