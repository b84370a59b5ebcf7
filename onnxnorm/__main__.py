import sys

from onnxnorm.cli import main

sys.exit(main())
