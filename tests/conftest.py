import sys
from pathlib import Path

import numpy as np
import pytest

# models/ (reference blocks) is imported from the repository root
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# The files that build wheels, native libraries, virtual environments or exported models go
# first, longest first, so that with one worker per core the many short files fill in beside them
# at the end instead of one long file running alone last (make test passes
# --no-loadscope-reorder, which keeps this order instead of sorting files by their number of
# tests, which put the one-test sanitizer file last).
_LONG_FILES = (
    "test_install.py",
    "test_sanitize.py",
    "test_cuda.py",
    "test_fusion_corpus.py",
    "test_fusion_gated.py",
    "test_pipelines.py",
    "test_bench_e2e.py",
    "test_optimum.py",
    "test_concurrency.py",
    "test_encoders.py",
    "test_large_files.py",
    "test_olive.py",
    "test_external_data.py",
    "test_conformance.py",
    "test_wild_models.py",
    "test_fusion_spellings.py",
)


def pytest_collection_modifyitems(config, items):
    def rank(item):
        name = item.path.name
        return _LONG_FILES.index(name) if name in _LONG_FILES else len(_LONG_FILES)

    items.sort(key=rank)  # stable: the order within a file is kept
