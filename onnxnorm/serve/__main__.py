"""``python -m onnxnorm.serve``: see :func:`onnxnorm.serve.main`."""

import sys

from onnxnorm.serve import main

sys.exit(main())
