"""``python -m onnxnorm.bench.cuda``: the command's options, without the ``onnxnorm`` CLI
around them (tools/gpu_check.sh runs it)."""

import sys

from onnxnorm.bench.cuda.cli import main

sys.exit(main())
