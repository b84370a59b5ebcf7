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
